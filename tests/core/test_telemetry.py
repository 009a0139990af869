"""Traces: off unless OTEL_* is set; GenAI spans for runs, model turns and tool calls, linked
to the Django request and psycopg spans (the SDK's in-memory exporter)."""

import pytest
from django.test import Client
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from agents.catalogue.providers import Message, ProviderError, build_provider
from agents.catalogue.providers.base import traced_name
from core import telemetry
from tests.fakes.model_server import ScriptedModelServer, reply_error, reply_text


@pytest.fixture
def spans():
    exporter = InMemorySpanExporter()
    assert telemetry.setup(exporter=exporter, instrument=False)
    yield exporter
    telemetry.shutdown()


@pytest.mark.parametrize(
    "env, on",
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4318/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_TRACES_EXPORTER": "none"}, False),
    ],
)
def test_traces_are_off_unless_an_endpoint_is_set(env, on):
    assert telemetry.enabled(env) is on


def test_off_by_default_the_helpers_are_no_ops(monkeypatch):
    for name in telemetry.ENDPOINT_VARS:
        monkeypatch.delenv(name, raising=False)
    assert telemetry.setup() is False
    with telemetry.execute_tool(tool="read_file") as span:
        span.outcome("succeeded")
    assert not span.span.is_recording()


def test_off_the_helpers_attach_nothing_to_the_context(monkeypatch):
    """A run holds its run's span for its whole life and a chat span while it waits for the
    model: with tracing off these are the current non-recording span, and no context is
    attached (nothing per run kept alive, nothing to detach)."""
    from opentelemetry import context

    for name in telemetry.ENDPOINT_VARS:
        monkeypatch.delenv(name, raising=False)
    assert telemetry.setup() is False
    before = context.get_current()
    with (
        telemetry.invoke_agent(task_id=1, run_id=2, model="m", provider_name="openai") as run,
        telemetry.chat(provider_name="openai", model="m", max_tokens=5) as chat,
        telemetry.execute_tool(tool="read_file", call_id="c1") as tool,
    ):
        assert context.get_current() is before
        assert not run.is_recording()
        assert not chat.span.is_recording() and not tool.span.is_recording()
    with pytest.raises(ProviderError), telemetry.chat(provider_name="openai", model="m"):
        raise ProviderError("provider_timeout", "slow")
    assert context.get_current() is before


def test_off_inside_someone_elses_recording_span_the_helpers_carry_its_context(monkeypatch):
    """Not Acthelm's tracing but a recording span around (another library's provider): the
    helpers start what the no-op tracer starts, a non-recording span with the parent's ids."""
    from opentelemetry.sdk.trace import TracerProvider

    for name in telemetry.ENDPOINT_VARS:
        monkeypatch.delenv(name, raising=False)
    assert telemetry.setup() is False
    other = TracerProvider().get_tracer("someone-else")
    with (
        other.start_as_current_span("outer") as outer,
        telemetry.chat(provider_name="openai", model="m") as chat,
    ):
        assert not chat.span.is_recording()
        assert chat.span.get_span_context() == outer.get_span_context()


def ask(provider, model="test-model"):
    return provider.complete(
        model=model, messages=[Message(role="user", content="hi")], tools=[], max_tokens=64
    )


@pytest.mark.parametrize(
    "flavor, kind", [("openai", "openai_compatible"), ("anthropic", "anthropic")]
)
def test_a_model_turn_is_a_chat_span_inside_the_run(spans, flavor, kind):
    usage = (
        {
            "prompt_tokens": 30,
            "completion_tokens": 4,
            "prompt_tokens_details": {"cached_tokens": 20},
        }
        if flavor == "openai"
        else {"input_tokens": 10, "cache_read_input_tokens": 20, "output_tokens": 4}
    )
    with ScriptedModelServer([reply_text("hello", usage=usage)], flavor=flavor) as server:
        provider = build_provider(kind, base_url=server.url, timeout=5)
        with telemetry.invoke_agent(
            task_id=7, run_id=3, model="test-model", provider_name=traced_name(kind)
        ):
            ask(provider)
    chat, run = spans.get_finished_spans()
    assert chat.name == "chat test-model" and run.name == "invoke_agent acthelm"
    assert chat.parent.span_id == run.context.span_id
    name = "openai" if flavor == "openai" else "anthropic"
    assert chat.attributes["gen_ai.operation.name"] == "chat"
    assert chat.attributes["gen_ai.provider.name"] == name
    assert chat.attributes["gen_ai.system"] == name
    assert run.attributes["gen_ai.provider.name"] == name
    assert chat.attributes["gen_ai.request.model"] == "test-model"
    assert chat.attributes["gen_ai.request.max_tokens"] == 64
    assert chat.attributes["gen_ai.usage.input_tokens"] == 30
    assert chat.attributes["gen_ai.usage.output_tokens"] == 4
    assert chat.attributes["gen_ai.usage.cache_read.input_tokens"] == 20
    assert chat.attributes["gen_ai.response.finish_reasons"] == (
        ("stop",) if flavor == "openai" else ("end_turn",)
    )
    assert chat.attributes["server.address"] == "127.0.0.1"
    assert run.attributes["acthelm.task.id"] == 7 and run.attributes["acthelm.run.id"] == 3


