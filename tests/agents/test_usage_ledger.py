"""The usage ledger: Usage adds field by field, a task's usage is one aggregate over its runs,
and the migration that moved MCP calls and cost onto the run fills them for existing runs."""

import importlib
from decimal import Decimal

import pytest
from django.db import connection
from django.utils import timezone

from agents.engine.run.usage import FIELDS, ZERO, Usage, headroom, task_usage
from agents.models import AgentRun
from agents.states import RunStatus
from tasks.limits import BEFORE_A_NETWORK_REQUEST, CUMULATIVE
from tests.factories import AgentRunFactory, TaskFactory, ToolCallFactory, TurnFactory


def ended(**fields) -> AgentRun:
    """A finished run (a task has at most one started run)."""
    return AgentRunFactory(status=RunStatus.FAILED, finished_at=timezone.now(), **fields)


def test_usage_adds_every_counter_and_zero_changes_nothing():
    a = Usage(1, 10, 2, 1.5, 3, 1, Decimal("0.25"))
    b = Usage(model_turns=2, input_tokens=5, active_seconds=0.5, mcp_calls=2, cost=Decimal("1"))
    total = a + b
    assert total == Usage(3, 15, 2, 2.0, 3, 3, Decimal("1.25"))
    assert total.tokens == 17
    assert a + ZERO == a == ZERO + a and Usage() == ZERO
    assert {f.name for f in FIELDS} <= {f.name for f in AgentRun._meta.get_fields()}
    with pytest.raises(TypeError):
        a + 1  # noqa: B018


@pytest.mark.parametrize("field", FIELDS, ids=lambda f: f.name)
def test_usage_adds_each_field_alone(field):
    """Usage.__add__ spells its fields out: a field it forgot would be dropped here."""
    one = Usage(**{field.name: field.type(1)})
    assert getattr(one + one, field.name) == field.type(2)
    assert getattr(one.plus_seconds(0.5), field.name) == field.type(1) + (
        0.5 if field.name == "active_seconds" else 0
    )


def test_usage_as_dict_keeps_tokens_as_one_number():
    data = Usage(input_tokens=7, output_tokens=3, cost=Decimal("0.5")).as_dict()
    assert data == {
        "model_turns": 0,
        "tokens": 10,
        "active_seconds": 0.0,
        "network_requests": 0,
        "mcp_calls": 0,
        "cost": "0.5",
    }


def test_task_usage_is_one_aggregate_over_the_runs(db):
    task = TaskFactory()
    ended(task=task, number=1, model_turns=2, input_tokens=100, output_tokens=10,
          active_seconds=1.5, network_requests=1, mcp_calls=2, cost=Decimal("0.1"))  # fmt: skip
    ended(task=task, number=2, model_turns=1, input_tokens=50, output_tokens=5,
          active_seconds=0.5, mcp_calls=1, cost=Decimal("0.02"))  # fmt: skip
    ended(number=1, model_turns=9, cost=Decimal("9"))  # another task's run
    statements: list[str] = []

    def counted(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted):
        usage = task_usage(task.pk)
    assert len(statements) == 1
    assert usage == Usage(3, 150, 15, 2.0, 1, 3, Decimal("0.12"))
    assert [type(getattr(usage, f.name)) for f in FIELDS] == [
        int,
        int,
        int,
        float,
        int,
        int,
        Decimal,
    ]
    assert task_usage(TaskFactory().pk) == ZERO


def test_headroom_is_what_the_first_limit_leaves(db):
    task = TaskFactory(limit_network_requests=8, limit_token_budget=100)
    assert headroom(BEFORE_A_NETWORK_REQUEST, task, Usage(network_requests=3)) == 5
    assert headroom(BEFORE_A_NETWORK_REQUEST, task, Usage(network_requests=9)) == 0
    assert headroom(CUMULATIVE, task, Usage(input_tokens=60), "tokens") == 40
    task.limit_cost = None
    assert headroom(CUMULATIVE, task, ZERO, "cost") is None


def test_the_migration_fills_mcp_calls_and_cost_of_existing_runs(db):
    migration = importlib.import_module("agents.migrations.0011_run_mcp_calls_and_cost")
    task = TaskFactory()
    first = ended(task=task, number=1)
    second = ended(task=task, number=2)
    turn = TurnFactory(task=task, run=first, index=1, cost=Decimal("0.3"))
    TurnFactory(task=task, run=first, index=2, cost=None)
    TurnFactory(task=task, run=second, index=3, cost=Decimal("0.05"))
    ToolCallFactory(task=task, run=first, turn=turn, position=0, tool="gh__search", run_count=2)
    ToolCallFactory(task=task, run=first, turn=turn, position=1, tool="read_file", run_count=1)
    ToolCallFactory(task=task, run=second, turn=turn, position=2, tool="gh__get", run_count=1)
    idle = AgentRunFactory(number=1)
    # As the rows were before the migration: the new columns at their defaults.
    AgentRun.objects.update(mcp_calls=0, cost=0)

    with connection.schema_editor() as editor:
        migration.fill_run_usage(None, editor)

    runs = {r.pk: (r.mcp_calls, r.cost) for r in AgentRun.objects.all()}
    assert runs[first.pk] == (2, Decimal("0.3"))
    assert runs[second.pk] == (1, Decimal("0.05"))
    assert runs[idle.pk] == (0, Decimal(0))
    assert task_usage(task.pk).mcp_calls == 3 and task_usage(task.pk).cost == Decimal("0.35")
