"""Cost in money through the real loop: each stored model turn carries its cost (the model's
prices, cached input at its own price, or the provider's reported cost), the checkpoint holds
what remains of the money budget, and a task over its budget fails limit_cost before the next
model turn; retry asks to raise the budget."""

from decimal import Decimal

import pytest

from agents.actions.task import task_retry
from agents.engine.run.usage import task_usage
from agents.engine.runtime.worker import Worker
from agents.models import AgentRun, Turn
from core.exceptions import LimitNotRaised
from tasks.models import Task
from tasks.states import TaskStatus
from tests.agents.scripted import calls_of, fast_settings, status_of, tool_task
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def loop_settings(settings):
    return fast_settings(settings)


def work() -> None:
    Worker(worker_id="costs", burst=True).run()


def priced(task, *, cached="0.5"):
    model = task.model
    model.price_input_per_mtok = Decimal("1")
    model.price_output_per_mtok = Decimal("2")
    model.price_cached_input_per_mtok = Decimal(cached)
    model.save()


def test_each_stored_turn_has_its_cost_priced_or_reported(loop_settings):
    script = [
        reply_tool_calls(
            [("list_files", {}, "c1")],
            usage={
                "prompt_tokens": 1000,
                "completion_tokens": 100,
                "prompt_tokens_details": {"cached_tokens": 400},
            },
        ),
        # OpenRouter reports what the turn cost: that is stored, not the tokens x prices.
        reply_text("Done.", usage={"prompt_tokens": 10, "completion_tokens": 5, "cost": 0.0123}),
    ]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["list_files"], limits={"limit_cost": "1"})
        priced(task)
        work()
    assert status_of(task) == TaskStatus.REVIEW
    first, second = Turn.objects.filter(task=task, role="assistant").order_by("index")
    # 600 plain input x 1 + 400 cached x 0.5 + 100 output x 2, per million tokens.
    assert first.cost == Decimal("0.001")
    assert (first.input_tokens, first.cached_input_tokens, first.output_tokens) == (1000, 400, 100)
    assert second.cost == Decimal("0.0123")
    assert task_usage(task.pk).cost == Decimal("0.0133")
    run = AgentRun.objects.get(task=task)
    assert run.checkpoint["usage"]["cost"] == "0.01330000"
    assert run.checkpoint["remaining"]["limit_cost"] == "0.9867"
    assert run.checkpoint["remaining"]["limit_mcp"] == 20
    assert [c.status for c in calls_of(task)] == ["succeeded"]


def test_a_turn_without_prices_or_a_reported_cost_has_no_cost(loop_settings):
    with ScriptedModelServer([reply_text("Done.")]) as server:
        task = tool_task(server, ["list_files"])
        task.connection.cost_tier = "paid"  # unknown is not free
        task.connection.save(update_fields=["cost_tier"])
        work()
    [turn] = Turn.objects.filter(task=task, role="assistant")
    assert turn.cost is None
    assert "limit_cost" not in AgentRun.objects.get(task=task).checkpoint["remaining"]


def test_an_unpriced_turn_on_a_zero_cost_connection_costs_nothing(loop_settings):
    with ScriptedModelServer([reply_text("Done.")]) as server:
        task = tool_task(server, ["list_files"])  # scripted_model: a zero-cost connection
        work()
    [turn] = Turn.objects.filter(task=task, role="assistant")
    assert turn.cost == Decimal(0) and task_usage(task.pk).cost == Decimal(0)


def test_over_its_money_budget_the_task_fails_limit_cost_and_retry_asks_to_raise_it(
    loop_settings, actor
):
    script = [
        reply_tool_calls([("list_files", {}, "c1")], usage={"cost": 0.02}),
        reply_text("Done.", usage={"cost": 0.001}),
    ]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["list_files"], limits={"limit_cost": "0.01"})
        work()
        assert len(server.completion_requests) == 1  # no model turn after the budget was spent
        task = Task.objects.get(pk=task.pk)
        assert (task.status, task.failure_code) == (TaskStatus.FAILED, "limit_cost")
        assert [c.status for c in calls_of(task)] == ["succeeded"]  # the round finished first
        run = AgentRun.objects.get(task=task)
        assert run.error_code == "limit_cost"
        assert run.checkpoint["remaining"]["limit_cost"] == "0.0000"

        with pytest.raises(LimitNotRaised):
            task_retry(actor=actor, task_id=task.pk)
        with pytest.raises(LimitNotRaised):  # raised, but not above what was spent
            task_retry(actor=actor, task_id=task.pk, limits={"limit_cost": "0.015"})
        task_retry(actor=actor, task_id=task.pk, limits={"limit_cost": "0.5"})
        work()
        assert len(server.completion_requests) == 2
    assert status_of(task) == TaskStatus.REVIEW
    assert task_usage(task.pk).cost == Decimal("0.021")
