"""Traces of a run through the real loop and worker (the SDK's in-memory exporter): one
invoke_agent span, a chat span per model turn and an execute_tool span per tool call, all in
one trace, nested in the run's span."""

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agents.engine.runtime.worker import Worker
from core import telemetry
from tasks.states import TaskStatus
from tests.agents.scripted import fast_settings, status_of, tool_task
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def spans(settings):
    fast_settings(settings)
    exporter = InMemorySpanExporter()
    assert telemetry.setup(exporter=exporter, instrument=False)
    yield exporter
    telemetry.shutdown()


def test_a_run_is_one_trace_of_invoke_agent_chat_and_execute_tool(spans, settings):
    settings.ACTHELM_OTEL_TOOL_ARGUMENTS = False
    # The script calls a tool off the task's list on purpose (its refused span is traced); the
    # supervisor's default check `no_unlisted_tools` would reject that run, and this test is
    # about the trace of a run that reaches review.
    settings.ACTHELM_SUPERVISOR_DEFAULT_CHECKS = False
    script = [
        reply_tool_calls(
            [
                ("list_files", {"path": "."}, "c1"),
                ("fetch_url", {"url": "https://example.com/"}, "c2"),  # not on the task's list
            ],
            usage={"prompt_tokens": 40, "completion_tokens": 7},
        ),
        reply_text("Done.", usage={"prompt_tokens": 60, "completion_tokens": 3}),
    ]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["list_files"])
        Worker(worker_id="traced", burst=True).run()
    assert status_of(task) == TaskStatus.REVIEW

    finished = spans.get_finished_spans()
    [run] = [s for s in finished if s.name == "invoke_agent acthelm"]
    chats = [s for s in finished if s.name.startswith("chat ")]
    tools = {s.attributes["gen_ai.tool.name"]: s for s in finished if s.name.startswith("execute_")}
    assert run.parent is None
    assert run.attributes["acthelm.task.id"] == task.pk
    assert run.attributes["gen_ai.request.model"] == "test-model"
    assert run.attributes["acthelm.outcome"] == "final"
    assert [c.attributes["gen_ai.usage.input_tokens"] for c in chats] == [40, 60]
    assert set(tools) == {"list_files", "fetch_url"}
    assert tools["list_files"].attributes["acthelm.tool.outcome"] == "succeeded"
    assert tools["list_files"].attributes["gen_ai.tool.call.id"] == "c1"
    assert tools["list_files"].attributes["acthelm.tool.recovery_class"] == "read_only"
    assert tools["fetch_url"].attributes["acthelm.tool.outcome"] == "refused"
    assert tools["fetch_url"].attributes["error.type"] == "tool_not_allowed"
    for span in [*chats, *tools.values()]:
        assert span.context.trace_id == run.context.trace_id
        assert span.parent.span_id == run.context.span_id
        assert "gen_ai.tool.call.arguments" not in span.attributes
