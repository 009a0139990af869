"""The claim, the fence and the lease: how a run takes a task from the ledger and proves, at every
write, that it still holds it (`holds_attempt`). The claim is the one status change that is not
lock-then-write (`tasks.transitions`): a single conditional UPDATE whose WHERE clause decides the
race, inserting the run and the claim event in the same statement."""

import functools
import json
import logging
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import connection, models, transaction

from agents.models import AgentRun
from core import fastsql
from core.exceptions import AttemptLost
from tasks.models import Task, TaskEvent
from tasks.states import HELD_SQL
from tasks.transitions import require_atomic

log = logging.getLogger("acthelm.tasks")


@dataclass(frozen=True)
class Claim:
    task_id: int
    run_id: int
    claim_count: int
    claim_event_id: int | None = None


def _insert_columns(
    model: type[models.Model], given: dict[str, str], alias: str
) -> tuple[str, str]:
    """Column list and SELECT expressions for an INSERT … SELECT of `model` inside the claim
    function: `given` maps columns to SQL; every other column is read from `alias`, the row of the
    model's defaults the caller passes (`_defaults`)."""
    columns: list[str] = []
    values: list[str] = []
    for field in model._meta.concrete_fields:
        column = field.column
        assert column is not None  # a concrete field has a column
        columns.append(column)
        values.append(given.get(column, f'{alias}."{column}"'))
    return ", ".join(columns), ", ".join(values)


def _defaults(model: type[models.Model], given: dict[str, str]) -> str:
    """The model's defaults for the columns the claim does not give, as the JSON object the
    function turns into a row of the table (`jsonb_populate_record`): a column added later needs
    no new function, only a default."""
    values = {}
    for field in model._meta.concrete_fields:
        if field.column not in given:
            values[field.column] = field.get_default()
    return json.dumps(values, cls=DjangoJSONEncoder)


_RUN_COLUMNS = {
    "id": "ids.run_id",
    "task_id": "c.id",
    "number": "coalesce(p.number, 0) + 1",
    "claim_count": "c.claim_count",
    "claim_event_id": "ids.event_id",
    "status": "'started'",
    "worker_id": "p_worker",
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
    "actor_label": "p_worker",
    "from_status": "'ready'",
    "to_status": "'in_progress'",
    "data": "jsonb_build_object('run_id', ids.run_id, 'newest_run_id_before', p.id, "
    "'claim_count', c.claim_count)",
    "created_at": "now()",
}

# The claim, the runs and the claim events in ONE statement, for up to p_limit tasks. SKIP
# LOCKED spreads workers over rows; the `t.status = 'ready'` guard of the UPDATE decides a race
# (the loser updates nothing, so it inserts nothing). The ids come from their sequences inside the
# statement, one pair per claimed task (the foreign keys are checked at commit). A task whose
# connection cools down is not a candidate. A worker started by an evaluation
# (`p_evaluation_only`) takes the evaluation's tasks only. It is the body of the function
# `acthelm_claim` (`claim_function_sql`), whose plan PL/pgSQL keeps per session.
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
      AND (t.is_evaluation OR NOT p_evaluation_only)
    ORDER BY t.priority DESC, t.id
    LIMIT p_limit
    FOR UPDATE OF t SKIP LOCKED
), claimed AS (
    UPDATE tasks_task t
    SET status = 'in_progress', claim_count = t.claim_count + 1, lease_owner = p_worker,
        lease_expires_at = now() + make_interval(secs => p_lease), not_before = NULL,
        updated_at = now()
    FROM candidate WHERE t.id = candidate.id AND t.status = 'ready'
    RETURNING t.id, t.claim_count, t.connection_id, t.model_id, t.priority
), previous AS (
    SELECT DISTINCT ON (r.task_id) r.task_id, r.id, r.number
    FROM agents_agentrun r JOIN claimed c ON r.task_id = c.id
    ORDER BY r.task_id, r.number DESC
), ids AS (
    SELECT c.id AS task_id,
           nextval('{run_sequence}'::regclass) AS run_id,
           nextval('{event_sequence}'::regclass) AS event_id
    FROM claimed c
), run AS (
    INSERT INTO agents_agentrun ({run_columns})
    SELECT {run_values}
    FROM claimed c JOIN ids ON ids.task_id = c.id LEFT JOIN previous p ON p.task_id = c.id,
      jsonb_populate_record(NULL::agents_agentrun, p_run) AS run_default
    RETURNING id
), event AS (
    INSERT INTO tasks_taskevent ({event_columns})
    SELECT {event_values}
    FROM claimed c JOIN ids ON ids.task_id = c.id LEFT JOIN previous p ON p.task_id = c.id,
      jsonb_populate_record(NULL::tasks_taskevent, p_event) AS event_default
    RETURNING id
)
SELECT c.id::bigint, ids.run_id::bigint, c.claim_count::integer, ids.event_id::bigint
FROM claimed c JOIN ids ON ids.task_id = c.id
WHERE (SELECT count(*) FROM run) = (SELECT count(*) FROM claimed)
  AND (SELECT count(*) FROM event) = (SELECT count(*) FROM claimed)
