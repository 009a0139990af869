"""The agent loop over real HTTP: scripted OpenAI- and Anthropic-compatible servers on loopback."""

import json
import threading

import pytest
from django.db import connection

from agents.actions.task import task_cancel, task_pause, task_resume, task_retry_now
from agents.engine.runtime import worker as worker_module
from agents.engine.runtime.worker import Worker
from agents.engine.store import claim_next
from agents.models import AgentRun, CompactionDecision, Conversation, ToolCall, Turn
from core.actors import Actor
from memory.models import MemoryEntry, MemorySelection
from tasks.models import Task
from tasks.states import TaskStatus
from tasks.workspace import add_input_file
from tests.agents.conftest import run_burst
from tests.fakes.model_server import hang, reply_error, reply_raw, reply_text, reply_tool_calls

pytestmark = pytest.mark.django_db(transaction=True)

PLAN = ("update_plan", {"steps": [{"step": "Read the notes"}, {"step": "Write the report"}]})


def status_of(task):
    return Task.objects.values_list("status", flat=True).get(pk=task.pk)


def tool_messages(request) -> list[dict]:
    return [m for m in request.json["messages"] if m["role"] == "tool"]


def test_plan_first_then_tools_then_a_final_answer(
    model_server, http_model, loop_task, fast_worker_settings
):
    server = model_server(
        [
            reply_tool_calls([("read_file", {"path": "notes.txt"})]),
            reply_tool_calls([PLAN]),
            reply_tool_calls([("read_file", {"path": "notes.txt"})]),
            reply_text("The notes say hello."),
        ]
    )
    task = loop_task(http_model(server))
    add_input_file(task.pk, name="notes.txt", data="hello from the notes")
    run_burst()
    assert status_of(task) == TaskStatus.REVIEW
    calls = list(ToolCall.objects.filter(task=task).order_by("turn__index"))
    assert [(c.tool, c.status, c.error_code) for c in calls] == [
        ("read_file", "refused", "plan_required"),
        ("update_plan", "succeeded", ""),
        ("read_file", "succeeded", ""),
    ]
    requests = server.completion_requests
    assert "plan_required" in tool_messages(requests[1])[0]["content"]
    assert "hello from the notes" in tool_messages(requests[3])[-1]["content"]
    assert Conversation.objects.get(task=task).plan["steps"][0]["step"] == "Read the notes"
    assert AgentRun.objects.get(task=task).answer == "The notes say hello."


def test_the_verdict_reads_calls_and_artifacts_unless_the_task_made_no_call(
    model_server, http_model, loop_task, fast_worker_settings, monkeypatch
):
    told: list[bool] = []
    real = worker_module.supervise

    def spy(*args, no_calls=False, **kwargs):
        told.append(no_calls)
        return real(*args, no_calls=no_calls, **kwargs)

    monkeypatch.setattr(worker_module, "supervise", spy)
    loop_task(http_model(model_server([reply_text("Done.")])))
    run_burst()
    calls = model_server(
        [reply_tool_calls([("read_file", {"path": "notes.txt"})]), reply_text("ok")]
    )
    task = loop_task(http_model(calls))
    add_input_file(task.pk, name="notes.txt", data="hello")
    run_burst()
    # A retried task's run starts from the earlier run's turns: it does not know them all.
    retried = loop_task(
        http_model(model_server([reply_text("Done."), reply_text("Done.")])),
        instruction="Write it to summary.md.",
    )
    run_burst()  # the default check rejects the answer: no summary.md
    task_retry_now(actor=Actor.system("test"), task_id=retried.pk)
    run_burst()
    assert told == [True, False, True, False]
    assert AgentRun.objects.filter(task=retried).count() == 2


