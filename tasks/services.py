"""A person's actions on a task that the ledger owns: pause, withdraw a pause, cancel, close,
reopen, retry now, limits, delete; and goals. The console, the admin, the CLI and the API call
these (the worker calls `note_stuck_dependants`); the status itself is written by
`tasks.transitions`. A task is created by `agents.engine.run.intake`; the actions that check a model
or the tools (resume, retry, edit) are `agents.actions.tasks`."""

import logging
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from typing import Any

from django.conf import settings
from django.db import transaction
from django.db.models import Q

from core.actors import Actor
from core.exceptions import (
    GoalNotFound,
    InvalidInput,
    TransitionNotAllowed,
)
from core.numbers import INT32_MAX, whole_number
from tasks.limits import (
    BY_FIELD,
    LIMITS,
    BadLimit,
    LimitValues,
    money_amount,
)
from tasks.models import Goal, Task
from tasks.permissions import ADD_GOAL, CHANGE_GOAL, CLOSE_TASK, OPERATE_TASK
from tasks.states import (
    DELETABLE,
    EventKind,
    TaskStatus,
    allowed_actions,
)
from tasks.transitions import (
    lock_task,
    notify_ready,
    promote_dependants,
    record_event,
    set_status,
)
from tasks.workspace import remove_task_files

log = logging.getLogger("acthelm.tasks")


def default_limits() -> LimitValues:
    """The limits a new task gets: each limit's setting (`tasks.limits.LIMITS`)."""
    return {
        limit.field: money_limit(limit.field, value) if limit.money else int(value)
        for limit in LIMITS
        for value in [getattr(settings, limit.setting)]
    }


def money_limit(field: str, value: object) -> Decimal | None:
    """A money limit as stored (empty: no limit); InvalidInput when it is not an amount."""
    try:
        return money_amount(field, value)
    except BadLimit as exc:
        raise InvalidInput(str(exc), field="limits") from None


def validate_limits(limits: Mapping[str, object]) -> LimitValues:
    clean: LimitValues = {}
    for field, value in limits.items():
        limit = BY_FIELD.get(field)
        if limit is None:
            raise InvalidInput(f"unknown limit {field!r}", field="limits")
        if limit.money:
            clean[field] = money_limit(field, value)
        else:
            clean[field] = whole_number(value, name=field, minimum=1, maximum=INT32_MAX)
    return clean


def act(task_id: int, action: str, actor: Actor, perm: str = OPERATE_TASK) -> Task:
    actor.require(perm)
    task = lock_task(task_id)

    if action not in allowed_actions(task.status):
        raise TransitionNotAllowed(f"task {task_id} is {task.status}; {action} is not possible")
    return task


def task_pause(*, actor: Actor, task_id: int) -> Task:
    """A ready task pauses at once; a running one stops at its next safe point."""
    with transaction.atomic():
        task = act(task_id, "pause", actor)
        if task.status == TaskStatus.READY:
            set_status(task, TaskStatus.PAUSED, actor=actor, kind=EventKind.PAUSED)
        else:
            set_status(
                task, TaskStatus.PAUSE_REQUESTED, actor=actor, kind=EventKind.PAUSE_REQUESTED
            )
    return task


def task_withdraw_pause(*, actor: Actor, task_id: int) -> Task:
    with transaction.atomic():
        task = act(task_id, "withdraw_pause", actor)
        set_status(task, TaskStatus.IN_PROGRESS, actor=actor, kind=EventKind.PAUSE_WITHDRAWN)
    return task


def note_stuck_dependants(task: Task, *, actor: Actor) -> list[int]:
    """`task` was cancelled or failed: each blocked dependant stays blocked, and its timeline says
    why. Called in the transaction that moved `task` (`task_cancel`; the worker when it fails a
    task). Returns the dependants noted."""
    noted = []
    for dependant in Task.objects.filter(
        dependency_links__depends_on=task, status=TaskStatus.BLOCKED
    ).order_by("id"):
        record_event(
            dependant,
            actor=actor,
            kind=EventKind.UNBLOCK_BLOCKED,
            data={"dependency": task.pk, "dependency_status": task.status},
        )
        noted.append(dependant.pk)
    return noted


