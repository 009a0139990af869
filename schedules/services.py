"""The one writer of schedules and their slots: create, change, pause, resume, run now, remove,
and the tick that decides each due slot.

A slot is decided in one transaction that holds its schedule's row lock: the slot's row (the task
or goal it created, or why it was skipped) and the task itself (through the engine's one entry,
`agents.engine.run.intake.task_create`, or a goal through `agents.actions.goal.goal_create`) commit
together with the schedule's next slot, or not at all. Racing tickers lock with SKIP LOCKED, so
each schedule is decided by one of them at a time, and the unique (schedule, slot time) of a
scheduled slot's row backs that in PostgreSQL. Slots move forward from the last one decided,
never from the clock: a clock that jumps back finds nothing due. Nothing here closes a task: what
a schedule creates runs to review like any task."""

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.utils import timezone

from agents.actions.goal import goal_create
from agents.actions.task import connection_named, model_named
from agents.engine.run.intake import _validate_tools, task_create
from agents.engine.verdict.acceptance import validate_checks
from agents.models import Connection, Model
from core.actors import Actor
from core.exceptions import ActhelmError, ErrorCode, InvalidInput, NotFound
from schedules import slots
from schedules.models import Schedule, ScheduleSlot
from schedules.permissions import ADD_SCHEDULE, CHANGE_SCHEDULE, DELETE_SCHEDULE
from schedules.states import (
    CatchUpPolicy,
    OverlapPolicy,
    ScheduleTarget,
    SkipReason,
    SlotKind,
    SlotOutcome,
)
from tasks.models import Goal, Task
from tasks.services import validate_limits
from tasks.states import OPEN

log = logging.getLogger("acthelm.schedules")

#: Schedules one tick decides at most (each in its own transaction).
TICK_BATCH = 100


class ScheduleNotFound(NotFound):
    error = ErrorCode.SCHEDULE_NOT_FOUND


# --- Saving a schedule -------------------------------------------------------------------------


# A field's check: its value and the other fields given, to the value stored.
type Cleaner = Callable[[Any, Mapping[str, Any]], Any]


def _choice(choices: type[OverlapPolicy | CatchUpPolicy | ScheduleTarget], field: str) -> Cleaner:
    def clean(value: Any, _fields: Mapping[str, Any]) -> str:
        if value not in choices.values:
            raise InvalidInput(
                f"{field} must be one of {', '.join(choices.values)}, not {value!r}", field=field
            )
        return str(value)

    return clean


def _text(field: str, what: str, longest: int | None = None, *, collapse: bool = False) -> Cleaner:
    def clean(value: Any, _fields: Mapping[str, Any]) -> str:
        text = str(value or "").strip()
        if collapse:
            text = " ".join(text.split())
        if not text:
            raise InvalidInput(f"a schedule needs {what}", field=field)
        if longest is not None and len(text) > longest:
            raise InvalidInput(f"a schedule's {field} is at most {longest} characters", field=field)
        return text

    return clean


def _tools(value: Any, fields: Mapping[str, Any]) -> list[str] | None:
    tools = None if value is None else list(value)
    _validate_tools(
        tools if tools is not None else list(settings.ACTHELM_DEFAULT_TOOLS),
        dict(fields.get("tool_policies") or {}),
    )
    return tools


def _limits(value: Any, _fields: Mapping[str, Any]) -> dict[str, Any]:
    clean = validate_limits(dict(value or {}))
    # Stored as JSON: an amount of money as its text.
    return {k: v if v is None or isinstance(v, int) else str(v) for k, v in clean.items()}


def _words(value: Any, _fields: Mapping[str, Any]) -> list[str]:
    words = sorted({str(w).strip() for w in value or [] if str(w).strip()})
    if any(len(w) > 50 for w in words):
        raise InvalidInput("a tag is at most 50 characters", field="tags")
    return words


def _domains(value: Any, _fields: Mapping[str, Any]) -> list[str]:
    return sorted({str(d).strip().lower().rstrip(".") for d in value or [] if str(d).strip()})


def _priority(value: Any, _fields: Mapping[str, Any]) -> int:
    try:
        return int(value or 0)
    except (TypeError, ValueError):
        raise InvalidInput("priority must be a whole number", field="priority") from None