def test_a_failed_model_turn_records_its_code(spans):
    with ScriptedModelServer([reply_error(429)]) as server, pytest.raises(ProviderError):
        ask(build_provider("openai_compatible", base_url=server.url, timeout=5))
    (chat,) = spans.get_finished_spans()
    assert chat.attributes["error.type"] == "provider_rate_limited"
    assert chat.status.status_code.name == "ERROR"


def test_a_tool_call_span_has_name_and_outcome_but_no_arguments(spans, settings):
    settings.ACTHELM_OTEL_TOOL_ARGUMENTS = False
    with telemetry.execute_tool(
        tool="gh__create_issue", call_id="c1", arguments={"token": "s3cret"}
    ) as span:
        span.outcome("failed", error_code="mcp_timeout")
    (tool,) = spans.get_finished_spans()
    assert tool.name == "execute_tool gh__create_issue"
    assert tool.attributes["gen_ai.tool.name"] == "gh__create_issue"
    assert tool.attributes["gen_ai.tool.type"] == "extension"
    assert tool.attributes["acthelm.tool.outcome"] == "failed"
    assert tool.attributes["error.type"] == "mcp_timeout"
    assert "s3cret" not in repr(dict(tool.attributes))


def test_tool_arguments_only_when_the_setting_allows(spans, settings):
    settings.ACTHELM_OTEL_TOOL_ARGUMENTS = True
    with telemetry.execute_tool(tool="read_file", arguments={"path": "a.txt"}) as span:
        span.outcome("succeeded")
    (tool,) = spans.get_finished_spans()
    assert tool.attributes["gen_ai.tool.call.arguments"] == '{"path": "a.txt"}'
    assert tool.attributes["gen_ai.tool.type"] == "function"


@pytest.mark.django_db(transaction=True)
def test_django_request_and_psycopg_spans_are_recorded(settings):
    from django.db import connection

    exporter = InMemorySpanExporter()
    telemetry.setup(exporter=exporter, instrument=True)
    try:
        connection.close()  # the next query opens an instrumented connection
        response = Client().get("/healthz")
        assert response.status_code in (200, 503)
        finished = exporter.get_finished_spans()
        server = [s for s in finished if s.kind.name == "SERVER"]
        assert server and "GET" in server[0].name
        queries = [s for s in finished if s.attributes.get("db.system") == "postgresql"]
        assert queries and all(q.context.trace_id == server[0].context.trace_id for q in queries)
    finally:
        telemetry.shutdown()
        connection.close()


@pytest.mark.parametrize(
    "env, name",
    [
        ({}, "acthelm"),
        (
            {"OTEL_RESOURCE_ATTRIBUTES": "service.name=acthelm-eu,deployment.environment=prod"},
            "acthelm-eu",
        ),
        (
            {"OTEL_SERVICE_NAME": "from-name", "OTEL_RESOURCE_ATTRIBUTES": "service.name=x"},
            "from-name",
        ),
    ],
)
def test_the_service_name_comes_from_the_environment_first(monkeypatch, env, name):
    """Issue 21 item 12: OTEL_RESOURCE_ATTRIBUTES's service.name was overridden by the default."""
    for var in ("OTEL_SERVICE_NAME", "OTEL_RESOURCE_ATTRIBUTES"):
        monkeypatch.delenv(var, raising=False)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    exporter = InMemorySpanExporter()
    assert telemetry.setup(exporter=exporter, instrument=False)
    try:
        with telemetry.execute_tool(tool="read_file") as span:
            span.outcome("succeeded")
    finally:
        telemetry.shutdown()
    [finished] = exporter.get_finished_spans()
    assert finished.resource.attributes["service.name"] == name