#: What a cancel settles in the apps above the ledger, each in the cancel's transaction: a
#: function of the locked task and the cancel's reason that returns what the `cancelled` event
#: records. The apps that own those rows register them when they are ready (`agents.apps`: the
#: runs and the tool calls in flight; `approvals.apps`: the open decisions, which keep the
#: reason), so the ledger calls them without importing them.
CancelSettler = Callable[[Task, str], dict[str, Any]]
_cancel_settlers: list[CancelSettler] = []


def settle_on_cancel(settler: CancelSettler) -> None:
    """Register what a cancel settles in another app (called from an `AppConfig.ready`)."""
    if settler not in _cancel_settlers:
        _cancel_settlers.append(settler)


#: A cancel's reason: a sentence or two for the timeline, not a document.
CANCEL_REASON_MAX_CHARS = 500


def task_cancel(*, actor: Actor, task_id: int, reason: str = "") -> Task:
    """A person's cancel, whichever door it comes through (console, admin, CLI, API): no further
    step starts. In one transaction that holds the task's lock: each registered settler (a
    running attempt ends now, its worker notices at its next safe point; a tool call in flight
    becomes `unknown`; open approvals and needs_review decisions are cancelled, the approvals
    with the reason), then the status with a `cancelled` event that records the optional reason
    and what was settled, and blocked dependants noted."""
    reason = (reason or "").strip()
    if len(reason) > CANCEL_REASON_MAX_CHARS:
        raise InvalidInput(
            f"the reason is {len(reason)} characters; at most {CANCEL_REASON_MAX_CHARS}",
            field="reason",
        )
    with transaction.atomic():
        task = act(task_id, "cancel", actor)
        settled: dict[str, Any] = {}
        for settler in _cancel_settlers:
            settled |= settler(task, reason)
        set_status(
            task,
            TaskStatus.CANCELLED,
            actor=actor,
            kind=EventKind.CANCELLED,
            data={"reason": reason, **settled},
        )
        note_stuck_dependants(task, actor=actor)
    return task


def task_close(*, actor: Actor, task_id: int) -> Task:
    """A person closes a task in review: done. Dependants whose dependencies are done get ready."""
    if not actor.is_person:
        raise TransitionNotAllowed("only a person closes a task")
    with transaction.atomic():
        task = act(task_id, "close", actor, perm=CLOSE_TASK)
        set_status(task, TaskStatus.DONE, actor=actor, kind=EventKind.CLOSED)
        promote_dependants(task, actor=actor)
    return task


def task_retry_now(*, actor: Actor, task_id: int, data: Mapping[str, object] | None = None) -> Task:
    """A ready task waiting for its retry back-off (or a cooldown) becomes claimable now: the
    wait is dropped and the workers are woken. Only a ready task with a wait; its attempts
    still count. `data` adds to the `retried` event (what a person's change made of the run)."""
    actor.require(OPERATE_TASK)
    with transaction.atomic():
        task = lock_task(task_id)
        if task.status != TaskStatus.READY or task.not_before is None:
            raise TransitionNotAllowed(
                f"task {task_id} is {task.status} and waits for no retry; retry now is not possible"
            )
        waited_until = task.not_before
        task.not_before = None
        task.save(update_fields=["not_before", "updated_at"])
        record_event(
            task,
            actor=actor,
            kind=EventKind.RETRIED,
            data={"retry_now": True, "not_before_was": waited_until.isoformat(), **(data or {})},
        )
        notify_ready()
    return task


