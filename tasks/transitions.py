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
from agents.states import RunStatus
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
    enqueue_for_event(event)  # the outbox row commits (or rolls back) with its event
    return event


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


_CLAIM_SQL = """
WITH candidate AS (
    SELECT t.id FROM tasks_task t
    WHERE t.status = 'ready'
      AND (t.not_before IS NULL OR t.not_before <= now())
      AND NOT EXISTS (
          SELECT 1 FROM tasks_taskdependency d
          JOIN tasks_task dep ON dep.id = d.depends_on_id
          WHERE d.task_id = t.id AND dep.status <> 'done')
    ORDER BY t.priority DESC, t.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE tasks_task t
SET status = 'in_progress',
    claim_count = t.claim_count + 1,
    lease_owner = %s,
    lease_expires_at = now() + make_interval(secs => %s),
    not_before = NULL,
    updated_at = now()
FROM candidate
WHERE t.id = candidate.id AND t.status = 'ready'
RETURNING t.id, t.claim_count, t.connection_id, t.model_id
"""


def claim_next(*, worker_id: str, lease_seconds: float | None = None) -> Claim | None:
    """Claim the next due ready task for `worker_id`, or return None when there is none.

    One conditional UPDATE moves the task to in_progress and bumps its claim counter; the same
    transaction creates the run and writes the claim event with the newest run id at that moment.
    """
    lease = settings.ACTHELM_LEASE_SECONDS if lease_seconds is None else lease_seconds
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute(_CLAIM_SQL, [worker_id, lease])
            row = cursor.fetchone()
        if row is None:
            return None
        task_id, claim_count, connection_id, model_id = row
        previous = (
            AgentRun.objects.filter(task_id=task_id).order_by("-number").values("id", "number")
        ).first()
        run = AgentRun.objects.create(
            task_id=task_id,
            number=(previous["number"] + 1) if previous else 1,
            claim_count=claim_count,
            worker_id=worker_id,
            connection_id=connection_id,
            model_id=model_id,
        )
        event = TaskEvent.objects.create(
            task_id=task_id,
            run=run,
            kind=EventKind.CLAIMED,
            actor_kind=ActorKind.WORKER,
            actor_label=worker_id,
            from_status=TaskStatus.READY,
            to_status=TaskStatus.IN_PROGRESS,
            data={
                "run_id": run.pk,
                "newest_run_id_before": previous["id"] if previous else None,
                "claim_count": claim_count,
            },
        )
        AgentRun.objects.filter(pk=run.pk).update(claim_event=event)
    log.info("task.claimed", extra={"task_id": task_id, "run_id": run.pk, "worker": worker_id})
    return Claim(task_id=task_id, run_id=run.pk, claim_count=claim_count)


_HOLDS_SQL = """
SELECT r.status,
       r.claim_count,
       (SELECT max(n.id) FROM agents_agentrun n WHERE n.task_id = r.task_id),
       EXISTS (
           SELECT 1 FROM tasks_taskevent e
           WHERE e.task_id = r.task_id AND e.id > r.claim_event_id
             AND e.actor_kind = 'person' AND NOT (e.kind = ANY(%s)))
FROM agents_agentrun r WHERE r.id = %s
"""


def holds_attempt(task: Task, run_id: int) -> bool:
    """Does run `run_id` still own `task` (locked by the caller)?

    True only when the claim counter is the one the run got, no person's action (other than a
    cooperative pause request) was recorded after its claim, the run is still started, and it is
    the task's newest run.
    """
    _require_atomic()
    if task.status not in HELD:
        return False
    with connection.cursor() as cursor:
        cursor.execute(_HOLDS_SQL, [list(COOPERATIVE_EVENTS), run_id])
        row = cursor.fetchone()
    if row is None:
        return False
    status, claim_count, newest_id, person_acted = row
    return (
        status == RunStatus.STARTED
        and claim_count == task.claim_count
        and newest_id == run_id
        and not person_acted
    )


@contextmanager
def fenced(run_id: int, task_id: int) -> Iterator[Task]:
    """A transaction in which the run provably still holds its task; else AttemptLost, no write."""
    with transaction.atomic():
        task = lock_task(task_id)
        if not holds_attempt(task, run_id):
            log.warning("run.fenced_out", extra={"task_id": task_id, "run_id": run_id})
            raise AttemptLost(f"run {run_id} no longer holds task {task_id}")
        yield task


def renew_lease(*, task_id: int, run_id: int, lease_seconds: float | None = None) -> str:
    """Heartbeat: extend the lease if the run still holds the task (else AttemptLost).

    Returns the task's status, so the worker sees a pause request."""
    lease = settings.ACTHELM_LEASE_SECONDS if lease_seconds is None else lease_seconds
    with fenced(run_id, task_id) as task:
        with connection.cursor() as cursor:
            cursor.execute(
                "UPDATE tasks_task SET lease_expires_at = now() + make_interval(secs => %s) "
                "WHERE id = %s",
                [lease, task_id],
            )
            cursor.execute(
                "UPDATE agents_agentrun SET heartbeat_at = now() WHERE id = %s", [run_id]
            )
        return task.status
