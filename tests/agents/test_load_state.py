"""A run's start (agents.engine.run.recorder.load_state): one statement, compiled once, for a task
that has no turns yet; the task it builds is the one the ORM builds (its connection, model and
conversation, JSON, arrays, decimals and datetimes through the fields' own converters), the usage
is the sum over every run, and a task or run that is gone is AttemptLost."""

from decimal import Decimal
from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from agents.engine.run.recorder import load_starts, load_state
from agents.engine.run.usage import task_usage
from agents.engine.store import claim_batch, claim_next
from agents.models import AgentRun
from core.exceptions import AttemptLost
from tasks.models import Task
from tests.factories import (
    AgentRunFactory,
    ConversationFactory,
    ModelFactory,
    TaskFactory,
    ToolCallFactory,
    TurnFactory,
)

pytestmark = pytest.mark.django_db(transaction=True)


class _Statements:
    def __init__(self) -> None:
        self.sql: list[str] = []

    def __call__(self, execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        self.sql.append(sql)
        return execute(sql, params, many, context)


def _values(obj: Any) -> dict[str, Any]:
    return {f.attname: getattr(obj, f.attname) for f in type(obj)._meta.concrete_fields}


def _claimed(**task: Any) -> tuple[Task, int]:
    model = ModelFactory()
    created = TaskFactory(
        connection=model.connection,
        model=model,
        limit_cost=Decimal("1.5000"),
        tool_policies={"read_file": {"mode": "auto"}},
        tags=["a", "b"],
        **task,
    )
    claim = claim_next(worker_id="w")
    assert claim is not None and claim.task_id == created.pk
    return created, claim.run_id


def test_a_fresh_task_is_loaded_in_one_statement_as_the_orm_builds_it():
    created, run_id = _claimed()
    seen = _Statements()
    with connection.execute_wrapper(seen):
        saved = load_state(created.pk, run_id)
    assert len(seen.sql) == 1, seen.sql
    orm = Task.objects.select_related("connection", "model").get(pk=created.pk)
    assert _values(saved.task) == _values(orm)
    assert _values(saved.task.connection) == _values(orm.connection)
    assert _values(saved.task.model) == _values(orm.model)
    assert saved.task.limit_cost == Decimal("1.5000")
    assert saved.task.tool_policies == {"read_file": {"mode": "auto"}}
    assert saved.task.tags == ["a", "b"]
    assert not hasattr(saved.task, "run_claim_count")  # what the statement read besides
    assert saved.conversation is None and saved.turns == [] and saved.next_index == 0
    run = AgentRun.objects.get(pk=run_id)
    assert saved.claim_count == run.claim_count == 1
    assert saved.connection_id == created.connection_id
    assert saved.usage == task_usage(created.pk)
    assert saved.memory_from_run is None and saved.approvals == {} and saved.run_again == set()


def test_a_task_with_turns_and_earlier_runs_loads_them_and_sums_every_run():
    created, run_id = _claimed()
    earlier = AgentRunFactory(
        task_id=created.pk,
        number=0,
        claim_count=0,
        status="finished",
        finished_at=timezone.now(),
        model_turns=3,
        input_tokens=1200,
        active_seconds=2.25,
        cost=Decimal("0.0125"),
    )
    conversation = ConversationFactory(task_id=created.pk, tool_pins={"x": {"sha": "1"}})
    first = TurnFactory(run=earlier, index=0)
    ToolCallFactory(turn=first, position=0)
    TurnFactory(run=earlier, index=1)
    seen = _Statements()
    with connection.execute_wrapper(seen):
        saved = load_state(created.pk, run_id)
    assert saved.conversation is not None and saved.conversation.pk == conversation.pk
    assert saved.conversation.tool_pins == {"x": {"sha": "1"}}
    assert [len(t.calls) for t in saved.turns] == [1, 0] and saved.next_index == 2
    assert saved.usage == task_usage(created.pk)
    assert saved.usage.cost == Decimal("0.0125") and saved.usage.active_seconds == 2.25
    assert saved.usage.model_turns == 3 and saved.usage.input_tokens == 1200
    assert len(seen.sql) > 1  # the turns (and their calls) are read because there are some


def test_a_run_that_is_gone_is_attempt_lost():
    created, run_id = _claimed()
    AgentRun.objects.filter(pk=run_id).delete()
    with pytest.raises(AttemptLost):
        load_state(created.pk, run_id)
    with pytest.raises(AttemptLost):
        load_state(created.pk + 1000, run_id)


def test_a_claims_fresh_tasks_load_in_one_statement_as_each_loads_alone():
    """`load_starts`, which the dispatcher calls with a claim: one statement for every task of
    the claim that starts afresh, each state the one `load_state` reads for it alone."""
    model = ModelFactory()
    tasks = [TaskFactory(connection=model.connection, model=model, tags=[str(i)]) for i in range(3)]
    claims = claim_batch(worker_id="w", limit=3)
    pairs = [(c.task_id, c.run_id) for c in claims]
    assert sorted(t for t, _ in pairs) == sorted(t.pk for t in tasks)
    seen = _Statements()
    with connection.execute_wrapper(seen):
        starts = load_starts(pairs)
    assert len(seen.sql) == 1, seen.sql
    assert sorted(starts) == sorted(t.pk for t in tasks)
    for task_id, run_id in pairs:
        alone, batch = load_state(task_id, run_id), starts[task_id]
        assert _values(batch.task) == _values(alone.task)
        assert _values(batch.task.connection) == _values(alone.task.connection)
        assert _values(batch.task.model) == _values(alone.task.model)
        assert not hasattr(batch.task, "run_claim_count")
        assert (batch.claim_count, batch.connection_id) == (alone.claim_count, alone.connection_id)
        assert (batch.usage, batch.memory_to_rank) == (alone.usage, alone.memory_to_rank)
        assert (batch.conversation, batch.turns, batch.next_index) == (None, [], 0)


def test_a_claims_task_with_turns_or_gone_is_left_to_its_run():
    """A resumed task's turns are read by its own run, not by the dispatcher for the whole
    claim; a task gone since the claim is left out, and its run's own load says AttemptLost."""
    fresh, fresh_run = _claimed()
    resumed, resumed_run = _claimed()
    gone, gone_run = _claimed()
    ConversationFactory(task_id=resumed.pk)
    TurnFactory(run=AgentRun.objects.get(pk=resumed_run), index=0)
    AgentRun.objects.filter(pk=gone_run).delete()
    starts = load_starts([(fresh.pk, fresh_run), (resumed.pk, resumed_run), (gone.pk, gone_run)])
    assert list(starts) == [fresh.pk]
    assert starts[fresh.pk].claim_count == 1
    assert load_starts([]) == {}