def test_the_system_prompt_is_built_once_and_every_request_sends_the_same_prefix(
    model_server, http_model, loop_task, fast_worker_settings
):
    MemoryEntry.objects.create(title="House style", body="Reports use short sentences.")
    MemoryEntry.objects.create(title="Unrelated", body="Parking is behind the building.")
    server = model_server([reply_tool_calls([PLAN]), reply_text("done")])
    task = loop_task(http_model(server), instruction="Write a short report in house style.")
    run_burst()
    conversation = Conversation.objects.get(task=task)
    requests = server.completion_requests
    assert len(requests) == 2
    firsts = [r.json["messages"][0] for r in requests]
    assert all(m == {"role": "system", "content": conversation.system_prompt} for m in firsts)
    assert "Reports use short sentences." in conversation.system_prompt
    selected = list(MemorySelection.objects.filter(run__task=task).order_by("position"))
    assert selected[0].title == "House style"  # ranked by full-text match with the instruction


@pytest.mark.parametrize("active", [False, True])
def test_a_tasks_start_ranks_the_memory_only_when_an_entry_is_active(
    model_server, http_model, loop_task, fast_worker_settings, active
):
    """The load reads whether any memory entry is active: with none, the first run's prompt has
    no memory and the start asks for no ranking (one statement less at every start)."""
    MemoryEntry.objects.create(
        title="House style", body="Reports use short sentences.", active=active
    )
    server = model_server([reply_text("done")])
    task = loop_task(http_model(server), instruction="Write a short report in house style.")
    claim = claim_next(worker_id="w")
    assert claim is not None and claim.task_id == task.pk
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        Worker(worker_id="w").process(claim)
    assert status_of(task) == TaskStatus.REVIEW
    assert any("ts_rank" in sql for sql in seen) is active
    assert MemorySelection.objects.filter(run__task=task).exists() is active
    prompt = Conversation.objects.get(task=task).system_prompt
    assert ("Reports use short sentences." in prompt) is active


def test_tools_not_on_the_list_are_never_offered_and_refused(
    model_server, http_model, loop_task, fast_worker_settings
):
    server = model_server(
        [
            reply_tool_calls([PLAN]),
            reply_tool_calls([("fetch_url", {"url": "https://example.com"})]),
            reply_text("ok"),
        ]
    )
    task = loop_task(http_model(server), tools=["update_plan", "read_file"])
    run_burst()
    offered = {t["function"]["name"] for r in server.completion_requests for t in r.json["tools"]}
    assert offered == {"update_plan", "read_file"}
    call = ToolCall.objects.get(task=task, tool="fetch_url")
    assert (call.status, call.error_code, call.run_count) == ("refused", "tool_not_allowed", 0)


def test_schema_invalid_arguments_are_explained_and_the_loop_goes_on(
    model_server, http_model, loop_task, fast_worker_settings
):
    server = model_server(
        [
            reply_tool_calls([PLAN]),
            reply_tool_calls([("read_file", {"path": 42, "colour": "blue"})]),
            reply_tool_calls([("read_file", "{not json")]),
            reply_text("gave up politely"),
        ]
    )
    task = loop_task(http_model(server))
    run_burst()
    assert status_of(task) == TaskStatus.REVIEW
    bad, garbled = ToolCall.objects.filter(task=task, tool="read_file").order_by("turn__index")
    assert bad.error_code == garbled.error_code == "invalid_arguments"
    assert "colour" in bad.result_for_model and "path" in bad.result_for_model
    assert "invalid_arguments" in tool_messages(server.completion_requests[2])[-1]["content"]


def test_a_truncated_turn_with_tool_calls_runs_nothing(
    model_server, http_model, loop_task, fast_worker_settings
):
    server = model_server(
        [
            reply_tool_calls([PLAN]),
            reply_tool_calls(
                [("write_artifact", {"name": "r.md", "content": "half"})], finish="length"
            ),
            reply_text("short answer"),
        ]
    )
    task = loop_task(http_model(server))
    run_burst()
    assert status_of(task) == TaskStatus.REVIEW
    turn = Turn.objects.get(task=task, discarded=True)
    assert turn.stop_reason == "length"
    call = ToolCall.objects.get(turn=turn)
    assert call.status == "refused" and call.run_count == 0
    assert not task.artifacts.exists()
    # The discarded turn is never sent again.
    last = server.completion_requests[-1].json["messages"]
    assert not any(m.get("tool_calls") and "write_artifact" in json.dumps(m) for m in last)


