"""The claim (agents.engine.leases.claim_batch): a worker started by an evaluation claims evaluation
tasks only; a normal worker claims both (issue 21 item 7). The statements that find held tasks
hold exactly the states of `tasks.states.HELD`."""

from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from agents.engine.leases import claim_batch, claim_next, fence, holds_now, renew_leases
from agents.engine.recovery import _stale_ids
from agents.engine.worker import Worker
from agents.states import RunStatus
from core.exceptions import AttemptLost
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
    assert (_stale_ids(task.pk) == [task.pk]) is held  # before the fence renews the lease
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
