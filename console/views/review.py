"""The review page: every task waiting in review with its answer, the supervisor's verdict and
its artifacts, searched and filtered (text, tag, goal, model, date), closed or reopened in bulk
through the same services as one task's buttons (`agents.actions.task.task_close`, `task_reopen`).

A fixed number of queries, whatever the number of rows: the answer and the verdict come from
subqueries on the newest run that has one, the artifacts from one prefetch."""

import logging
from typing import TYPE_CHECKING, TypedDict, cast

from django.conf import settings
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.db.models import OuterRef, Prefetch, QuerySet, Subquery
from django.db.models.functions import Left
from django.http import HttpResponse, HttpResponseRedirect
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_GET, require_POST

from agents.actions import task as person_task
from agents.models import AgentRun, Artifact
from agents.selectors import accepted_events, shown_verdict
from console.filters import (
    TaskFilters,
    filter_options,
    filter_problems,
    filter_tasks,
    task_filters,
)
from console.http import AuthenticatedHttpRequest
from console.shared import console_view, positive_int, show
from core.actors import Actor
from core.exceptions import ActhelmError, NotPermitted
from tasks.models import Task
from tasks.permissions import CLOSE_TASK
from tasks.states import TaskStatus

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

log = logging.getLogger("acthelm.console")


class _VerdictAnnotations(TypedDict):
    verdict: str | None
    verdict_reason: str | None
    verdict_run_id: int | None


REVIEW_PAGE = 100  # oldest first: a person closes from the top
ANSWER_CHARS = 1200
BULK_MAX = REVIEW_PAGE


def review_rows(filters: TaskFilters) -> QuerySet[Task]:
    """Tasks in review (evaluation tasks are the runner's), oldest first, filtered."""
    runs = AgentRun.objects.filter(task=OuterRef("pk")).order_by("-number")
    tasks = (
        Task.objects.filter(status=TaskStatus.REVIEW, is_evaluation=False)
        .select_related("goal", "model__connection")
        .only(
            "id",
            "title",
            "tags",
            "updated_at",
            "created_at",
            "goal__title",
            "model__name",
            "model__connection__name",
        )
        .annotate(
            answer=Left(Subquery(runs.exclude(answer="").values("answer")[:1]), ANSWER_CHARS),
            verdict=Subquery(runs.exclude(verdict="").values("verdict")[:1]),
            verdict_run_id=Subquery(runs.exclude(verdict="").values("id")[:1]),
            verdict_reason=Left(
                Subquery(runs.exclude(verdict="").values("verdict_reason")[:1]), 300
            ),
        )
        .prefetch_related(
            Prefetch(
                "artifacts",
                queryset=Artifact.objects.only("id", "task_id", "name", "size").order_by("name"),
            )
        )
    )
    tasks = filter_tasks(tasks, filters)
    return tasks.order_by("updated_at", "id")


@require_GET
@console_view()
def review_queue(request: AuthenticatedHttpRequest) -> HttpResponse:
    filters = task_filters(request.GET)
    filters["status"] = ""  # every row is in review
    rows = list(review_rows(filters)[: REVIEW_PAGE + 1])
    accepted = accepted_events(row.pk for row in rows)
    for row in rows:  # the verdict as every door words it: the supervisor's or the person's
        v = cast("WithAnnotations[Task, _VerdictAnnotations]", row)
        run_accepted = accepted.get(v.verdict_run_id or 0)
        show(
            row, verdict_shown=shown_verdict(v.verdict or "", v.verdict_reason or "", run_accepted)
        )
    in_review = Task.objects.filter(status=TaskStatus.REVIEW, is_evaluation=False)
    context = {
        "rows": rows[:REVIEW_PAGE],
        "more": len(rows) > REVIEW_PAGE,
        "filters": filters,
        "filtered": any(filters.values()),
        "filter_problems": filter_problems(request.GET),
        **filter_options(in_review),
        "can_close": request.user.has_perm(CLOSE_TASK),
        "query": request.GET.urlencode(),
        "refresh_seconds": settings.ACTHELM_CONSOLE_REFRESH_SECONDS,
    }
    template = "console/review.html#rows" if request.htmx else "console/review.html"
    return render(request, template, context)


@require_POST
@console_view(CLOSE_TASK)
def review_bulk(request: AuthenticatedHttpRequest) -> HttpResponseRedirect:
    """Close or reopen the ticked tasks, one service call each; say which were refused and why."""
    action = request.POST.get("action", "")
    ids = [n for n in (positive_int(v) for v in request.POST.getlist("task")) if n][:BULK_MAX]
    back = request.POST.get("next", "")
    if not url_has_allowed_host_and_scheme(back, allowed_hosts={request.get_host()}):
        back = ""
    back = back or reverse("tasks:review")
    if action not in ("close", "reopen") or not ids:
        messages.error(request, "Tick at least one task, then Close or Reopen.")
        return redirect(back)
    feedback = request.POST.get("feedback", "").strip()
    actor = Actor.person(request.user)
    done, refused = [], []
    for task_id in ids:
        try:
            if action == "close":
                person_task.task_close(actor=actor, task_id=task_id)
            else:
                person_task.task_reopen(actor=actor, task_id=task_id, feedback=feedback)
        except NotPermitted:
            raise PermissionDenied from None
        except ActhelmError as exc:
            refused.append(f"#{task_id}: {exc.message} [{exc.code}]")
        else:
            done.append(f"#{task_id}")
    log.info(
        "console.review_bulk",
        extra={
            "action": action,
            "done": len(done),
            "refused": len(refused),
            "actor": request.user.get_username(),
        },
    )
    verb = "Closed" if action == "close" else "Reopened"
    if done:
        messages.success(request, f"{verb} {len(done)} task(s): {', '.join(done)}.")
    if refused:
        messages.error(request, "Not changed: " + "; ".join(refused))
    return redirect(back)
