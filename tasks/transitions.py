"""The only writer of a task's status.

Every function here locks the task row (`SELECT … FOR UPDATE`), checks the move against
`tasks.states.TRANSITIONS`, writes the new state and a `TaskEvent` in one transaction, and raises
`TransitionNotAllowed` for a move the table does not allow. The claim is the one exception to the
lock-then-write shape: it is a single conditional UPDATE whose WHERE clause decides the race.
"""

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings
from django.db import connection, transaction

from agents.models import AgentRun
from tasks.actors import Actor
from tasks.exceptions import AttemptLost, TaskNotFound, TransitionNotAllowed
from tasks.models import Task, TaskEvent
from tasks.notify.outbox import enqueue_for_event
from tasks.states import (
    COOPERATIVE_EVENTS,
    HELD,
    ActorKind,
    EventKind,
    TaskStatus,
    can_transition,
)

log = logging.getLogger("acthelm.tasks")

READY_CHANNEL = "acthelm_ready"


def _require_atomic() -> None:
    if not connection.in_atomic_block:
        raise RuntimeError("task transitions must run inside transaction.atomic()")


def lock_task(task_id: int) -> Task:
    """Lock and return the task row; the caller is inside transaction.atomic()."""
    _require_atomic()
    try:
        return Task.objects.select_for_update().get(pk=task_id)
    except Task.DoesNotExist:
        raise TaskNotFound(f"task {task_id} does not exist") from None


def record_event(
    task: Task,
    *,
    actor: Actor,
    kind: str,
    run: AgentRun | None = None,
    data: dict | None = None,
    from_status: str = "",
    to_status: str = "",
) -> TaskEvent:
    event = TaskEvent.objects.create(
        task=task,
        run=run,
        kind=kind,
        actor_kind=actor.kind,
        actor_user=actor.user if actor.is_person else None,
        actor_label=actor.label,
        from_status=from_status,
        to_status=to_status,
        data=data or {},
    )
    if actor.is_person and kind not in COOPERATIVE_EVENTS:
        # The fence reads this column of the row it locks: a person's action committed while a
        # worker's fence waited for the lock is seen (a subquery on the events would not see it).
        Task.objects.filter(pk=task.pk).update(last_person_event_id=event.pk)
        task.last_person_event_id = event.pk
    enqueue_for_event(event)  # the outbox row commits (or rolls back) with its event
    return event


def record_events(events: list[TaskEvent]) -> list[TaskEvent]:
    """Several events of one worker step in one INSERT (the worker's recorder). Worker events
    only: a person's action goes through `record_event`, which also marks the task row."""
    if any(e.actor_kind == ActorKind.PERSON for e in events):
        raise ValueError("a person's events go through record_event")
    if not events:
        return []
    created = TaskEvent.objects.bulk_create(events)
    for event in created:
        enqueue_for_event(event)  # none of a step's events notifies today; kept for the rule
    return created


