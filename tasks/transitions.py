"""The only writer of a task's status.

Every function here locks the task row (`SELECT … FOR UPDATE`), checks the move against
`tasks.states.TRANSITIONS`, writes the new state and a `TaskEvent` in one transaction, and raises
`TransitionNotAllowed` for a move the table does not allow. The claim
(`agents.engine.store.claim`) is the one exception to the lock-then-write shape: a single
conditional UPDATE whose WHERE clause decides the race.
"""

import logging
from typing import Any

from django.db import connection, transaction
from django.db.models import Model
from django.utils import timezone

from core import fastsql
from core.actors import Actor, ActorKind
from core.exceptions import TaskNotFound, TransitionNotAllowed
from tasks.models import Task, TaskEvent
from tasks.notify.outbox import enqueue_for_event
from tasks.states import (
    COOPERATIVE_EVENTS,
    HELD,
    EventKind,
    TaskStatus,
    can_transition,
)

log = logging.getLogger("acthelm.tasks")

READY_CHANNEL = "acthelm_ready"
# A person's (or recovery's) action on a task a worker holds: pause, withdraw, cancel, a fencing
# event. The payload is the task id; the worker that runs it checks at once (docs/worker.md).
SIGNAL_CHANNEL = "acthelm_signal"


def require_atomic() -> None:
    if not connection.in_atomic_block:
        raise RuntimeError("task transitions must run inside transaction.atomic()")


def lock_task(task_id: int) -> Task:
    """Lock and return the task row; the caller is inside transaction.atomic()."""
    require_atomic()
    try:
        return Task.objects.select_for_update().get(pk=task_id)
    except Task.DoesNotExist:
        raise TaskNotFound(f"task {task_id} does not exist") from None


def move_columns(current: str, to: str, fields: dict[str, Any]) -> dict[str, Any]:
    """The task's columns a move from `current` to `to` writes, `fields` with them: its status,
    and the lease ended when the task is no longer held. TransitionNotAllowed for a move the
    table does not allow. What `set_status` writes, and what a worker's run writes when its end
    moves the task in its last step's statement (agents.engine.store.Handoff)."""
    if not can_transition(current, to):
        raise TransitionNotAllowed(f"a task that is {current} cannot move to {to}")
    columns: dict[str, Any] = {"status": to}
    if to not in HELD:
        columns |= {"lease_owner": "", "lease_expires_at": None}
    return columns | fields


def event_values(
    task_id: int,
    *,
    actor: Actor,
    kind: str,
    run_id: int | None = None,
    data: dict[str, Any] | None = None,
    from_status: str = "",
    to_status: str = "",
) -> dict[str, Any]:
    """A TaskEvent's fields as `record_event` writes them."""
    return {
        "task_id": task_id,
        "run_id": run_id,
        "kind": kind,
        "actor_kind": actor.kind,
        "actor_user_id": actor.user.pk if actor.is_person and actor.user is not None else None,
        "actor_label": actor.label,
        "from_status": from_status,
        "to_status": to_status,
        "data": (data or {}) | actor.event_data,
    }


def log_move(task_id: int, kind: str, *, current: str, to: str, actor: Actor) -> None:
    log.info(
        "task.%s", kind, extra={"task_id": task_id, "from": current, "to": to, "actor": actor.label}
    )


def record_event(
    task: Task,
    *,
    actor: Actor,
    kind: str,
    run: Model | None = None,
    data: dict[str, Any] | None = None,
    from_status: str = "",
    to_status: str = "",
) -> TaskEvent:
    """Write one event of `task`. `run` is the agents.AgentRun it belongs to, if any (by its id:
    the tasks app sits below the agents app)."""
    values = event_values(
        task.pk,
        actor=actor,
        kind=kind,
        run_id=None if run is None else run.pk,
        data=data,
        from_status=from_status,
        to_status=to_status,
    )
    del values["task_id"], values["actor_user_id"]
    event = TaskEvent(task=task, actor_user=actor.user if actor.is_person else None, **values)
    fastsql.Insert.of(TaskEvent).instances([event], timezone.now())  # create(), compiled once
    if actor.is_person and kind not in COOPERATIVE_EVENTS:
        # The fence reads this column of the row it locks: a person's action committed while a
        # worker's fence waited for the lock is seen (a subquery on the events would not see it).
        Task.objects.filter(pk=task.pk).update(last_person_event_id=event.pk)
        task.last_person_event_id = event.pk
        if task.status in HELD and not to_status:
            notify_signal(task.pk)  # a fencing event on a running task: its run stops
    enqueue_for_event(event)  # the outbox row commits (or rolls back) with its event
    return event


def record_events(events: list[TaskEvent]) -> list[TaskEvent]:
    """Several events of one worker step in one INSERT (the worker's recorder). Worker events
    only: a person's action goes through `record_event`, which also marks the task row."""
    if any(e.actor_kind == ActorKind.PERSON for e in events):
        raise ValueError("a person's events go through record_event")
    if not events:
        return []
    # One INSERT without the ORM's compile (a worker writes one of these every step).
    created = fastsql.Insert.of(TaskEvent).instances(events, timezone.now())
    for event in created:
        enqueue_for_event(event)  # none of a step's events notifies today; kept for the rule
    return created


def notify_ready() -> None:
    """Wake idle workers; PostgreSQL delivers the NOTIFY only when the transaction commits."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [READY_CHANNEL])


def notify_signal(task_id: int) -> None:
    """Tell the worker running `task_id` that a person acted on it; delivered on commit, so
    the worker sees the new state when it looks."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, %s)", [SIGNAL_CHANNEL, str(task_id)])


def set_status(
    task: Task,
    to: str,
    *,
    actor: Actor,
    kind: str,
    run: Model | None = None,
    data: dict[str, Any] | None = None,
    **fields: Any,
) -> TaskEvent:
    """Move a task that the caller has locked (see `lock_task`) and record why."""
    require_atomic()
    current = task.status
    if not can_transition(current, to):
        raise TransitionNotAllowed(
            f"task {task.pk} is {current}; it cannot move to {to} ({kind})",
        )
    for name, value in move_columns(current, to, fields).items():
        setattr(task, name, value)
    fastsql.save(task)  # task.save(), the UPDATE compiled once
    if to == TaskStatus.READY:
        notify_ready()
    if current in HELD and actor.kind != ActorKind.WORKER:
        notify_signal(task.pk)  # pause, withdraw, cancel, recovery: the run learns it at once
    event = record_event(
        task, actor=actor, kind=kind, run=run, data=data, from_status=current, to_status=to
    )
    log_move(task.pk, kind, current=current, to=to, actor=actor)
    return event


def transition(task_id: int, to: str, *, actor: Actor, kind: str, **kwargs: Any) -> Task:
    """Lock, check, move and record, in one transaction."""
    with transaction.atomic():
        task = lock_task(task_id)
        set_status(task, to, actor=actor, kind=kind, **kwargs)
        return task


def promote_dependants(task: Task, *, actor: Actor) -> list[int]:
    """After `task` became done: each blocked dependant whose dependencies are all done is ready."""
    require_atomic()
    promoted: list[int] = []
    candidates = (
        Task.objects.select_for_update()
        .filter(dependency_links__depends_on=task, status=TaskStatus.BLOCKED)
        .order_by("id")
    )
    for dependant in candidates:
        if not dependant.dependency_links.exclude(depends_on__status=TaskStatus.DONE).exists():
            set_status(
                dependant,
                TaskStatus.READY,
                actor=actor,
                kind=EventKind.PROMOTED,
                data={"dependency": task.pk},
            )
            promoted.append(dependant.pk)
    return promoted
