"""The claim (agents.engine.store.claim_batch): a worker started by an evaluation claims evaluation
tasks only; a normal worker claims both (issue 21 item 7). The statements that find held tasks
hold exactly the states of `tasks.states.HELD`."""

import importlib
import pkgutil
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

import agents.migrations
from agents.engine.runtime.worker import Worker
from agents.engine.store import claim as claim_module
from agents.engine.store import (
    claim_batch,
    claim_next,
    fence,
    holds_now,
    renew_leases,
    stale_task_ids,
)
from agents.engine.store.functions import claim_function_sql
from agents.models import AgentRun
from agents.states import RunStatus
from core.exceptions import AttemptLost
from tasks.models import TaskEvent
from tasks.states import HELD, HELD_SQL, TaskStatus, sql_list
from tests.factories import AgentRunFactory, TaskFactory

pytestmark = pytest.mark.django_db


def test_an_evaluation_only_worker_never_claims_real_work():
    real = TaskFactory(priority=10)
    evaluation = TaskFactory(is_evaluation=True)
    claims = claim_batch(worker_id="eval-1-w1", limit=10, evaluation_only=True)
    assert [c.task_id for c in claims] == [evaluation.pk]
    assert claim_next(worker_id="eval-1-w1", evaluation_only=True) is None
    real.refresh_from_db()
    assert real.status == "ready" and real.claim_count == 0


def test_a_normal_worker_claims_evaluation_tasks_too():
    real = TaskFactory(priority=10)
    evaluation = TaskFactory(is_evaluation=True)
    claims = claim_batch(worker_id="w", limit=10)
    assert [c.task_id for c in claims] == [real.pk, evaluation.pk]


@pytest.mark.parametrize("status", TaskStatus.values)
def test_the_statements_hold_a_task_exactly_in_the_held_states(status):
    """The fence, the heartbeat's renewal, the read before an effect, recovery and the worker's
    wake-up take the held states from `HELD`: a task in any other state is held by none."""
    held = status in HELD
    expired = timezone.now() - timedelta(seconds=5)
    task = TaskFactory(status=status, claim_count=1, lease_owner="w", lease_expires_at=expired)
    run = AgentRunFactory(task=task, claim_count=1, status=RunStatus.STARTED)
    assert sql_list(HELD) == HELD_SQL and sql_list(reversed(sorted(HELD))) == HELD_SQL
    assert (stale_task_ids(task.pk) == [task.pk]) is held  # before the fence renews the lease
    assert (Worker(worker_id="w")._seconds_to_earliest_expiry() is not None) is held
    assert (renew_leases([(task.pk, run.pk)]) == {task.pk: status}) is held
    if held:
        assert holds_now(task_id=task.pk, run_id=run.pk) == status
        assert fence(run.pk, task.pk, full=True).status == status
    else:
        with pytest.raises(AttemptLost):
            holds_now(task_id=task.pk, run_id=run.pk)
        with pytest.raises(AttemptLost), transaction.atomic():
            fence(run.pk, task.pk)


def test_a_state_list_is_made_of_states_only():
    with pytest.raises(ValueError, match="not a set of task states"):
        sql_list(["in_progress", "x') OR ('1"])
    with pytest.raises(ValueError):
        sql_list([])


def test_the_claim_functions_migration_holds_the_function_the_models_make():
    """Migration agents 0021 applies `claim_function_sql()`'s text (frozen in
    agents/migrations/sql/): a change of the run's or the event's columns needs a newer migration
    with the new text (tests/agents/test_store_functions.py checks the frozen files)."""
    found = None
    for info in sorted(pkgutil.iter_modules(agents.migrations.__path__), key=lambda m: m.name):
        sql = getattr(importlib.import_module(f"agents.migrations.{info.name}"), "SQL", None)
        if isinstance(sql, str) and "FUNCTION acthelm_claim(" in sql:
            found = sql
    assert found == claim_function_sql(), (
        "the claim function changed with the models: add a migration with "
        "store.functions.claim_function_sql()'s text (as 0021_claim_function applies it)"
    )
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'acthelm_claim'")
        assert [row[0] for row in cursor.fetchall()] == [found.split("$fn$")[1]]


def test_a_claimed_run_and_its_event_are_the_rows_the_models_would_write():
    """The columns the claim does not give get the model's defaults (passed as JSON)."""
    task = TaskFactory(claim_count=1)  # claimed once before, by the earlier run
    earlier = AgentRunFactory(
        task=task, number=3, claim_count=1, status=RunStatus.FAILED, finished_at=timezone.now()
    )
    (claim,) = claim_batch(worker_id="w-9", limit=5)
    run = AgentRun.objects.get(pk=claim.run_id)
    assert (run.task_id, run.number, run.claim_count, run.status, run.worker_id) == (
        task.pk,
        4,
        2,
        RunStatus.STARTED,
        "w-9",
    )
    assert run.claim_event_id == claim.claim_event_id
    for field in AgentRun._meta.concrete_fields:
        if field.column not in claim_module.RUN_COLUMNS:
            assert getattr(run, field.attname) == field.get_default(), field.name
    event = TaskEvent.objects.get(pk=claim.claim_event_id)
    assert (event.kind, event.actor_label, event.from_status, event.to_status) == (
        "claimed",
        "w-9",
        "ready",
        "in_progress",
    )
    assert event.data == {
        "run_id": run.pk,
        "newest_run_id_before": earlier.pk,
        "claim_count": 2,
    }
    task.refresh_from_db()
    assert (task.status, task.lease_owner, task.claim_count) == ("in_progress", "w-9", 2)
