"""What the database cannot store never cycles a task (issue 21, item 1).

A model answer or tool arguments with U+0000, a provider reporting more tokens than a column holds,
a cost outside its column: made storable before the step is written
(agents/engine/store/storable.py). What
the database refuses anyway fails the attempt (`storage_rejected`), which counts; hand-backs are
capped. Real worker, real PostgreSQL, the scripted model server on loopback."""

from decimal import Decimal

import pytest
from django.db import connection

from agents.engine.store import claim_next
from agents.engine.store.storable import COST_MAX, INT_MAX, NUL_ESCAPE, count, json, money, text
from agents.engine.verdict.outcomes import Outcome, apply_outcome
from agents.models import AgentRun, ToolCall, Turn
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.agents.conftest import run_burst
from tests.agents.scripted import fast_settings, tool_task
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def loop_settings(settings):
    fast_settings(settings)
    settings.ACTHELM_RETRY_DELAYS = [0, 0, 0]
    return settings


def test_the_storable_helpers():
    assert text("a\x00b") == f"a{NUL_ESCAPE}b"
    assert text("lone \ud800 surrogate") == "lone \ufffd surrogate"
    assert json({"k\x00": ["v\x00", float("nan"), float("-inf"), 1.5]}) == {
        f"k{NUL_ESCAPE}": [f"v{NUL_ESCAPE}", "NaN", "-Infinity", 1.5]
    }
    assert count(2**40) == (INT_MAX, True)
    assert count(-3) == (0, True)
    assert count(12) == (12, False)
    assert money(Decimal("1e300")) == (None, True)
    assert money("NaN") == (None, True)
    assert money(Decimal("-1")) == (None, True)
    assert money(COST_MAX) == (COST_MAX, False)


def test_a_nul_in_the_answer_is_stored_escaped_with_one_model_request(loop_settings):
    poisoned = "the answer\x00 with a NUL"
    with ScriptedModelServer([reply_text(poisoned)] * 5) as server:
        task = tool_task(server, [])
        run_burst()
        assert len(server.requests) == 1
    task.refresh_from_db()
    assert task.status == TaskStatus.REVIEW
    run = AgentRun.objects.get(task=task)
    assert run.answer == f"the answer{NUL_ESCAPE} with a NUL"
    event = TaskEvent.objects.get(task=task, kind=EventKind.MODEL_TURN)
    assert event.data["adjusted"] == ["text"]


def test_a_nul_in_tool_arguments_is_stored_escaped(loop_settings):
    script = [
        reply_tool_calls([("list_files", {"pattern": "*\x00.txt"})]),
        reply_text("listed"),
    ]
    with ScriptedModelServer(script * 3) as server:
        task = tool_task(server, ["list_files"])
        run_burst()
        assert len(server.requests) == 2
    task.refresh_from_db()
    assert task.status == TaskStatus.REVIEW
    call = ToolCall.objects.get(task=task)
    assert NUL_ESCAPE in call.arguments_raw
    assert "\x00" not in str(call.arguments)


def test_impossible_token_counts_and_costs_are_clamped(loop_settings):
    usage = {"prompt_tokens": 2**40, "completion_tokens": 5, "cost": 1e300}
    with ScriptedModelServer([reply_text("counted", usage=usage)] * 3) as server:
        task = tool_task(server, [])
        # A paid connection: on a zero-cost one an unpriced turn costs $0 (issue 24).
        task.connection.cost_tier = "paid"
        task.connection.save(update_fields=["cost_tier"])
        run_burst()
        assert len(server.requests) == 1
    task.refresh_from_db()
    turn = Turn.objects.get(task=task, role="assistant")
    assert turn.input_tokens == INT_MAX
    assert turn.cost is None  # an amount the column cannot hold is unknown, not stored
    # The clamped count still counts: the token budget is spent, the limit ends the task
    # without another model request.
    assert (task.status, task.failure_code) == (TaskStatus.FAILED, "limit_tokens")


def test_what_the_database_refuses_fails_the_attempt_and_the_attempts_end(loop_settings):
    """A refusal the engine did not foresee (here a real PostgreSQL trigger raising a data
    exception) counts as an attempt: the limit of attempts ends the task; every run keeps what
    the model said, readable."""
    with connection.cursor() as cursor:
        cursor.execute(
            """
            CREATE FUNCTION refuse_poison() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF NEW.content LIKE '%%POISON%%' THEN
                RAISE EXCEPTION 'refused' USING ERRCODE = 'data_exception';
              END IF;
              RETURN NEW;
            END $$;
            CREATE TRIGGER refuse_poison BEFORE INSERT ON agents_turn
              FOR EACH ROW EXECUTE FUNCTION refuse_poison();
            """
        )
    try:
        with ScriptedModelServer([reply_text("POISON answer")] * 20) as server:
            task = tool_task(server, [])
            run_burst()
            requests = len(server.requests)
    finally:
        with connection.cursor() as cursor:
            cursor.execute("DROP TRIGGER refuse_poison ON agents_turn")
            cursor.execute("DROP FUNCTION refuse_poison()")
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED
    assert task.failure_code == "error_loop"
    runs = list(AgentRun.objects.filter(task=task).order_by("number"))
    assert requests == len(runs) == loop_settings.ACTHELM_MAX_ATTEMPTS
    assert {r.error_code for r in runs} == {"storage_rejected"}
    assert "POISON answer" in runs[0].error_message


def test_hand_backs_in_a_row_are_capped(loop_settings):
    loop_settings.ACTHELM_MAX_HANDBACKS = 3
    with ScriptedModelServer([]) as server:
        task = tool_task(server, [])
    statuses = []
    for _ in range(4):
        claim = claim_next(worker_id="w")
        assert claim is not None and claim.task_id == task.pk
        statuses.append(
            apply_outcome(
                task_id=claim.task_id,
                run_id=claim.run_id,
                worker_id="w",
                outcome=Outcome(Outcome.HANDED_BACK, message="database connection lost"),
            )
        )
    assert statuses == [TaskStatus.READY] * 3 + [TaskStatus.FAILED]
    assert Task.objects.get(pk=task.pk).failure_code == "handback_loop"
