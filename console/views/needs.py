"""What needs me: one page of everything that waits for a person (decisions, review, failed),
and the small fragment the nav polls for its counts. Evaluation tasks are never in either."""

from django.conf import settings
from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from approvals.permissions import INBOX_PERMS
from approvals.selectors import decidable_approvals, decidable_reviews, needs_me_counts
from console.http import AuthenticatedHttpRequest
from console.shared import console_view, login_required
from tasks.models import Task
from tasks.states import TaskStatus

SHOWN = 10  # of each kind; the counts say how many there are


@require_GET
@login_required
def nav_counts(request: AuthenticatedHttpRequest) -> HttpResponse:
    """The nav's counts, swapped in out of band (the poll itself swaps nothing)."""
    return render(request, "console/_nav_counts.html", {"needs_me": needs_me_counts()})


@require_GET
@console_view()
def needs_me(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Oldest decision first, then the review queue (oldest first), then failures (newest
    first): a fixed number of queries."""
    counts = needs_me_counts()
    may_decide = any(request.user.has_perm(perm) for perm in INBOX_PERMS)
    tasks = Task.objects.filter(is_evaluation=False).only(
        "id", "title", "status", "failure_code", "failure_message", "updated_at"
    )
    context = {
        "counts": counts,
        "may_decide": may_decide,
        "approvals": list(decidable_approvals()[:SHOWN]) if may_decide else [],
        "reviews": list(decidable_reviews()[:SHOWN]) if may_decide else [],
        "review_tasks": list(tasks.filter(status=TaskStatus.REVIEW).order_by("updated_at")[:SHOWN]),
        "failed_tasks": list(
            tasks.filter(status=TaskStatus.FAILED).order_by("-updated_at")[:SHOWN]
        ),
        "shown": SHOWN,
        "refresh_seconds": settings.ACTHELM_CONSOLE_REFRESH_SECONDS,
    }
    template = "console/needs_me.html#needs" if request.htmx else "console/needs_me.html"
    return render(request, template, context)
