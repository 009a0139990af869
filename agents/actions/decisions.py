"""A person's decisions on single operations: approve or deny an operation that waits for
approval, run again or skip one whose outcome is unknown. Each decision carries the operation's
hash; a stale or altered hash changes nothing. A decision touches three apps in one transaction:
the approval row (`approvals.services`), the tool call (`agents.engine.run_transitions`) and the
task, which is queued again when its last open decision is made (`tasks.transitions`)."""

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from agents.engine.run_transitions import set_call_status
from agents.models import ToolCall
from agents.states import ToolCallStatus
from approvals.models import Approval, ReviewDecision
from approvals.permissions import DECIDE_APPROVAL
from approvals.services import decide_approval_row, decide_review_row
from approvals.states import ApprovalStatus, ReviewChoice
from core.actors import Actor
from core.exceptions import StaleDecision, TransitionNotAllowed
from tasks.models import Task
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


def _lock_with_task[D: (Approval, ReviewDecision)](
    model: type[D], pk: int, what: str
) -> tuple[Task, D]:
    """Lock the decision's task, then the decision row (the order every writer keeps)."""
    task_id = model.objects.filter(pk=pk).values_list("task_id", flat=True).first()
    if task_id is None:
        raise StaleDecision(f"{what} {pk} does not exist")
    return lock_task(task_id), model.objects.select_for_update().get(pk=pk)


def _queue_when_settled(
    task: Task,
    actor: Actor,
    still_open: QuerySet[Approval] | QuerySet[ReviewDecision],
    *,
    after: str,
) -> None:
    """The task's last open decision was made: it is queued again."""
    if not still_open.exists():
        set_status(
            task, TaskStatus.READY, actor=actor, kind=EventKind.RESUMED, data={"after": after}
        )


def _decide_approval(
    *, actor: Actor, approval_id: int, arguments_hash: str, approve: bool
) -> Approval:
    actor.require(DECIDE_APPROVAL)
    with transaction.atomic():
        task, approval = _lock_with_task(Approval, approval_id, "approval")
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
        decide_approval_row(
            approval, ApprovalStatus.APPROVED if approve else ApprovalStatus.DENIED, actor
        )
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
        still_open = Approval.objects.filter(task=task, status=ApprovalStatus.PENDING)
        _queue_when_settled(task, actor, still_open, after="approvals decided")
        return approval


def approval_approve(*, actor: Actor, approval_id: int, arguments_hash: str) -> Approval:
    return _decide_approval(
        actor=actor, approval_id=approval_id, arguments_hash=arguments_hash, approve=True
    )


def approval_deny(*, actor: Actor, approval_id: int, arguments_hash: str) -> Approval:
    return _decide_approval(
        actor=actor, approval_id=approval_id, arguments_hash=arguments_hash, approve=False
    )


def _decide_review(
    *, actor: Actor, decision_id: int, arguments_hash: str, choice: str
) -> ReviewDecision:
    actor.require(DECIDE_APPROVAL)
    with transaction.atomic():
        task, decision = _lock_with_task(ReviewDecision, decision_id, "decision")
        if task.status != TaskStatus.NEEDS_REVIEW:
            raise StaleDecision(f"task {task.pk} is {task.status}, not needs_review")
        if decision.choice != ReviewChoice.PENDING:
            raise StaleDecision(f"this operation was already decided: {decision.choice}")
        call = ToolCall.objects.select_for_update().get(pk=decision.tool_call_id)
        if not arguments_hash or arguments_hash != call.arguments_hash:
            raise StaleDecision("the decision does not match the operation's hash")
        if call.status != ToolCallStatus.UNKNOWN:
            raise TransitionNotAllowed(f"the operation is {call.status}, not of unknown outcome")
        decide_review_row(decision, choice, actor)
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
        still_open = ReviewDecision.objects.filter(task=task, choice=ReviewChoice.PENDING)
        _queue_when_settled(task, actor, still_open, after="needs_review decided")
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
