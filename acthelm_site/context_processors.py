"""What every console page needs: the number of operations waiting for a person's decision."""

from django.utils.functional import SimpleLazyObject

from approvals.selectors import decidable_counts


def pending_decisions_count() -> int:
    """What a person can still decide (`approvals.selectors`): approvals and unknown outcomes."""
    return sum(decidable_counts())


def console(request) -> dict:
    """Lazy: pages that never show the badge (the admin's) make no query for it."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    return {"pending_decisions": SimpleLazyObject(pending_decisions_count)}
