"""A person's decisions on single operations. Each decision carries the operation's hash; a stale
or altered hash changes nothing. When the task's last open decision is made, it is queued again."""

from django.db import transaction
from django.utils import timezone

from agents.models import ToolCall
from agents.states import ToolCallStatus
from agents.transitions import set_call_status
from approvals.models import Approval, ReviewDecision
from approvals.states import ApprovalStatus, ReviewChoice
from tasks.actors import Actor
from tasks.exceptions import StaleDecision, TransitionNotAllowed
from tasks.states import EventKind, TaskStatus
from tasks.transitions import lock_task, record_event, set_status

DENIED_RESULT = "The operation was denied by a person. It was not run."
SKIPPED_RESULT = (
    "The outcome of this operation is unknown: the worker stopped while it was in flight, "
    "and a person chose not to run it again. It may or may not have taken effect."
)


def _release_call(call: ToolCall) -> None:
    """A person let the operation run: the next worker runs it, after checking the hash again."""
    set_call_status(call, ToolCallStatus.APPROVED)


def _settle_call(call: ToolCall, status: str, result: str, code: str) -> None:
    """A person decided the operation does not run: the model gets `result` as its outcome."""
    set_call_status(
        call,
        status,
        result=result,
        result_for_model=result,
        error_code=code,
        finished_at=timezone.now(),
    )


def _decide(approval: Approval, status: str, actor: Actor) -> None:
    """The one writer of an approval's status: pending → approved or denied, once."""
    updated = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
        status=status, decided_by=actor.user, decided_at=timezone.now()
    )
    if updated != 1:
        raise StaleDecision("this operation was decided elsewhere")
    approval.refresh_from_db(fields=["status", "decided_by", "decided_at"])


def _decide_approval(*, actor: Actor, approval_id: int, arguments_hash: str, approve: bool):
    actor.require("approvals.decide_approval")
    with transaction.atomic():
        task_id = Approval.objects.filter(pk=approval_id).values_list("task_id", flat=True).first()
        if task_id is None:
            raise StaleDecision(f"approval {approval_id} does not exist")
        task = lock_task(task_id)
        approval = Approval.objects.select_for_update().get(pk=approval_id)
        if task.status != TaskStatus.AWAITING_APPROVAL:
            raise StaleDecision(f"task {task.pk} is {task.status}, not awaiting approval")
        if approval.status != ApprovalStatus.PENDING:
            raise StaleDecision(f"this operation was already {approval.status}")
        if not arguments_hash or arguments_hash != approval.arguments_hash:
            raise StaleDecision(
                "the decision does not match the operation's hash: the operation changed"
            )
        call = ToolCall.objects.select_for_update().get(pk=approval.tool_call_id)
        if call.arguments_hash != approval.arguments_hash:
            raise StaleDecision("the operation's arguments no longer match the approval")
        _decide(approval, ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED, actor)
        if approve:
            _release_call(call)
        else:
            _settle_call(call, ToolCallStatus.DENIED, DENIED_RESULT, "denied")
        record_event(
            task,
            actor=actor,
            kind=EventKind.APPROVED if approve else EventKind.DENIED,
            data={
                "approval_id": approval.pk,
                "tool": approval.tool,
                "target": approval.target,
                "arguments_hash": approval.arguments_hash,
            },
        )
        if not Approval.objects.filter(task=task, status=ApprovalStatus.PENDING).exists():
            set_status(
                task,
                TaskStatus.READY,
                actor=actor,
                kind=EventKind.RESUMED,
                data={"after": "approvals decided"},
            )
        return approval


def approval_approve(*, actor: Actor, approval_id: int, arguments_hash: str) -> Approval:
    return _decide_approval(
        actor=actor, approval_id=approval_id, arguments_hash=arguments_hash, approve=True
    )


def approval_deny(*, actor: Actor, approval_id: int, arguments_hash: str) -> Approval:
    return _decide_approval(
        actor=actor, approval_id=approval_id, arguments_hash=arguments_hash, approve=False
    )


def _decide_review(*, actor: Actor, decision_id: int, arguments_hash: str, choice: str):
    actor.require("approvals.decide_approval")
    with transaction.atomic():
        task_id = (
            ReviewDecision.objects.filter(pk=decision_id).values_list("task_id", flat=True).first()
        )
        if task_id is None:
            raise StaleDecision(f"decision {decision_id} does not exist")
        task = lock_task(task_id)
        decision = ReviewDecision.objects.select_for_update().get(pk=decision_id)
        if task.status != TaskStatus.NEEDS_REVIEW:
            raise StaleDecision(f"task {task.pk} is {task.status}, not needs_review")
        if decision.choice != ReviewChoice.PENDING:
            raise StaleDecision(f"this operation was already decided: {decision.choice}")
        call = ToolCall.objects.select_for_update().get(pk=decision.tool_call_id)
        if not arguments_hash or arguments_hash != call.arguments_hash:
            raise StaleDecision("the decision does not match the operation's hash")
        if call.status != ToolCallStatus.UNKNOWN:
            raise TransitionNotAllowed(f"the operation is {call.status}, not of unknown outcome")
        decision.choice = choice
        decision.decided_by = actor.user
        decision.decided_at = timezone.now()
        decision.save(update_fields=["choice", "decided_by", "decided_at"])
        if choice == ReviewChoice.RUN_AGAIN:
            _release_call(call)
        else:
            _settle_call(call, ToolCallStatus.SKIPPED, SKIPPED_RESULT, "outcome_unknown")
        record_event(
            task,
            actor=actor,
            kind=EventKind.RUN_AGAIN if choice == ReviewChoice.RUN_AGAIN else EventKind.SKIPPED,
            data={"tool_call_id": call.pk, "tool": call.tool},
        )
        if not ReviewDecision.objects.filter(task=task, choice=ReviewChoice.PENDING).exists():
            set_status(
                task,
                TaskStatus.READY,
                actor=actor,
                kind=EventKind.RESUMED,
                data={"after": "needs_review decided"},
            )
        return decision


def review_run_again(*, actor: Actor, decision_id: int, arguments_hash: str) -> ReviewDecision:
    return _decide_review(
        actor=actor,
        decision_id=decision_id,
        arguments_hash=arguments_hash,
        choice=ReviewChoice.RUN_AGAIN,
    )


def review_skip(*, actor: Actor, decision_id: int, arguments_hash: str) -> ReviewDecision:
    return _decide_review(
        actor=actor,
        decision_id=decision_id,
        arguments_hash=arguments_hash,
        choice=ReviewChoice.SKIP,
    )


def settle_for_cancelled_task(task) -> dict:
    """The task was cancelled: its open approvals and needs_review decisions can no longer be
    decided. Settle them (in the cancel's transaction) so the inbox shows only live ones; the
    operations stay unrun."""
    now = timezone.now()
    approvals = Approval.objects.filter(task=task, status=ApprovalStatus.PENDING).update(
        status=ApprovalStatus.CANCELLED, decided_at=now
    )
    reviews = ReviewDecision.objects.filter(task=task, choice=ReviewChoice.PENDING).update(
        choice=ReviewChoice.CANCELLED, decided_at=now
    )
    return {"approvals_settled": approvals, "reviews_settled": reviews}
