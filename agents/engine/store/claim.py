"""The claim: how a run takes a task from the ledger. The one status change that is not
lock-then-write (`tasks.transitions`): a single conditional UPDATE whose WHERE clause decides the
race, inserting the run and the claim event in the same statement — the function `acthelm_claim`
(sql/acthelm_claim.sql, rendered by `functions.claim_function_sql`), whose plan PL/pgSQL keeps per
session, with no prepared statement on the client, so through any pooler."""

import json
import logging
from dataclasses import dataclass

from django.conf import settings
from django.core.serializers.json import DjangoJSONEncoder
from django.db import models, transaction

from agents.engine.store.literal import literal
from agents.models import AgentRun
from agents.states import RunStatus
from core import fastsql
from core.actors import ActorKind
from tasks.models import TaskEvent
from tasks.states import EventKind, TaskStatus

log = logging.getLogger("acthelm.tasks")


@dataclass(frozen=True)
class Claim:
    task_id: int
    run_id: int
    claim_count: int
    claim_event_id: int | None = None


#: The columns the claim gives the run and the claim event (SQL over the claimed task `c`, its
#: previous run `p` and the drawn ids); every other column is its default (`defaults`).
RUN_COLUMNS = {
    "id": "ids.run_id",
    "task_id": "c.id",
    "number": "coalesce(p.number, 0) + 1",
    "claim_count": "c.claim_count",
    "claim_event_id": "ids.event_id",
    "status": literal(RunStatus.STARTED),
    "worker_id": "p_worker",
    "started_at": "now()",
    "connection_id": "c.connection_id",
    "model_id": "c.model_id",
}
EVENT_COLUMNS = {
    "id": "ids.event_id",
    "task_id": "c.id",
    "run_id": "ids.run_id",
    "kind": literal(EventKind.CLAIMED),
    "actor_kind": literal(ActorKind.WORKER),
    "actor_user_id": "NULL",
    "actor_label": "p_worker",
    "from_status": literal(TaskStatus.READY),
    "to_status": literal(TaskStatus.IN_PROGRESS),
    "data": "jsonb_build_object('run_id', ids.run_id, 'newest_run_id_before', p.id, "
    "'claim_count', c.claim_count)",
    "created_at": "now()",
}


def defaults(model: type[models.Model], given: dict[str, str]) -> str:
    """The model's defaults for the columns the claim does not give, as the JSON object the
    function turns into a row of the table (`jsonb_populate_record`): a column added later needs
    no new function, only a default."""
    values = {}
    for field in model._meta.concrete_fields:
        if field.column not in given:
            values[field.column] = field.get_default()
    return json.dumps(values, cls=DjangoJSONEncoder)


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
    statement (`acthelm_claim`), one commit, whatever `limit` is. Each run starts at the
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
        defaults(AgentRun, RUN_COLUMNS),
        defaults(TaskEvent, EVENT_COLUMNS),
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
