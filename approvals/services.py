"""The one writer of approvals and needs_review decisions: the rows (`request_approvals`,
`open_review_row`, written by the worker's recorder inside its fenced transaction), an approval's
status and a decision's choice. A person's decision as a whole (hash checked, the tool call
released or settled, the task queued again) is `agents.actions.decisions`, which calls these
inside its transaction."""

from collections.abc import Sequence
from typing import Any, TypedDict

from django.utils import timezone

from approvals.models import Approval, ReviewDecision
from approvals.states import ApprovalStatus, ReviewChoice
from core.actors import Actor
from core.exceptions import StaleDecision
from tasks.models import Task


class ApprovalRequest(TypedDict):
    """What a person is asked to approve for one tool call: the fields of its `Approval`."""

    tool: str
    target: str
    arguments: dict[str, Any] | None
    arguments_hash: str
    reason: str
    effect: str


def request_approvals(
    *, task_id: int, run_id: int, requests: Sequence[tuple[int, ApprovalRequest]]
) -> None:
    """One pending approval per tool call awaiting a person (``(tool_call_id, request)``), all in
    one INSERT, in the caller's transaction (the recorder's fenced step): nothing is committed
    here."""
    if requests:
        Approval.objects.bulk_create(
            [
                Approval(task_id=task_id, run_id=run_id, tool_call_id=call_id, **fields)
                for call_id, fields in requests
            ]
        )


def open_review_row(*, task_id: int, tool_call_id: int) -> None:
    """A needs_review decision for a tool call whose outcome is unknown, pending again: a person
    may already have chosen "run again" and that run was lost as well, so the old choice is spent
    and the operation needs a new decision. In the caller's transaction."""
    ReviewDecision.objects.update_or_create(
        tool_call_id=tool_call_id,
        defaults={
            "task_id": task_id,
            "choice": ReviewChoice.PENDING,
            "decided_by": None,
            "decided_at": None,
        },
    )


def decide_approval_row(
    approval: Approval,
    status: str,
    actor: Actor,
    *,
    edited_arguments: dict[str, Any] | None = None,
    edited_arguments_hash: str = "",
    message: str = "",
) -> None:
    """The one writer of an approval's status: pending → approved (as proposed, or with the
    edited arguments a person let run instead) or denied (with the person's message), once."""
    updated = Approval.objects.filter(pk=approval.pk, status=ApprovalStatus.PENDING).update(
        status=status,
        decided_by=actor.user,
        decided_at=timezone.now(),
        edited_arguments=edited_arguments,
        edited_arguments_hash=edited_arguments_hash,
        message=message,
    )
    if updated != 1:
        raise StaleDecision("this operation was decided elsewhere")
    approval.refresh_from_db(
        fields=[
            "status",
            "decided_by",
            "decided_at",
            "edited_arguments",
            "edited_arguments_hash",
            "message",
        ]
    )


def settle_for_cancelled_task(task: Task, reason: str = "") -> dict[str, int]:
    """The task was cancelled: its open approvals and needs_review decisions can no longer be
    decided. Settle them (in the cancel's transaction) so the inbox shows only live ones, each
    approval with the cancel's reason; the operations stay unrun."""
    now = timezone.now()
    approvals = Approval.objects.filter(task=task, status=ApprovalStatus.PENDING).update(
        status=ApprovalStatus.CANCELLED, decided_at=now, message=reason
    )
    reviews = ReviewDecision.objects.filter(task=task, choice=ReviewChoice.PENDING).update(
        choice=ReviewChoice.CANCELLED, decided_at=now
    )
    return {"approvals_settled": approvals, "reviews_settled": reviews}


def decide_review_row(decision: ReviewDecision, choice: str, actor: Actor) -> None:
    """pending → run_again or skip, once; the caller holds the decision's row lock."""
    if decision.choice != ReviewChoice.PENDING:
        raise StaleDecision(f"this operation was already decided: {decision.choice}")
    decision.choice = choice
    decision.decided_by = actor.user
    decision.decided_at = timezone.now()
    decision.save(update_fields=["choice", "decided_by", "decided_at"])
