"""The claim (agents.engine.leases.claim_batch): a worker started by an evaluation claims evaluation
tasks only; a normal worker claims both (issue 21 item 7)."""

import pytest

from agents.engine.leases import claim_batch, claim_next
from tests.factories import TaskFactory

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