def _ends_at(value: Any, _fields: Mapping[str, Any]) -> datetime | None:
    if value is not None and (not isinstance(value, datetime) or timezone.is_naive(value)):
        raise InvalidInput("the end date needs a date, a time and a time zone", field="ends_at")
    return value


#: Each field a door may set, checked as it is stored: a bad cron expression or time zone, an
#: unknown tool, limit or check is refused here, at save, from every door.
_CLEANERS: dict[str, Cleaner] = {
    "name": _text("name", "a name", 100, collapse=True),
    "cron": lambda value, _f: slots.expression(str(value or "")),
    "timezone": lambda value, _f: slots.zone(str(value or "")).key,
    "title": _text("title", "a title for what it creates", 160),
    "instruction": _text("instruction", "an instruction"),
    "target": _choice(ScheduleTarget, "target"),
    "overlap": _choice(OverlapPolicy, "overlap"),
    "catch_up": _choice(CatchUpPolicy, "catch_up"),
    "tools": _tools,
    "limits": _limits,
    "acceptance_checks": lambda value, f: validate_checks(value, tools=f.get("tools")),
    "allowed_domains": _domains,
    "tags": _words,
    "priority": _priority,
    "ends_at": _ends_at,
}


def clean_fields(fields: Mapping[str, Any]) -> dict[str, Any]:
    """``fields`` checked as they are stored (a door's form calls this to show errors early)."""
    out = dict(fields)
    # A door names the goal by id, the connection and the model by name or id.
    goal = out.get("goal")
    if isinstance(goal, int):
        out["goal"] = Goal.objects.filter(pk=goal).first()
        if out["goal"] is None:
            raise InvalidInput(f"goal {goal} does not exist", field="goal")
    if "connection" in out:
        out["connection"] = connection_named(out["connection"])
    if "model" in out:
        out["model"] = model_named(out["model"], out.get("connection"))
    if "tool_policies" in out and "tools" not in out:
        out["tools"] = None
    for field, cleaner in _CLEANERS.items():
        if field in out:
            out[field] = cleaner(out[field], out)
    model, connection = out.get("model"), out.get("connection")
    if (
        isinstance(model, Model)
        and isinstance(connection, Connection)
        and model.connection_id != connection.pk
    ):
        raise InvalidInput(
            f"model {model} does not belong to connection {connection}", field="model"
        )
    return out


def _first_slot(schedule: Schedule, after: datetime) -> datetime | None:
    slot = slots.next_after(schedule.cron, slots.zone(schedule.timezone), after)
    if slot is not None and schedule.ends_at is not None and slot > schedule.ends_at:
        return None
    return slot


def schedule_create(*, actor: Actor, now: datetime | None = None, **fields: Any) -> Schedule:
    """A new schedule; its first slot is the first one after now (none before its creation)."""
    actor.require(ADD_SCHEDULE)
    for required in ("name", "cron", "title", "instruction"):
        fields.setdefault(required, "")
    fields.setdefault("timezone", "UTC")
    clean = clean_fields(fields)
    if clean.get("model") is not None and clean.get("connection") is None:
        clean["connection"] = clean["model"].connection
    with transaction.atomic():
        if Schedule.objects.filter(name=clean["name"]).exists():
            raise InvalidInput(f"a schedule named {clean['name']!r} exists", field="name")
        schedule = Schedule(**clean, created_by=actor.user if actor.is_person else None)
        schedule.next_slot_at = _first_slot(schedule, now or timezone.now())
        schedule.save()
    log.info(
        "schedule.created",
        extra={"schedule_id": schedule.pk, "cron": schedule.cron, "actor": actor.label},
    )
    return schedule


def _lock(schedule_id: int) -> Schedule:
    schedule = Schedule.objects.select_for_update().filter(pk=schedule_id).first()
    if schedule is None:
        raise ScheduleNotFound(f"schedule {schedule_id} does not exist")
    return schedule


#: What a change re-plans: the slots from now on follow the new rule.
_REPLAN = frozenset({"cron", "timezone", "ends_at"})


