"""What a notification says is open on a task: its pending approvals and needs_review decisions.
Registered with the ledger's outbox (`tasks.notify.outbox`) when the app is ready."""

from approvals.models import Approval, ReviewDecision
from approvals.states import ApprovalStatus, ReviewChoice
from tasks.notify.outbox import argument_summary, clip, redact


def pending_approvals(task) -> list[dict]:
    return [
        {
            "id": a.pk,
            "tool": a.tool,
            "target": clip(redact(a.target), 200),
            "arguments": argument_summary(a.arguments),
            "arguments_hash": a.arguments_hash,
            "anchor": f"approval-{a.pk}",
        }
        for a in Approval.objects.filter(task=task, status=ApprovalStatus.PENDING).order_by("id")
    ]


def pending_reviews(task) -> list[dict]:
    decisions = (
        ReviewDecision.objects.filter(task=task, choice=ReviewChoice.PENDING)
        .select_related("tool_call")
        .order_by("id")
    )
    return [
        {
            "id": d.pk,
            "tool": d.tool_call.tool,
            "arguments": argument_summary(d.tool_call.arguments),
            "anchor": f"review-{d.pk}",
        }
        for d in decisions
    ]