def test_declined_turns_are_discarded_too(
    model_server, http_model, loop_task, fast_worker_settings
):
    server = model_server([reply_text("", refusal="I can't help with that"), reply_text("fine")])
    task = loop_task(http_model(server), tools=[])
    run_burst()
    assert Turn.objects.filter(task=task, discarded=True, stop_reason="refusal").count() == 1
    assert AgentRun.objects.get(task=task).answer == "fine"


@pytest.mark.parametrize(
    ("limits", "script", "code"),
    [
        ({"limit_turns": 2}, [reply_tool_calls([PLAN])] * 5, "limit_steps"),
        (
            {"limit_token_budget": 40},
            [reply_tool_calls([PLAN], usage={"prompt_tokens": 30, "completion_tokens": 20})] * 5,
            "limit_tokens",
        ),
    ],
)
def test_reaching_a_limit_fails_the_task_keeps_the_checkpoint_and_retry_needs_a_raise(
    model_server, http_model, loop_task, fast_worker_settings, person, limits, script, code
):
    from agents.actions.task import task_retry, task_set_limits
    from core.exceptions import LimitNotRaised

    server = model_server(script)
    task = loop_task(http_model(server), limits=limits)
    run_burst()
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED and task.failure_code == code
    assert AgentRun.objects.get(task=task).checkpoint["remaining"][code] == 0
    actor = Actor.person(person)
    with pytest.raises(LimitNotRaised):
        task_retry(actor=actor, task_id=task.pk)
    field = next(iter(limits))
    task_set_limits(actor=actor, task_id=task.pk, **{field: limits[field] * 100})
    assert task_retry(actor=actor, task_id=task.pk).status == TaskStatus.READY


def test_runtime_limit(model_server, http_model, loop_task, fast_worker_settings):
    server = model_server([reply_tool_calls([PLAN], delay=1.2)] * 4)
    task = loop_task(http_model(server), limits={"limit_runtime_seconds": 1})
    run_burst()
    task.refresh_from_db()
    assert task.failure_code == "limit_runtime"


def test_output_per_turn_is_max_tokens_and_long_tool_output_is_cut_for_the_model(
    model_server, http_model, loop_task, fast_worker_settings
):
    server = model_server(
        [
            reply_tool_calls([PLAN]),
            reply_tool_calls([("read_file", {"path": "big.txt"})]),
            reply_text("ok"),
        ]
    )
    task = loop_task(
        http_model(server), limits={"limit_output_tokens": 321, "limit_tool_output_chars": 100}
    )
    add_input_file(task.pk, name="big.txt", data="x" * 5000)
    run_burst()
    assert {r.json["max_tokens"] for r in server.completion_requests} == {321}
    call = ToolCall.objects.get(task=task, tool="read_file")
    assert len(call.result) > 5000 and "Cut at 100 characters" in call.result_for_model
    assert len(tool_messages(server.completion_requests[2])[-1]["content"]) < 300


def test_compaction_replaces_the_oldest_results_and_the_decision_sticks(
    model_server, http_model, loop_task, fast_worker_settings
):
    reads = [reply_tool_calls([("read_file", {"path": f"f{i}.txt"})]) for i in range(4)]
    server = model_server([reply_tool_calls([PLAN]), *reads, reply_text("summary")])
    task = loop_task(http_model(server, context_window=3000), limits={"limit_output_tokens": 500})
    for i in range(4):
        add_input_file(task.pk, name=f"f{i}.txt", data=f"file {i} " * 500)
    run_burst()
    assert status_of(task) == TaskStatus.REVIEW
    decision = CompactionDecision.objects.filter(task=task).order_by("id").first()
    assert decision is not None
    assert decision.estimated_tokens_after < decision.estimated_tokens_before
    compacted = set(ToolCall.objects.filter(task=task, compacted=True).values_list("id", flat=True))
    assert compacted
    requests = server.completion_requests
    first_placeholder = next(
        i
        for i, r in enumerate(requests)
        if any("placeholder" in m["content"] for m in tool_messages(r))
    )
    # Once a result is replaced, every later request sends the same shortened history, and the
    # same system prompt.
    for later in requests[first_placeholder:]:
        assert "placeholder" in tool_messages(later)[1]["content"]
    assert len({json.dumps(r.json["messages"][0]) for r in requests}) == 1
    # The full results stay in the database.
    assert all(len(c.result) > 1000 for c in ToolCall.objects.filter(pk__in=compacted))


