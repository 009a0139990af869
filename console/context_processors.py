"""What every console page needs: what waits for a person (the nav's counts)."""

from django.conf import settings
from django.http import HttpRequest
from django.utils.functional import SimpleLazyObject

from approvals.selectors import decidable_counts, needs_me_counts


def pending_decisions_count() -> int:
    """What a person can still decide (`approvals.selectors`): approvals and unknown outcomes."""
    return sum(decidable_counts())


def console(request: HttpRequest) -> dict[str, object]:
    """Lazy: pages that never show the counts (the admin's) make no query for them."""
    user = getattr(request, "user", None)
    if user is None or not user.is_authenticated:
        return {}
    needs = SimpleLazyObject(needs_me_counts)
    return {
        "needs_me": needs,
        "pending_decisions": SimpleLazyObject(lambda: needs.decisions),
        "refresh_seconds": settings.ACTHELM_CONSOLE_REFRESH_SECONDS,
    }
