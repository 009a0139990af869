"""The schedules pages: the list (next runs, last result, pause, resume, run now, a new
schedule) and one schedule's page (its slots and what the tasks it made cost). Every action
calls `schedules.services`."""

import logging
from collections.abc import Callable

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_GET, require_POST

from console.http import AuthenticatedHttpRequest
from console.schedule_forms import ScheduleCreateForm
from console.shared import console_view
from core.actors import Actor
from core.exceptions import ActhelmError, InvalidInput, NotPermitted
from schedules import services, slots
from schedules.models import Schedule
from schedules.permissions import ADD_SCHEDULE, CHANGE_SCHEDULE, DELETE_SCHEDULE, VIEW_SCHEDULE
from schedules.selectors import last_slot, next_slots, schedule_cost, slots_page

log = logging.getLogger("acthelm.console")


def _rows() -> list[dict[str, object]]:
    return [
        {
            "schedule": s,
            "cron_text": slots.describe(s.cron),
            "next_runs": next_slots(s, 3),
            "last": last_slot(s),
        }
        for s in Schedule.objects.order_by("name")
    ]


def _list_page(
    request: AuthenticatedHttpRequest, form: ScheduleCreateForm, status: int = 200
) -> HttpResponse:
    context = {"rows": _rows(), "form": form}
    return render(request, "console/schedules.html", context, status=status)


@require_GET
@console_view(VIEW_SCHEDULE)
def schedule_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    return _list_page(request, ScheduleCreateForm())


@require_POST
@console_view(ADD_SCHEDULE)
def schedule_create(request: AuthenticatedHttpRequest) -> HttpResponse:
    form = ScheduleCreateForm(request.POST)
    if form.is_valid():
        try:
            fields = form.service_kwargs()
            ends = form.ends_at_naive()
            if ends is not None:
                fields["ends_at"] = ends.replace(tzinfo=slots.zone(fields["timezone"]))
            schedule = services.schedule_create(actor=Actor.person(request.user), **fields)
        except ValueError as exc:  # a refused value (InvalidInput) or an unreadable end
            if isinstance(exc, InvalidInput):
                field = exc.field if exc.field in form.fields else None
                form.add_error(field, f"{exc.message} [{exc.code}]")
        else:
            messages.success(request, f"Schedule {schedule.name} added.")
            return redirect("schedules:detail", pk=schedule.pk)
    return _list_page(request, form, status=400)


@require_GET
@console_view(VIEW_SCHEDULE)
def schedule_detail(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    schedule = get_object_or_404(Schedule.objects.select_related("connection", "model"), pk=pk)
    context = {
        "schedule": schedule,
        "cron_text": slots.describe(schedule.cron),
        "next_runs": next_slots(schedule, 5),
        "slots": slots_page(schedule),
        "cost": schedule_cost(schedule),
    }
    return render(request, "console/schedule.html", context)


#: The actions a schedule's buttons post: (service, permission, message).
ACTIONS: dict[str, tuple[Callable[..., object], str, str]] = {
    "pause": (services.schedule_pause, CHANGE_SCHEDULE, "paused"),
    "resume": (services.schedule_resume, CHANGE_SCHEDULE, "resumed"),
    "run_now": (services.schedule_run_now, CHANGE_SCHEDULE, "run now"),
    "remove": (services.schedule_delete, DELETE_SCHEDULE, "removed"),
}


@require_POST
@console_view(VIEW_SCHEDULE)
def schedule_action(request: AuthenticatedHttpRequest, pk: int, action: str) -> HttpResponse:
    service, perm, done = ACTIONS[action]
    if not request.user.has_perm(perm):
        raise PermissionDenied
    name = get_object_or_404(Schedule, pk=pk).name
    try:
        result = service(actor=Actor.person(request.user), schedule_id=pk)
    except NotPermitted:
        raise PermissionDenied from None
    except ActhelmError as exc:
        log.info("console.schedule_refused", extra={"schedule_id": pk, "code": exc.code})
        messages.error(request, f"{name}: {exc.message} [{exc.code}]")
    else:
        log.info(
            "console.schedule_action",
            extra={"schedule_id": pk, "action": action, "actor": request.user.get_username()},
        )
        text = f"Schedule {name} {done}."
        task_id = getattr(result, "task_id", None)
        if action == "run_now":
            text = f"Schedule {name}: " + (
                f"task #{task_id} created." if task_id else "goal created."
            )
        messages.success(request, text)
        if action == "remove":
            return redirect("schedules:list")
    target = request.POST.get("next")
    if target == "list":
        return redirect("schedules:list")
    return redirect("schedules:detail", pk=pk)