def schedule_update(
    *, actor: Actor, schedule_id: int, changes: Mapping[str, Any], now: datetime | None = None
) -> Schedule:
    """Change a schedule's template or rule. A new cron expression, time zone or end date
    re-plans from now: the next slot is the first after now under the new rule."""
    actor.require(CHANGE_SCHEDULE)
    editable = {f.name for f in Schedule._meta.get_fields() if getattr(f, "editable", False)}
    # Pausing and resuming are their own actions (a resume records the slots it passed).
    unknown = set(changes) - (editable - {"paused"})
    if unknown:
        raise InvalidInput(f"cannot change {', '.join(sorted(unknown))}", field=sorted(unknown)[0])
    clean = clean_fields(changes)
    with transaction.atomic():
        schedule = _lock(schedule_id)
        if (
            "name" in clean
            and Schedule.objects.filter(name=clean["name"]).exclude(pk=schedule.pk).exists()
        ):
            raise InvalidInput(f"a schedule named {clean['name']!r} exists", field="name")
        replan = any(
            field in clean and clean[field] != getattr(schedule, field) for field in _REPLAN
        )
        for field, value in clean.items():
            setattr(schedule, field, value)
        if replan:
            after = max(
                now or timezone.now(), schedule.last_slot_at or datetime.min.replace(tzinfo=UTC)
            )
            schedule.next_slot_at = _first_slot(schedule, after)
        schedule.save()
    log.info("schedule.changed", extra={"schedule_id": schedule.pk, "actor": actor.label})
    return schedule


def schedule_pause(*, actor: Actor, schedule_id: int) -> Schedule:
    """No slot is decided while paused; the slots it passes are recorded at resume."""
    actor.require(CHANGE_SCHEDULE)
    with transaction.atomic():
        schedule = _lock(schedule_id)
        if not schedule.paused:
            schedule.paused = True
            schedule.save(update_fields=["paused"])
    log.info("schedule.paused", extra={"schedule_id": schedule_id, "actor": actor.label})
    return schedule


def schedule_resume(*, actor: Actor, schedule_id: int, now: datetime | None = None) -> Schedule:
    """The schedule runs again from the first slot after now: the slots that fell while it was
    paused are recorded as skipped (one row, with their number), none is run."""
    actor.require(CHANGE_SCHEDULE)
    now = now or timezone.now()
    with transaction.atomic():
        schedule = _lock(schedule_id)
        if not schedule.paused:
            return schedule
        if schedule.next_slot_at is not None:
            passed = slots.due(
                schedule.cron,
                slots.zone(schedule.timezone),
                first=schedule.next_slot_at,
                now=now,
                ends_at=schedule.ends_at,
            )
            if passed is not None:
                _record_skip(
                    schedule,
                    passed.first,
                    SkipReason.PAUSED,
                    count=passed.earlier + 1,
                    last=passed.latest,
                )
                schedule.last_slot_at = passed.latest
                schedule.next_slot_at = passed.following
        schedule.paused = False
        schedule.save(update_fields=["paused", "next_slot_at", "last_slot_at"])
    log.info("schedule.resumed", extra={"schedule_id": schedule_id, "actor": actor.label})
    return schedule


def schedule_run_now(
    *, actor: Actor, schedule_id: int, now: datetime | None = None
) -> ScheduleSlot:
    """Create the schedule's task (or goal) now, as a person asked: paused or not, whatever its
    overlap policy; the schedule's own slots are unchanged. A template that cannot be created
    any more (a model that was removed) is refused with its error, and nothing is recorded."""
    actor.require(CHANGE_SCHEDULE)
    with transaction.atomic():
        schedule = _lock(schedule_id)
        made = _create(schedule, now or timezone.now())
        slot = ScheduleSlot.objects.create(
            schedule=schedule,
            slot_at=now or timezone.now(),
            kind=SlotKind.RUN_NOW,
            outcome=SlotOutcome.CREATED,
            requested_by=actor.user if actor.is_person else None,
            **made,
        )
    log.info(
        "schedule.run_now",
        extra={"schedule_id": schedule_id, "slot_id": slot.pk, "actor": actor.label},
    )
    return slot


