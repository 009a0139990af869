"""The MCP-call and money limits: counted from the stored transcript, checked by pure
functions, and a task failed at one of them is retried only after it was raised."""

from decimal import Decimal

import pytest

from agents.actions.task import task_retry, task_set_limits
from agents.engine.run.usage import Usage, exhausted_limits, reached, remaining, task_usage
from core.exceptions import LimitNotRaised
from tasks.limits import BY_FIELD
from tests.factories import AgentRunFactory, TaskFactory, ToolCallFactory, TurnFactory


@pytest.mark.parametrize("used, is_reached", [(0, False), (19, False), (20, True), (21, True)])
def test_mcp_limit(used, is_reached):
    task = TaskFactory.build(limit_mcp_calls=20)
    message = reached(BY_FIELD["limit_mcp_calls"], task, Usage(mcp_calls=used))
    assert bool(message) is is_reached
    assert not is_reached or message == "the task used its 20 MCP tool calls"


@pytest.mark.parametrize(
    "limit, used, is_reached",
    [
        (None, Decimal("999"), False),
        (Decimal("1"), Decimal("0.99"), False),
        (Decimal("1"), Decimal("1"), True),
    ],
)
def test_cost_limit(limit, used, is_reached):
    task = TaskFactory.build(limit_cost=limit)
    assert bool(reached(BY_FIELD["limit_cost"], task, Usage(cost=used))) is is_reached


@pytest.fixture
def spent(db):
    task = TaskFactory(limit_mcp_calls=2, limit_cost=Decimal("0.5"))
    run = AgentRunFactory(task=task, number=1)
    turn = TurnFactory(task=task, run=run, index=1, cost=Decimal("0.3"))
    TurnFactory(task=task, run=run, index=2, cost=Decimal("0.2"))
    ToolCallFactory(task=task, run=run, turn=turn, position=0, tool="gh__search", run_count=2)
    ToolCallFactory(task=task, run=run, turn=turn, position=1, tool="read_file", run_count=1)
    return task


def test_usage_counts_mcp_starts_and_sums_turn_costs(spent):
    usage = task_usage(spent.pk)
    assert usage.mcp_calls == 2 and usage.cost == Decimal("0.5")
    assert {"limit_mcp", "limit_cost"} <= exhausted_limits(spent, usage)
    left = remaining(spent, usage)
    assert left["limit_mcp"] == 0 and left["limit_cost"] == "0.0000"


def test_no_money_budget_is_never_exhausted(spent):
    spent.limit_cost = None
    assert "limit_cost" not in exhausted_limits(spent)
    assert "limit_cost" not in remaining(spent, task_usage(spent.pk))


@pytest.mark.parametrize(
    "code, raised", [("limit_cost", {"limit_cost": "0.75"}), ("limit_mcp", {"limit_mcp_calls": 5})]
)
def test_retry_after_a_limit_asks_to_raise_it(spent, actor, code, raised):
    from tasks.models import Task
    from tasks.states import TaskStatus

    Task.objects.filter(pk=spent.pk).update(status=TaskStatus.FAILED, failure_code=code)
    with pytest.raises(LimitNotRaised, match=code):
        task_retry(actor=actor, task_id=spent.pk)
    task_set_limits(actor=actor, task_id=spent.pk, **raised)
    assert task_retry(actor=actor, task_id=spent.pk).status == TaskStatus.READY
