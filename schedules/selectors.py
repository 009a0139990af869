"""What the doors read of schedules: a schedule as JSON (the CLI and the API), its next slots in
its own time zone, its last result, and its slots with the cost of each task it made."""

from datetime import datetime
from decimal import Decimal
from typing import Any, TypedDict

from django.db.models import QuerySet, Sum
from django.utils import timezone

from agents.models import Turn
from schedules import slots
from schedules.models import Schedule, ScheduleSlot

#: Slots a schedule's page and `acthelm_schedule list` show.
SLOT_PAGE = 50


class SlotDict(TypedDict):
    id: int
    slot_at: str
    kind: str
    outcome: str
    reason: str
    detail: str
    count: int
    task_id: int | None
    task_status: str | None
    goal_id: int | None


def schedules_with_last() -> QuerySet[Schedule]:
    return Schedule.objects.select_related("connection", "model", "goal").order_by("name")


def last_slot(schedule: Schedule) -> ScheduleSlot | None:
    return (
        ScheduleSlot.objects.filter(schedule=schedule)
        .select_related("task")
        .order_by("-recorded_at", "-id")
        .first()
    )


def next_slots(schedule: Schedule, count: int = 3) -> list[datetime]:
    """The next ``count`` slots, in the schedule's time zone (none while paused or ended)."""
    if schedule.paused or schedule.next_slot_at is None:
        return []
    return slots.upcoming(
        schedule.cron,
        slots.zone(schedule.timezone),
        start=schedule.next_slot_at,
        count=count,
        ends_at=schedule.ends_at,
    )


def schedule_cost(schedule: Schedule) -> Decimal:
    """What the tasks this schedule made cost (turns of known cost)."""
    total = Turn.objects.filter(
        task__schedule_slot__schedule=schedule, cost__isnull=False
    ).aggregate(total=Sum("cost"))["total"]
    return total or Decimal(0)


def slots_page(schedule: Schedule, limit: int = SLOT_PAGE) -> list[ScheduleSlot]:
    """The newest slots, each task with its cost (`cost`: None when no turn's cost is known)."""
    rows = list(
        ScheduleSlot.objects.filter(schedule=schedule)
        .select_related("task", "goal", "requested_by")
        .order_by("-slot_at", "-id")[:limit]
    )
    task_ids = [r.task_id for r in rows if r.task_id is not None]
    costs = dict(
        Turn.objects.filter(task_id__in=task_ids, cost__isnull=False)
        .order_by()
        .values_list("task_id")
        .annotate(total=Sum("cost"))
        .values_list("task_id", "total")
    )
    for row in rows:
        row.cost = costs.get(row.task_id) if row.task_id is not None else None  # type: ignore[attr-defined]
    return rows


def slot_as_dict(slot: ScheduleSlot) -> SlotDict:
    return {
        "id": slot.pk,
        "slot_at": slot.slot_at.isoformat(),
        "kind": slot.kind,
        "outcome": slot.outcome,
        "reason": slot.reason,
        "detail": slot.detail,
        "count": slot.count,
        "task_id": slot.task_id,
        "task_status": slot.task.status if slot.task is not None else None,
        "goal_id": slot.goal_id,
    }


def schedule_as_dict(schedule: Schedule, *, with_slots: int = 0) -> dict[str, Any]:
    """A schedule as the CLI and the API show it: its rule, template, policies, where it is
    (next slots in its own zone, ISO 8601 with the offset), its last result and its cost."""
    last = last_slot(schedule)
    data: dict[str, Any] = {
        "id": schedule.pk,
        "name": schedule.name,
        "target": schedule.target,
        "cron": schedule.cron,
        "cron_text": slots.describe(schedule.cron),
        "timezone": schedule.timezone,
        "title": schedule.title,
        "instruction": schedule.instruction,
        "goal_id": schedule.goal_id,
        "connection": schedule.connection.name if schedule.connection else None,
        "model": schedule.model.name if schedule.model else None,
        "tools": schedule.tools,
        "tool_policies": schedule.tool_policies,
        "allowed_domains": schedule.allowed_domains,
        "tags": list(schedule.tags),
        "limits": schedule.limits,
        "acceptance_checks": schedule.acceptance_checks,
        "priority": schedule.priority,
        "overlap": schedule.overlap,
        "catch_up": schedule.catch_up,
        "paused": schedule.paused,
        "ends_at": schedule.ends_at.isoformat() if schedule.ends_at else None,
        "ended": schedule.next_slot_at is None,
        "next_runs": [s.isoformat() for s in next_slots(schedule)],
        "last_slot_at": schedule.last_slot_at.isoformat() if schedule.last_slot_at else None,
        "last_result": slot_as_dict(last) if last is not None else None,
        "cost": str(schedule_cost(schedule)),
        "created_at": schedule.created_at.isoformat(),
    }
    if with_slots:
        data["slots"] = [slot_as_dict(s) for s in slots_page(schedule, with_slots)]
    return data


def now_in(schedule: Schedule) -> datetime:
    return timezone.now().astimezone(slots.zone(schedule.timezone))