def schedule_delete(*, actor: Actor, schedule_id: int) -> int:
    """Remove a schedule and its slot records; the tasks and goals it created stay."""
    actor.require(DELETE_SCHEDULE)
    with transaction.atomic():
        schedule = _lock(schedule_id)
        schedule.delete()
    log.info("schedule.removed", extra={"schedule_id": schedule_id, "actor": actor.label})
    return schedule_id


# --- The tick -----------------------------------------------------------------------------------


@dataclass
class TickReport:
    """What one tick decided: schedules looked at, tasks (or goals) created, slots skipped or
    failed."""

    schedules: int = 0
    created: int = 0
    skipped: int = 0
    failed: int = 0

    def as_dict(self) -> dict[str, int]:
        return {
            "schedules": self.schedules,
            "created": self.created,
            "skipped": self.skipped,
            "failed": self.failed,
        }


def schedules_tick(*, now: datetime | None = None, batch: int = TICK_BATCH) -> TickReport:
    """One pass: every active schedule whose next slot is due is decided, each in its own
    transaction under its row lock (SKIP LOCKED: a schedule another ticker holds is its).

    A schedule whose decision raises is rolled back whole (no task, no slot row, its next slot
    unchanged: the next pass decides it again), logged, and left out of the rest of this pass,
    so one bad schedule does not hold up the others. A lost database connection ends the pass."""
    report = TickReport()
    passed_over: set[int] = set()
    for _ in range(batch):
        at = now or timezone.now()
        schedule_id = None
        try:
            with transaction.atomic():
                schedule = (
                    Schedule.objects.select_for_update(skip_locked=True)
                    .filter(paused=False, next_slot_at__lte=at)
                    .exclude(pk__in=passed_over)
                    .order_by("next_slot_at", "id")
                    .first()
                )
                if schedule is None:
                    break
                schedule_id = schedule.pk
                _decide_due(schedule, at, report)
        except (OperationalError, InterfaceError):
            raise
        except Exception:  # one schedule's error is logged; the others are decided
            log.exception("schedule.tick_error", extra={"schedule_id": schedule_id})
            if schedule_id is None:
                raise
            passed_over.add(schedule_id)
            continue
        report.schedules += 1
    if report.created or report.skipped or report.failed:
        log.info("schedule.tick", extra={f"slots_{k}": v for k, v in report.as_dict().items()})
    return report


def _decide_due(schedule: Schedule, now: datetime, report: TickReport) -> None:
    assert schedule.next_slot_at is not None
    tz = slots.zone(schedule.timezone)
    due = slots.due(
        schedule.cron, tz, first=schedule.next_slot_at, now=now, ends_at=schedule.ends_at
    )
    if due is None:  # past its end
        schedule.next_slot_at = None
        schedule.save(update_fields=["next_slot_at"])
        return
    grace = float(settings.ACTHELM_SCHEDULE_CATCH_UP_GRACE_SECONDS)
    run_latest = (
        schedule.catch_up == CatchUpPolicy.LATEST or (now - due.latest).total_seconds() <= grace
    )
    missed = due.earlier + (0 if run_latest else 1)
    if missed:
        last = due.latest if not run_latest else None
        _record_skip(schedule, due.first, SkipReason.MISSED, count=missed, last=last)
        report.skipped += 1
    if run_latest:
        outcome = _fire(schedule, due.latest)
        if outcome == SlotOutcome.CREATED:
            report.created += 1
        elif outcome == SlotOutcome.SKIPPED:
            report.skipped += 1
        else:
            report.failed += 1
    schedule.last_slot_at = due.latest
    schedule.next_slot_at = due.following
    schedule.save(update_fields=["last_slot_at", "next_slot_at"])