def task_reopen(*, actor: Actor, task_id: int, feedback: str) -> Task:
    feedback = (feedback or "").strip()
    if not feedback:
        raise InvalidInput("reopening needs feedback for the next attempt", field="feedback")
    with transaction.atomic():
        task = act(task_id, "reopen", actor, perm=CLOSE_TASK)
        set_status(
            task,
            TaskStatus.READY,
            actor=actor,
            kind=EventKind.REOPENED,
            data={"feedback": feedback},
            feedback=feedback,
            failed_attempts=0,
            not_before=None,
        )
    return task


def _jsonable(value: int | Decimal | None) -> int | str | None:
    return str(value) if isinstance(value, Decimal) else value


def task_set_limits(*, actor: Actor, task_id: int, **limits: object) -> Task:
    """Raise or lower a task's limits while no worker holds it."""
    clean = validate_limits(limits)
    with transaction.atomic():
        actor.require(OPERATE_TASK)
        task = lock_task(task_id)
        if task.is_held:
            raise TransitionNotAllowed(f"task {task_id} is running; pause it to change its limits")
        before = {field: _jsonable(getattr(task, field)) for field in clean}
        for field, value in clean.items():
            setattr(task, field, value)
        task.save(update_fields=[*clean, "updated_at"])
        record_event(
            task,
            actor=actor,
            kind=EventKind.LIMITS_CHANGED,
            data={"before": before, "after": {k: _jsonable(v) for k, v in clean.items()}},
        )
    return task


def task_delete(*, actor: Actor, task_id: int) -> None:
    """Delete a done, failed or cancelled task with its transcript, events, artifacts and its
    files (input files and artifacts on disk)."""
    with transaction.atomic():
        task = act(task_id, "delete", actor)
        if task.status not in DELETABLE:  # the actions table says so too; belt and braces
            raise TransitionNotAllowed(f"task {task_id} is {task.status}; it cannot be deleted")
        if task.dependant_links.filter(~Q(task__status__in=DELETABLE)).exists():
            raise TransitionNotAllowed(f"open tasks depend on task {task_id}")
        task.delete()
    # Only once the row is gone: a refused delete (any raise above) keeps the files. Called
    # inside a caller's transaction that later rolls back, the files would be gone with the
    # row kept; no caller does that (the console, the CLI and the API call it on its own).
    remove_task_files(task_id)
    log.info("task.deleted", extra={"task_id": task_id, "actor": actor.label})


# --- Goals -----------------------------------------------------------------------------------


def goal_create(
    *,
    actor: Actor,
    title: str,
    description: str = "",
    acceptance_checks: Sequence[Mapping[str, object]] | None = None,
) -> Goal:
    """A new active goal; the reconciler plans it at its next pass while it has no open work.

    `acceptance_checks` are stored as given: the interfaces call
    `agents.actions.tasks.goal_create`, which validates them (the kinds live in the engine)."""
    actor.require(ADD_GOAL)
    title, description = (title or "").strip(), (description or "").strip()
    if not title:
        raise InvalidInput("a goal needs a title", field="title")
    if len(title) > 200:
        raise InvalidInput("a title is at most 200 characters", field="title")
    goal = Goal.objects.create(
        title=title,
        description=description,
        acceptance_checks=list(acceptance_checks or []),
        created_by=actor.user if actor.is_person else None,
    )
    log.info("goal.created", extra={"goal_id": goal.pk, "actor": actor.label})
    return goal


def goal_deactivate(*, actor: Actor, goal_id: int) -> Goal:
    """The reconciler stops planning the goal. Its tasks keep their states: a person cancels
    or closes them one by one."""
    actor.require(CHANGE_GOAL)
    with transaction.atomic():
        goal = Goal.objects.select_for_update().filter(pk=goal_id).first()
        if goal is None:
            raise GoalNotFound(f"goal {goal_id} does not exist")
        if not goal.active:
            raise TransitionNotAllowed(f"goal {goal_id} is already inactive")
        goal.active = False
        goal.save(update_fields=["active"])
    log.info("goal.deactivated", extra={"goal_id": goal_id, "actor": actor.label})
    return goal