def notify_ready() -> None:
    """Wake idle workers; PostgreSQL delivers the NOTIFY only when the transaction commits."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_notify(%s, '')", [READY_CHANNEL])


def set_status(
    task: Task,
    to: str,
    *,
    actor: Actor,
    kind: str,
    run: AgentRun | None = None,
    data: dict | None = None,
    **fields,
) -> TaskEvent:
    """Move a task that the caller has locked (see `lock_task`) and record why."""
    _require_atomic()
    current = task.status
    if not can_transition(current, to):
        raise TransitionNotAllowed(
            f"task {task.pk} is {current}; it cannot move to {to} ({kind})",
        )
    task.status = to
    if to not in HELD:
        task.lease_owner = ""
        task.lease_expires_at = None
    for name, value in fields.items():
        setattr(task, name, value)
    task.save()
    if to == TaskStatus.READY:
        notify_ready()
    event = record_event(
        task, actor=actor, kind=kind, run=run, data=data, from_status=current, to_status=to
    )
    log.info(
        "task.%s",
        kind,
        extra={"task_id": task.pk, "from": current, "to": to, "actor": actor.label},
    )
    return event


def transition(task_id: int, to: str, *, actor: Actor, kind: str, **kwargs) -> Task:
    """Lock, check, move and record, in one transaction."""
    with transaction.atomic():
        task = lock_task(task_id)
        set_status(task, to, actor=actor, kind=kind, **kwargs)
        return task


def promote_dependants(task: Task, *, actor: Actor) -> list[int]:
    """After `task` became done: each blocked dependant whose dependencies are all done is ready."""
    _require_atomic()
    promoted = []
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


# --- The claim and the fence -------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    task_id: int
    run_id: int
    claim_count: int
    claim_event_id: int | None = None


def _insert_columns(model, given: dict[str, str], prefix: str) -> tuple[str, str, dict]:
    """Column list, SELECT expressions and parameters for an INSERT … SELECT of `model` inside
    the claim statement: `given` maps columns to SQL; every other column gets its model default
    as a parameter (so a column added later needs no change here)."""
    columns, values, params = [], [], {}
    for field in model._meta.concrete_fields:
        columns.append(field.column)
        if field.column in given:
            values.append(given[field.column])
        else:
            key = f"{prefix}_{field.column}"
            values.append(f"%({key})s")
            params[key] = field.get_db_prep_save(field.get_default(), connection)
    return ", ".join(columns), ", ".join(values), params


_RUN_COLUMNS = {
    "id": "ids.run_id",
    "task_id": "c.id",
    "number": "coalesce(p.number, 0) + 1",
    "claim_count": "c.claim_count",
    "claim_event_id": "ids.event_id",
    "status": "'started'",
    "worker_id": "%(worker)s",
    "started_at": "now()",
    "connection_id": "c.connection_id",
    "model_id": "c.model_id",
}
_EVENT_COLUMNS = {
    "id": "ids.event_id",
    "task_id": "c.id",
    "run_id": "ids.run_id",
    "kind": "'claimed'",
    "actor_kind": "'worker'",
    "actor_user_id": "NULL",
    "actor_label": "%(worker)s",
    "from_status": "'ready'",
    "to_status": "'in_progress'",
    "data": "jsonb_build_object('run_id', ids.run_id, 'newest_run_id_before', p.id, "
    "'claim_count', c.claim_count)",
    "created_at": "now()",
}

# The claim, the run and the claim event in ONE statement. SKIP LOCKED spreads workers over
# rows; the `t.status = 'ready'` guard of the UPDATE decides a race (the loser updates nothing,
# so it inserts nothing). Both ids come from their sequences inside the statement (the foreign
# keys are checked at commit). A task whose connection cools down is not a candidate.
_CLAIM_SQL = """
WITH candidate AS (
    SELECT t.id FROM tasks_task t
    WHERE t.status = 'ready'
      AND (t.not_before IS NULL OR t.not_before <= now())
      AND NOT EXISTS (
          SELECT 1 FROM tasks_taskdependency d
          JOIN tasks_task dep ON dep.id = d.depends_on_id
          WHERE d.task_id = t.id AND dep.status <> 'done')
      AND NOT EXISTS (
          SELECT 1 FROM agents_connection k
          WHERE k.id = t.connection_id AND k.cooldown_until > now())
    ORDER BY t.priority DESC, t.id
    LIMIT 1
    FOR UPDATE OF t SKIP LOCKED
), claimed AS (
    UPDATE tasks_task t
    SET status = 'in_progress', claim_count = t.claim_count + 1, lease_owner = %(worker)s,
        lease_expires_at = now() + make_interval(secs => %(lease)s), not_before = NULL,
        updated_at = now()
    FROM candidate WHERE t.id = candidate.id AND t.status = 'ready'
    RETURNING t.id, t.claim_count, t.connection_id, t.model_id
), previous AS (
    SELECT DISTINCT ON (r.task_id) r.task_id, r.id, r.number
    FROM agents_agentrun r JOIN claimed c ON r.task_id = c.id
    ORDER BY r.task_id, r.number DESC
), ids AS (
    SELECT nextval(pg_get_serial_sequence('agents_agentrun', 'id')) AS run_id,
           nextval(pg_get_serial_sequence('tasks_taskevent', 'id')) AS event_id
    FROM claimed
), run AS (
    INSERT INTO agents_agentrun ({run_columns})
    SELECT {run_values}
    FROM claimed c CROSS JOIN ids LEFT JOIN previous p ON p.task_id = c.id
    RETURNING id
), event AS (
    INSERT INTO tasks_taskevent ({event_columns})
    SELECT {event_values}
    FROM claimed c CROSS JOIN ids LEFT JOIN previous p ON p.task_id = c.id
    RETURNING id
)
SELECT c.id, ids.run_id, c.claim_count, ids.event_id
FROM claimed c CROSS JOIN ids
WHERE EXISTS (SELECT 1 FROM run) AND EXISTS (SELECT 1 FROM event)
"""


def claim_next(*, worker_id: str, lease_seconds: float | None = None) -> Claim | None:
    """Claim the next due ready task for `worker_id`, or return None when there is none: ONE
    statement (`_CLAIM_SQL`), one commit. The run starts at the database's clock."""
    lease = settings.ACTHELM_LEASE_SECONDS if lease_seconds is None else lease_seconds
    run_columns, run_values, run_params = _insert_columns(AgentRun, _RUN_COLUMNS, "run")
    event_columns, event_values, event_params = _insert_columns(TaskEvent, _EVENT_COLUMNS, "ev")
    sql = _CLAIM_SQL.format(
        run_columns=run_columns,
        run_values=run_values,
        event_columns=event_columns,
        event_values=event_values,
    )
    params = {"worker": worker_id, "lease": lease, **run_params, **event_params}
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            row = cursor.fetchone()
    if row is None:
        return None
    task_id, run_id, claim_count, event_id = row
    log.info("task.claimed", extra={"task_id": task_id, "run_id": run_id, "worker": worker_id})
    return Claim(task_id=task_id, run_id=run_id, claim_count=claim_count, claim_event_id=event_id)