ORDER BY c.priority DESC, c.id
"""


def claim_function_sql() -> str:
    """`CREATE OR REPLACE FUNCTION acthelm_claim(...)` as the models make it today (the run's and
    the claim event's columns). A migration holds it as a frozen string (0021_claim_function);
    tests/agents/test_leases.py fails when this changes and no newer migration does. The claim
    is one statement either way; as a function its plan is made once per session instead of at
    every claim — with no prepared statement on the client, so through any pooler."""
    run_columns, run_values = _insert_columns(AgentRun, _RUN_COLUMNS, "run_default")
    event_columns, event_values = _insert_columns(TaskEvent, _EVENT_COLUMNS, "event_default")
    body = _CLAIM_SQL.format(
        run_columns=run_columns,
        run_values=run_values,
        event_columns=event_columns,
        event_values=event_values,
        run_sequence=fastsql.sequence(AgentRun),
        event_sequence=fastsql.sequence(TaskEvent),
    )
    return (
        "CREATE OR REPLACE FUNCTION acthelm_claim(\n"
        "  p_worker text, p_lease double precision, p_limit integer, p_evaluation_only boolean,\n"
        "  p_run jsonb, p_event jsonb)\n"
        "RETURNS TABLE (task_id bigint, run_id bigint, claim_count integer, event_id bigint)\n"
        "LANGUAGE plpgsql AS $fn$\n"
        "#variable_conflict use_column\n"
        "BEGIN\n"
        f"  RETURN QUERY{body.rstrip()};\n"
        "END\n"
        "$fn$"
    )


_CLAIM_CALL = (
    "SELECT task_id, run_id, claim_count, event_id "
    "FROM acthelm_claim(%s, %s::float8, %s::integer, %s, %s::jsonb, %s::jsonb)"
)


def claim_batch(
    *,
    worker_id: str,
    limit: int,
    lease_seconds: float | None = None,
    evaluation_only: bool = False,
) -> list[Claim]:
    """Claim up to `limit` due ready tasks for `worker_id` (highest priority first): ONE
    statement (`_CLAIM_SQL`), one commit, whatever `limit` is. Each run starts at the
    database's clock. With `evaluation_only` only evaluation tasks (`Task.is_evaluation`) are
    claimed: what a worker started by `acthelm_eval run` does, so that its wider fetch policy
    never reaches real work. A worker without it claims every task, evaluation tasks included
    (`acthelm_eval run --no-worker` relies on it)."""
    lease = settings.ACTHELM_LEASE_SECONDS if lease_seconds is None else lease_seconds
    params = [
        worker_id,
        float(lease),
        max(1, int(limit)),
        bool(evaluation_only),
        _defaults(AgentRun, _RUN_COLUMNS),
        _defaults(TaskEvent, _EVENT_COLUMNS),
    ]
    with transaction.atomic():
        rows = fastsql.execute(_CLAIM_CALL, params).fetchall()
    claims = []
    for task_id, run_id, claim_count, event_id in rows:
        log.info("task.claimed", extra={"task_id": task_id, "run_id": run_id, "worker": worker_id})
        claims.append(
            Claim(task_id=task_id, run_id=run_id, claim_count=claim_count, claim_event_id=event_id)
        )
    return claims


def claim_next(
    *, worker_id: str, lease_seconds: float | None = None, evaluation_only: bool = False
) -> Claim | None:
    """Claim the next due ready task for `worker_id`, or return None when there is none."""
    claims = claim_batch(
        worker_id=worker_id,
        limit=1,
        lease_seconds=lease_seconds,
        evaluation_only=evaluation_only,
    )
    return claims[0] if claims else None


# The four checks of holds_attempt() in the row the statement locks (docs/worker.md, "The
# fence"): the task is held; its claim counter is the run's (so the run is the newest claim's,
# hence the task's newest run); no person's fencing action was recorded after the run's claim
# event; the run is still started. It renews the lease on the way, and returns the task's status
# (a pause request) and the transaction's clock.
_HOLDS = f"""
  AND t.status IN {HELD_SQL}
  AND t.claim_count = r.claim_count
  AND r.status = 'started'
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
    `agents.engine.step_statement`): the `_HOLDS` checks on the task row it locks FOR NO KEY
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