def test_anthropic_flavor_runs_the_same_loop(
    model_server, http_model, loop_task, fast_worker_settings
):
    server = model_server(
        [reply_tool_calls([PLAN]), reply_tool_calls([("list_files", {})]), reply_text("3 files")],
        flavor="anthropic",
    )
    task = loop_task(http_model(server, flavor="anthropic"))
    run_burst()
    assert status_of(task) == TaskStatus.REVIEW
    body = server.completion_requests[-1].json
    assert body["system"][0]["text"].startswith("You are an agent")
    assert any(
        b.get("type") == "tool_result"
        for m in body["messages"]
        if isinstance(m["content"], list)
        for b in m["content"]
    )


def test_the_api_key_is_read_from_the_environment_and_never_stored(
    model_server, http_model, loop_task, fast_worker_settings, monkeypatch
):
    monkeypatch.setenv("ACTHELM_KEY_SCRIPTED", "sk-test-secret-123")
    server = model_server([reply_error(401, {"error": {"message": "bad key sk-test-secret-123"}})])
    task = loop_task(http_model(server, credential_env="ACTHELM_KEY_SCRIPTED"), tools=[])
    run_burst()
    assert server.completion_requests[0].headers["authorization"] == "Bearer sk-test-secret-123"
    run = AgentRun.objects.get(task=task)
    assert run.error_code == "provider_auth"
    from django.db import connection

    with connection.cursor() as cursor:
        for table in (
            "agents_agentrun",
            "agents_turn",
            "tasks_taskevent",
            "agents_connection",
            "tasks_task",
            "agents_conversation",
        ):
            cursor.execute(
                f"SELECT count(*) FROM {table} WHERE {table}::text LIKE %s",
                ["%sk-test-secret-123%"],
            )
            assert cursor.fetchone()[0] == 0, table


@pytest.mark.parametrize(
    ("step", "code", "health", "attempts"),
    [
        # An authentication error is not an attempt (a second one after the cooldown fails the
        # task); quota and rate limits count against the attempts like other errors.
        (reply_error(401), "provider_auth", True, 0),
        (
            reply_error(429, {"error": {"message": "slow down", "type": "rate_limit"}}),
            "provider_rate_limited",
            True,
            1,
        ),
        (reply_error(500), "provider_server_error", False, 1),
        (
            reply_raw(200, b"<html>not json</html>", "text/html"),
            "provider_bad_response",
            False,
            1,
        ),
    ],
)
def test_provider_errors_get_their_codes_and_the_health_rules(
    model_server, http_model, loop_task, fast_worker_settings, step, code, health, attempts
):
    server = model_server([step])
    model = http_model(server)
    task = loop_task(model, tools=[])
    run_burst()
    task.refresh_from_db()
    model.connection.refresh_from_db()
    assert AgentRun.objects.get(task=task).error_code == code
    assert task.status == TaskStatus.READY  # waits for a cooldown or a back-off, not failed
    assert (model.connection.cooldown_until is not None) == health
    assert task.failed_attempts == attempts