# The four checks of holds_attempt() in the row the statement locks (docs/worker.md, "The
# fence"): the task is held; its claim counter is the run's (so the run is the newest claim's,
# hence the task's newest run); no person's fencing action was recorded after the run's claim
# event; the run is still started. It renews the lease on the way, and returns the task's status
# (a pause request) and the transaction's clock.
_FENCE_SQL = """
UPDATE tasks_task t SET lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM agents_agentrun r
WHERE t.id = %(task)s AND r.id = %(run)s AND r.task_id = t.id
  AND t.status IN ('in_progress', 'pause_requested')
  AND t.claim_count = r.claim_count
  AND r.status = 'started'
  AND (t.last_person_event_id IS NULL OR t.last_person_event_id < r.claim_event_id)
RETURNING {columns}, now()
"""
_FENCE_BRIEF = _FENCE_SQL.format(columns="t.status")
_FENCE_FULL = _FENCE_SQL.format(columns="t.*").replace("now()\n", "now() AS fence_now\n")


@dataclass(frozen=True)
class Fence:
    """What the fence statement returned: the task's status, the transaction's clock, and the
    whole task row when asked for."""

    status: str
    now: object
    task: Task | None = None


def fence(run_id: int, task_id: int, *, full: bool = False, lease_seconds=None) -> Fence:
    """Prove, in one statement, that run `run_id` still holds task `task_id`, lock the task row
    and renew the lease; raise AttemptLost otherwise (also when the task no longer exists)."""
    lease = settings.ACTHELM_LEASE_SECONDS if lease_seconds is None else lease_seconds
    params = {"lease": lease, "task": task_id, "run": run_id}
    if full:  # through the ORM's raw query, so that every column gets its converter
        rows = list(Task.objects.raw(_FENCE_FULL, params))
        if rows:
            return Fence(status=rows[0].status, now=rows[0].fence_now, task=rows[0])
    else:
        with connection.cursor() as cursor:
            cursor.execute(_FENCE_BRIEF, params)
            row = cursor.fetchone()
        if row is not None:
            return Fence(status=row[0], now=row[1])
    log.warning("run.fenced_out", extra={"task_id": task_id, "run_id": run_id})
    raise AttemptLost(f"run {run_id} no longer holds task {task_id}")


def holds_attempt(task: Task, run_id: int) -> bool:
    """Does run `run_id` still own `task`? The four checks as one statement (see `fence`);
    the caller is inside a transaction."""
    _require_atomic()
    try:
        with transaction.atomic():
            fence(run_id, task.pk)
    except AttemptLost:
        return False
    return True


@contextmanager
def fenced(run_id: int, task_id: int) -> Iterator[Task]:
    """A transaction in which the run provably still holds its task; else AttemptLost, no write.
    Yields the task row, locked."""
    with transaction.atomic():
        yield fence(run_id, task_id, full=True).task


def renew_lease(*, task_id: int, run_id: int, lease_seconds: float | None = None) -> str:
    """Heartbeat: ONE statement (the fence, autocommitted) that extends the lease if the run
    still holds the task, else AttemptLost. Only the task's lease column changes (no index on
    it: a HOT update); the run row is not touched. Returns the task's status, so the worker
    sees a pause request."""
    return fence(run_id, task_id, lease_seconds=lease_seconds).status
