"""What a notification says is open on a task: its pending approvals and needs_review decisions
that a person can still decide (`approvals.selectors`: none for an evaluation task). Registered
with the ledger's outbox (`tasks.notify.outbox`) when the app is ready."""

from approvals.selectors import decidable_approvals, decidable_reviews
from tasks.models import Task
from tasks.notify.outbox import OpenDecision, argument_summary, clip, redact


def pending_approvals(task: Task) -> list[OpenDecision]:
    return [
        {
            "id": a.pk,
            "tool": a.tool,
            "target": clip(redact(a.target), 200),
            "arguments": argument_summary(a.arguments),
            "arguments_hash": a.arguments_hash,
            "effect": clip(redact(a.effect), 300),
            "anchor": f"approval-{a.pk}",
        }
        for a in decidable_approvals().filter(task=task).order_by("id")
    ]


def pending_reviews(task: Task) -> list[OpenDecision]:
    decisions = decidable_reviews().filter(task=task).order_by("id")
    return [
        {
            "id": d.pk,
            "tool": d.tool_call.tool,
            "arguments": argument_summary(d.tool_call.arguments),
            "arguments_hash": d.tool_call.arguments_hash,
            "anchor": f"review-{d.pk}",
        }
        for d in decisions
    ]
