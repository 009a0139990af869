"""The recovery of runs whose worker died.

A worker that stops renewing its lease (killed, frozen, cut off from the database) leaves its
task held and its run started. `recover_stale` finds such tasks by the database's clock, ends the
run as `worker_lost` and requeues the task — or fails it, once it was lost more often than
ACTHELM_MAX_REQUEUES allows; that choice is `agents.engine.decide`'s, like every run's end.
The worker's maintenance thread and `acthelm_recover` call it.
"""

import logging

from django.conf import settings
from django.db import connection, transaction
from django.utils import timezone

from agents.engine.decide import Facts, OutcomeKind, decide
from agents.engine.outcomes import apply_plan, rules
from agents.models import AgentRun
from agents.states import RunStatus
from core.actors import Actor
from tasks.models import Task
from tasks.states import HELD, HELD_SQL

log = logging.getLogger("acthelm.worker")

_STALE_SQL = """
SELECT t.id FROM tasks_task t
WHERE t.status IN {held} {only}
  AND (t.lease_expires_at < now()
       OR EXISTS (SELECT 1 FROM agents_agentrun r
                  WHERE r.task_id = t.id AND r.status = 'started'
                    AND r.started_at < now() - make_interval(
                        secs => greatest(t.limit_runtime_seconds, %(timeout)s) + 300)))
ORDER BY t.id LIMIT 500
"""


def _stale_ids(task_id: int | None = None) -> list[int]:
    """Held tasks whose lease expired, or whose run started longer ago than it may last + 5
    minutes: the larger of the global run timeout and the task's own runtime limit. Judged by
    the database's clock, like the run's start, so the clocks of worker hosts do not matter."""
    params = {"timeout": settings.ACTHELM_RUN_TIMEOUT_SECONDS}
    only = ""
    if task_id is not None:
        only, params["task"] = "AND t.id = %(task)s", task_id
    with connection.cursor() as cursor:
        cursor.execute(_STALE_SQL.format(held=HELD_SQL, only=only), params)
        return [row[0] for row in cursor.fetchall()]


def recover_stale(*, actor: Actor | None = None) -> list[int]:
    """Fail runs whose lease expired or that overran the run timeout + 5 minutes; requeue their
    task once (the next run resumes from the checkpoint); a second loss fails it (worker_lost)."""
    actor = actor or Actor.system("recover_stale")
    recovered = []
    candidates = _stale_ids()
    for task_id in candidates:
        with transaction.atomic():
            task = Task.objects.select_for_update(skip_locked=True).filter(pk=task_id).first()
            if task is None or task.status not in HELD:
                continue
            if not _stale_ids(task_id):
                continue  # renewed meanwhile
            run = AgentRun.objects.filter(task=task, status=RunStatus.STARTED).first()
            facts = Facts(
                kind=OutcomeKind.LOST,
                task_status=task.status,
                rules=rules(),
                now=timezone.now(),
                failed_attempts=task.failed_attempts,
                lost_count=task.lost_count,
                run_id=run.pk if run else None,
                lost_worker=run.worker_id if run else "",
                lease_owner=task.lease_owner,
            )
            apply_plan(task, run, actor=actor, plan=decide(facts), now=facts.now)
            recovered.append(task_id)
            log.warning(
                "run.recovered", extra={"task_id": task_id, "run_id": run.pk if run else None}
            )
    return recovered
