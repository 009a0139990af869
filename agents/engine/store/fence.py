"""The fence and the lease: how a run proves, at every write, that it still holds its task
(`holds_attempt`), how a process renews the leases of the tasks it holds, and which held tasks
have lost their worker (`stale_task_ids`, what recovery ends). Every statement here checks the same
four conditions (`_HOLDS`), with the statuses from the enums."""

import functools
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import connection, transaction

from agents.engine.store.literal import literal
from agents.states import RunStatus
from core import fastsql
from core.exceptions import AttemptLost
from tasks.models import Task
from tasks.states import HELD_SQL
from tasks.transitions import require_atomic

log = logging.getLogger("acthelm.tasks")


# The four checks of holds_attempt() in the row the statement locks (docs/worker.md, "The
# fence"): the task is held; its claim counter is the run's (so the run is the newest claim's,
# hence the task's newest run); no person's fencing action was recorded after the run's claim
# event; the run is still started. It renews the lease on the way, and returns the task's status
# (a pause request) and the transaction's clock.
_HOLDS = f"""
  AND t.status IN {HELD_SQL}
  AND t.claim_count = r.claim_count
  AND r.status = {literal(RunStatus.STARTED)}
  AND (t.last_person_event_id IS NULL OR t.last_person_event_id < r.claim_event_id)"""
_FENCE_SQL = (
    """
UPDATE tasks_task t SET lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM agents_agentrun r
WHERE t.id = %(task)s AND r.id = %(run)s AND r.task_id = t.id"""
    + _HOLDS
    + """
RETURNING {columns}, now()
"""
)
_FENCE_BRIEF = _FENCE_SQL.format(columns="t.status")


def fence_lock(*, task: str, run: str) -> str:
    """The fence as one locking read for a larger piece of SQL (the step function of
    `functions.step_function_sql`): the `_HOLDS` checks on the task row it locks FOR NO KEY
    UPDATE (the lock an UPDATE of the lease takes), `task` and `run` being that SQL's expressions
    for the parameters. It returns the task's status; no row when the run has lost its task.
    It does not renew the lease (the process heartbeat does): no new version of the task row, so
    no CHECK constraints evaluated, no dead row left behind and less WAL at every step."""
    return (
        f"""
SELECT t.status FROM tasks_task t JOIN agents_agentrun r ON r.task_id = t.id
WHERE t.id = {task} AND r.id = {run}"""
        + _HOLDS
        + """
FOR NO KEY UPDATE OF t"""
    )


@functools.cache
def _fence_full() -> str:
    """The fence that returns the whole task row (`fastsql.Row`'s columns), then the clock: the
    locking read of `fence_lock`, no lease renewal. Its caller writes the row it returns (an
    outcome's status change, an operation's transaction): one new version of the task row, not
    a renewed lease and then that."""
    columns = fastsql.Row.of(Task).columns("t")
    return fence_lock(task="%(task)s", run="%(run)s").replace(
        "SELECT t.status FROM", f"SELECT {columns}, now() FROM", 1
    )


@dataclass(frozen=True)
class Fence:
    """What the fence statement returned: the task's status, the transaction's clock, and the
    whole task row when asked for."""

    status: str
    now: datetime
    task: Task | None = None


def fence(
    run_id: int, task_id: int, *, full: bool = False, lease_seconds: float | None = None
) -> Fence:
    """Prove, in one statement, that run `run_id` still holds task `task_id`, lock the task row
    and renew the lease (`full`: only lock it, and return it); raise AttemptLost otherwise (also
    when the task no longer exists)."""
    lease = settings.ACTHELM_LEASE_SECONDS if lease_seconds is None else lease_seconds
    params = {"lease": lease, "task": task_id, "run": run_id}
    if full:  # the task's row, each column through its field's converters (fastsql.Row)
        found = fastsql.execute(_fence_full(), params).fetchone()
        if found is not None:
            task = fastsql.Row.of(Task).instance(found)
            assert isinstance(task, Task)  # Row.of(Task) builds tasks
            return Fence(status=task.status, now=found[-1], task=task)
    else:  # every step's first statement: server-bound, without Django's quoting (core.fastsql)
        row = fastsql.execute(_FENCE_BRIEF, params).fetchone()
        if row is not None:
            return Fence(status=row[0], now=row[1])
    log.warning("run.fenced_out", extra={"task_id": task_id, "run_id": run_id})
    raise AttemptLost(f"run {run_id} no longer holds task {task_id}")


def holds_attempt(task: Task, run_id: int) -> bool:
    """Does run `run_id` still own `task`? The four checks as one statement (see `fence`);
    the caller is inside a transaction."""
    require_atomic()
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
        task = fence(run_id, task_id, full=True).task
        assert task is not None  # the full fence carries the row
        yield task