def test_cancel_closes_the_held_request_within_a_heartbeat(
    model_server, http_model, loop_task, fast_worker_settings, person
):
    server = model_server([hang(30)])
    task = loop_task(http_model(server, timeout=60), tools=[])
    worker = Worker(worker_id="w", burst=True)
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert server.wait_for_requests(1, 10)
    task_cancel(actor=Actor.person(person), task_id=task.pk)
    assert server.wait_aborted(3)  # the worker closed the connection, not just ignored it
    thread.join(10)
    assert not thread.is_alive()
    assert status_of(task) == TaskStatus.CANCELLED
    assert not Turn.objects.filter(task=task, role="assistant").exists()


def test_pause_at_a_safe_point_then_resume_continues_without_repeating(
    model_server, http_model, loop_task, fast_worker_settings, person
):
    server = model_server(
        [
            reply_tool_calls([PLAN], delay=1.0),
            reply_tool_calls([("list_files", {})]),
            reply_text("done"),
        ]
    )
    task = loop_task(http_model(server))
    worker = Worker(worker_id="w", burst=True)
    thread = threading.Thread(target=worker.run)
    thread.start()
    assert server.wait_for_requests(1, 10)
    task_pause(actor=Actor.person(person), task_id=task.pk)
    thread.join(15)
    assert status_of(task) == TaskStatus.PAUSED
    # It stopped after the turn in flight: the plan call ran, no further request was made.
    assert len(server.completion_requests) == 1
    task_resume(actor=Actor.person(person), task_id=task.pk)
    run_burst("w2")
    assert status_of(task) == TaskStatus.REVIEW
    assert ToolCall.objects.get(task=task, tool="update_plan").run_count == 1


def test_resume_on_another_model(model_server, http_model, loop_task, fast_worker_settings, person):
    first = model_server([reply_tool_calls([PLAN], delay=0.8), reply_text("never")])
    second = model_server([reply_text("finished by the second model")])
    task = loop_task(http_model(first))
    other = http_model(second)
    thread = threading.Thread(target=Worker(worker_id="w", burst=True).run)
    thread.start()
    assert first.wait_for_requests(1, 10)
    task_pause(actor=Actor.person(person), task_id=task.pk)
    thread.join(15)
    task_resume(actor=Actor.person(person), task_id=task.pk, model=other)
    run_burst("w2")
    assert status_of(task) == TaskStatus.REVIEW
    assert len(first.completion_requests) == 1
    # The saved conversation is kept: the second model sees the plan call and its result.
    messages = second.completion_requests[0].json["messages"]
    assert any(m["role"] == "tool" and "Plan recorded" in m["content"] for m in messages)


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_hidden_reasoning_is_never_requested_nor_stored(
    model_server, http_model, loop_task, fast_worker_settings, flavor
):
    from django.db import connection

    server = model_server(
        [reply_text("the visible answer", reasoning="SECRET-CHAIN-OF-THOUGHT")], flavor=flavor
    )
    task = loop_task(http_model(server, flavor=flavor), tools=[])
    run_burst()
    assert AgentRun.objects.get(task=task).answer == "the visible answer"
    body = server.completion_requests[0].json
    assert "thinking" not in body and "reasoning" not in json.dumps(body).lower()
    with connection.cursor() as cursor:
        for table in ("agents_turn", "agents_agentrun", "tasks_taskevent"):
            cursor.execute(
                f"SELECT count(*) FROM {table} WHERE {table}::text LIKE %s", ["%SECRET-CHAIN%"]
            )
            assert cursor.fetchone()[0] == 0, table


def test_a_cut_database_connection_does_not_cost_a_second_model_call(
    model_server, http_model, loop_task, fast_worker_settings
):
    from django.db import connection

    server = model_server([reply_text("answered once", delay=1.5)])
    task = loop_task(http_model(server), tools=[])
    thread = threading.Thread(target=Worker(worker_id="w", burst=True).run)
    thread.start()
    assert server.wait_for_requests(1, 10)
    with connection.cursor() as cursor:  # cut every other session of this database
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
    thread.join(20)
    assert status_of(task) == TaskStatus.REVIEW
    assert len(server.completion_requests) == 1
