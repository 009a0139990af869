"""What every console page needs: the number of operations waiting for a person's decision."""

from django.utils.functional import SimpleLazyObject

from approvals.models import Approval, ReviewDecision
from approvals.states import ApprovalStatus, ReviewChoice


def pending_decisions_count() -> int:
    """Pending approvals plus pending needs_review decisions, in one query.

    Both counts read a small set: pending approvals through their partial index.
    """
    approvals = Approval.objects.filter(
        status=ApprovalStatus.PENDING, task__is_evaluation=False
    ).values("id")
    reviews = ReviewDecision.objects.filter(
        choice=ReviewChoice.PENDING, task__is_evaluation=False
    ).values("id")
    return approvals.union(reviews, all=True).count()


def console(request) -> dict:
    """Lazy: pages that never show the badge (the admin's) make no query for it."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"pending_decisions": SimpleLazyObject(pending_decisions_count)}