def renew_lease(*, task_id: int, run_id: int, lease_seconds: float | None = None) -> str:
    """Heartbeat: ONE statement (the fence, autocommitted) that extends the lease if the run
    still holds the task, else AttemptLost. Only the task's lease column changes (no index on
    it: a HOT update); the run row is not touched. Returns the task's status, so the worker
    sees a pause request."""
    return fence(run_id, task_id, lease_seconds=lease_seconds).status


# The process heartbeat (docs/worker.md, "One heartbeat per process"): the fence's four checks,
# the same `_HOLDS` conditions on the row each update locks, for every (task, run) the process
# holds, in ONE statement. A pair it does not return has lost its task.
_RENEW_ALL_SQL = (
    """
UPDATE tasks_task t SET lease_expires_at = now() + make_interval(secs => %(lease)s)
FROM agents_agentrun r, unnest(%(tasks)s::bigint[], %(runs)s::bigint[]) AS held(task_id, run_id)
WHERE t.id = held.task_id AND r.id = held.run_id AND r.task_id = t.id"""
    + _HOLDS
    + """
RETURNING t.id, t.status
"""
)

# The fence's checks as a read: no lock, no write, no commit to flush. What a run asks just before
# a tool with an effect starts, so that none starts after a person's cancel has committed.
_HOLDS_NOW_SQL = (
    """
SELECT t.status FROM tasks_task t JOIN agents_agentrun r ON r.task_id = t.id
WHERE t.id = %(task)s AND r.id = %(run)s"""
    + _HOLDS
)


def renew_leases(
    held: Iterable[tuple[int, int]], *, lease_seconds: float | None = None
) -> dict[int, str]:
    """Renew the lease of every (task_id, run_id) in `held` that still holds its task, in one
    autocommitted statement; returns {task_id: status} for those. A task missing from the answer
    was cancelled, recovered, reset or deleted: its run has lost it."""
    pairs = sorted(held)
    if not pairs:
        return {}
    lease: float = settings.ACTHELM_LEASE_SECONDS if lease_seconds is None else lease_seconds
    params: dict[str, float | list[int]] = {
        "lease": lease,
        "tasks": [task for task, _ in pairs],
        "runs": [run for _, run in pairs],
    }
    with connection.cursor() as cursor:
        cursor.execute(_RENEW_ALL_SQL, params)
        return dict(cursor.fetchall())


def holds_now(*, task_id: int, run_id: int) -> str:
    """The task's status if run `run_id` still holds it (the fence's checks, read only), else
    AttemptLost."""
    with connection.cursor() as cursor:
        cursor.execute(_HOLDS_NOW_SQL, {"task": task_id, "run": run_id})
        row = cursor.fetchone()
    if row is None:
        log.warning("run.fenced_out", extra={"task_id": task_id, "run_id": run_id})
        raise AttemptLost(f"run {run_id} no longer holds task {task_id}")
    status: str = row[0]
    return status


def seconds_to_earliest_expiry() -> float | None:
    """Seconds until the earliest lease of a held task expires, by the database's clock (None:
    no task is held)."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT EXTRACT(EPOCH FROM min(lease_expires_at) - now()) FROM tasks_task "
            f"WHERE status IN {HELD_SQL}"
        )
        row = cursor.fetchone()
    return None if row is None or row[0] is None else float(row[0])


_STALE_SQL = f"""
SELECT t.id FROM tasks_task t
WHERE t.status IN {HELD_SQL} {{only}}
  AND (t.lease_expires_at < now()
       OR EXISTS (SELECT 1 FROM agents_agentrun r
                  WHERE r.task_id = t.id AND r.status = {literal(RunStatus.STARTED)}
                    AND r.started_at < now() - make_interval(
                        secs => greatest(t.limit_runtime_seconds, %(timeout)s) + 300)))
ORDER BY t.id LIMIT 500
"""


def stale_task_ids(task_id: int | None = None) -> list[int]:
    """Held tasks whose lease expired, or whose run started longer ago than it may last + 5
    minutes: the larger of the global run timeout and the task's own runtime limit (up to 500;
    with `task_id`, that task if it is one). Judged by the database's clock, like the run's
    start, so the clocks of worker hosts do not matter."""
    params: dict[str, float | int] = {"timeout": settings.ACTHELM_RUN_TIMEOUT_SECONDS}
    only = ""
    if task_id is not None:
        only, params["task"] = "AND t.id = %(task)s", task_id
    with connection.cursor() as cursor:
        cursor.execute(_STALE_SQL.format(only=only), params)
        return [row[0] for row in cursor.fetchall()]
