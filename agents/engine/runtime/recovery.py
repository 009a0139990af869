"""The recovery of runs whose worker died.

A worker that stops renewing its lease (killed, frozen, cut off from the database) leaves its
task held and its run started. `recover_stale` finds such tasks by the database's clock (the
store's `stale_task_ids`), ends the run as `worker_lost` and requeues the task — or fails it, once
it was lost more often than ACTHELM_MAX_REQUEUES allows; that choice is
`agents.engine.verdict.decide`'s, like every run's end. The worker's maintenance thread and
`acthelm_recover` call it.
"""

import logging

from django.db import transaction
from django.utils import timezone

from agents.engine.store import stale_task_ids
from agents.engine.verdict.decide import Facts, OutcomeKind, decide
from agents.engine.verdict.outcomes import apply_plan, rules
from agents.models import AgentRun
from agents.states import RunStatus
from core.actors import Actor
from tasks.models import Task
from tasks.states import HELD

log = logging.getLogger("acthelm.worker")


def recover_stale(*, actor: Actor | None = None) -> list[int]:
    """Fail runs whose lease expired or that overran the run timeout + 5 minutes; requeue their
    task once (the next run resumes from the checkpoint); a second loss fails it (worker_lost)."""
    actor = actor or Actor.system("recover_stale")
    recovered = []
    candidates = stale_task_ids()
    for task_id in candidates:
        with transaction.atomic():
            task = Task.objects.select_for_update(skip_locked=True).filter(pk=task_id).first()
            if task is None or task.status not in HELD:
                continue
            if not stale_task_ids(task_id):
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