def _record_skip(
    schedule: Schedule,
    slot_at: datetime,
    reason: SkipReason,
    *,
    count: int = 1,
    last: datetime | None = None,
    detail: str = "",
) -> ScheduleSlot:
    if not detail and count > 1:
        tz = slots.zone(schedule.timezone)
        until = f" to {last.astimezone(tz):%Y-%m-%d %H:%M %Z}" if last is not None else ""
        detail = f"{count} slots from {slot_at.astimezone(tz):%Y-%m-%d %H:%M %Z}{until}"
    log.info(
        "schedule.slot_skipped",
        extra={"schedule_id": schedule.pk, "reason": str(reason), "count": count},
    )
    return ScheduleSlot.objects.create(
        schedule=schedule,
        slot_at=slot_at,
        outcome=SlotOutcome.SKIPPED,
        reason=reason,
        count=count,
        detail=detail,
    )


def _open_previous(schedule: Schedule) -> Task | Goal | None:
    """What this schedule made last, while a person has not closed it (a task not done or
    cancelled, a goal still active)."""
    last = (
        ScheduleSlot.objects.filter(schedule=schedule, outcome=SlotOutcome.CREATED)
        .select_related("task", "goal")
        .order_by("-id")
        .first()
    )
    if last is None:
        return None
    if last.task is not None and last.task.status in OPEN:
        return last.task
    if last.goal is not None and last.goal.active:
        return last.goal
    return None


def _fire(schedule: Schedule, slot_at: datetime) -> str:
    """Decide one scheduled slot: skipped by the overlap policy, created, or failed (the
    template could not be created: its error is recorded, the schedule goes on)."""
    if schedule.overlap == OverlapPolicy.SKIP:
        previous = _open_previous(schedule)
        if previous is not None:
            what = (
                f"task #{previous.pk} is {previous.get_status_display().lower()}"
                if isinstance(previous, Task)
                else f"goal #{previous.pk} is active"
            )
            _record_skip(schedule, slot_at, SkipReason.OVERLAP, detail=what)
            return SlotOutcome.SKIPPED
    try:
        with transaction.atomic():
            made = _create(schedule, slot_at)
    except ActhelmError as exc:
        log.warning(
            "schedule.slot_failed",
            extra={"schedule_id": schedule.pk, "code": exc.code, "error": exc.message},
        )
        ScheduleSlot.objects.create(
            schedule=schedule,
            slot_at=slot_at,
            outcome=SlotOutcome.FAILED,
            reason=exc.code[:64],
            detail=exc.message[:2000],
        )
        return SlotOutcome.FAILED
    slot = ScheduleSlot.objects.create(
        schedule=schedule, slot_at=slot_at, outcome=SlotOutcome.CREATED, **made
    )
    log.info(
        "schedule.slot_created",
        extra={
            "schedule_id": schedule.pk,
            "slot_id": slot.pk,
            "task_id": made.get("task").pk if made.get("task") else None,  # type: ignore[union-attr]
        },
    )
    return SlotOutcome.CREATED


def slot_title(schedule: Schedule, slot_at: datetime) -> str:
    """The created task's title: the template's, with the slot's time in the schedule's zone."""
    local = slot_at.astimezone(slots.zone(schedule.timezone))
    return f"{schedule.title} · {local:%Y-%m-%d %H:%M}"


def _create(schedule: Schedule, slot_at: datetime) -> dict[str, Any]:
    """The slot's task (through the engine's intake) or goal, inside the caller's transaction."""
    actor = Actor.system(f"schedule:{schedule.pk}")
    title = slot_title(schedule, slot_at)
    if schedule.target == ScheduleTarget.GOAL:
        goal = goal_create(
            actor=actor,
            title=title,
            description=schedule.instruction,
            acceptance_checks=schedule.acceptance_checks,
        )
        return {"goal": goal}
    task = task_create(
        actor=actor,
        title=title,
        instruction=schedule.instruction,
        goal=schedule.goal,
        priority=schedule.priority,
        tools=None if schedule.tools is None else list(schedule.tools),
        tool_policies=dict(schedule.tool_policies or {}),
        allowed_domains=list(schedule.allowed_domains or []),
        connection=schedule.connection,
        model=schedule.model,
        tags=list(schedule.tags or []),
        limits=dict(schedule.limits or {}),
        acceptance_checks=list(schedule.acceptance_checks or []),
        check_model=True,
    )
    return {"task": task}


def tick_now() -> None:
    """The worker's maintenance hook: one tick (`agents.engine.runtime.maintenance` logs its
    errors)."""
    schedules_tick()
