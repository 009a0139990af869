"""OpenTelemetry traces: off unless the standard ``OTEL_*`` variables say where to send them.

``setup()`` (called once per process from ``AgentsConfig.ready``) installs the SDK with the
OTLP/HTTP exporter and the Django and psycopg instrumentations when
``OTEL_EXPORTER_OTLP_ENDPOINT`` or ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (and neither
``OTEL_SDK_DISABLED=true`` nor ``OTEL_TRACES_EXPORTER=none``). The exporter itself reads the
usual variables (headers, protocol, timeout, ``OTEL_SERVICE_NAME``, resource attributes).

Span helpers, following the OpenTelemetry GenAI semantic conventions:

* ``invoke_agent(...)``  one per run (the loop's wiring),
* ``chat(...)``          one per model turn (called by the providers around the request),
* ``execute_tool(...)``  one per tool call, with the tool's name and outcome; arguments only
  when ``ACTHELM_OTEL_TOOL_ARGUMENTS`` is on (they may hold secrets).

When tracing is off every helper hands out the current (non-recording) span and attaches
nothing to the context: the cost is a function call, and a run waiting for its model keeps no
span machinery alive (no generator, context token or attributes per run and per request).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any, Protocol

from django.conf import settings
from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, SpanKind, Status, StatusCode

if TYPE_CHECKING:
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExporter
    from opentelemetry.util.types import AttributeValue

TRACER_NAME = "acthelm"
ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")

_lock = threading.Lock()
_provider: TracerProvider | None = None  # the SDK TracerProvider once set up
_instrumented = False


def enabled(environ: dict[str, str] | None = None) -> bool:
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "none":
        return False
    return any(env.get(name, "").strip() for name in ENDPOINT_VARS)


def service_resource(resource_class: type[Resource]) -> Resource:
    """The SDK's resource from the environment (``OTEL_SERVICE_NAME``, then ``service.name`` in
    ``OTEL_RESOURCE_ATTRIBUTES``); ``acthelm`` only where neither names the service."""
    detected = resource_class.create()
    if str(detected.attributes.get("service.name", "")).startswith("unknown_service"):
        detected = detected.merge(resource_class({"service.name": "acthelm"}))
    return detected


def setup(*, exporter: SpanExporter | None = None, instrument: bool = True) -> bool:
    """Install tracing if enabled (or when ``exporter`` is given, e.g. in tests); idempotent.

    Returns whether traces are recorded. With ``exporter`` the spans go to it synchronously
    and the global provider is left alone (tests call ``shutdown()`` afterwards).
    """
    global _provider, _instrumented
    if exporter is None and not enabled():
        return False
    with _lock:
        if _provider is not None:
            return True
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

        provider = TracerProvider(resource=service_resource(Resource))
        if exporter is not None:
            provider.add_span_processor(SimpleSpanProcessor(exporter))
        else:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
            trace.set_tracer_provider(provider)
        if instrument:
            from opentelemetry.instrumentation.django import DjangoInstrumentor
            from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

            DjangoInstrumentor().instrument(tracer_provider=provider)
            PsycopgInstrumentor().instrument(tracer_provider=provider, enable_commenter=False)
            _instrumented = True
        _provider = provider
    return True


def shutdown() -> None:
    """Flush and forget the provider; undo the instrumentations (tests)."""
    global _provider, _instrumented
    with _lock:
        if _instrumented:
            from opentelemetry.instrumentation.django import DjangoInstrumentor
            from opentelemetry.instrumentation.psycopg import PsycopgInstrumentor

            DjangoInstrumentor().uninstrument()
            PsycopgInstrumentor().uninstrument()
            _instrumented = False
        if _provider is not None:
            _provider.shutdown()
        _provider = None


def tracer() -> trace.Tracer:
    if _provider is not None:
        return _provider.get_tracer(TRACER_NAME)
    return trace.NoOpTracer()


class _Quiet[T]:
    """A helper's context when nothing records: hands out `value`, attaches nothing."""

    __slots__ = ("value",)

    def __init__(self, value: T) -> None:
        self.value = value

    def __enter__(self) -> T:
        return self.value

    def __exit__(self, *exc: object) -> None:
        return None


def _quiet_span() -> trace.Span | None:
    """The span a helper hands out when no trace records here (tracing off and no recording
    span around): the current non-recording span, which is what the no-op tracer would start
    and make current — so nothing need be attached to the context. None: the full path."""
    if _provider is not None:
        return None
    span = trace.get_current_span()
    return span if isinstance(span, NonRecordingSpan) else None


def _record_error(span: trace.Span, code: str, message: str = "") -> None:
    span.set_attribute("error.type", code)
    span.set_status(Status(StatusCode.ERROR, message[:200] or code))


# -- invoke_agent: one per run -----------------------------------------------------------------


def invoke_agent(
    *, task_id: int, run_id: int, model: str = "", provider_name: str = ""
) -> AbstractContextManager[trace.Span]:
    """The span of one run of a task; the run's chat and execute_tool spans nest in it.
    Call ``span.set_attribute("acthelm.outcome", ...)`` before leaving; an exception marks it
    failed."""
    quiet = _quiet_span()
    if quiet is not None:
        return _Quiet(quiet)
    return _invoke_agent(task_id, run_id, model, provider_name)


@contextlib.contextmanager
def _invoke_agent(
    task_id: int, run_id: int, model: str, provider_name: str
) -> Iterator[trace.Span]:
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "invoke_agent",
        "gen_ai.agent.name": "acthelm",
        "gen_ai.conversation.id": str(task_id),
        "acthelm.task.id": task_id,
        "acthelm.run.id": run_id,
    }
    if model:
        attributes["gen_ai.request.model"] = model
    if provider_name:
        attributes |= {"gen_ai.provider.name": provider_name, "gen_ai.system": provider_name}
    with tracer().start_as_current_span(
        "invoke_agent acthelm", kind=SpanKind.INTERNAL, attributes=attributes
    ) as span:
        yield span


# -- chat: one per model turn ------------------------------------------------------------------


class Completion(Protocol):
    """What a chat span records of a provider's answer (agents' ``Completion`` has these)."""

    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def stop_reason(self) -> str: ...
    @property
    def raw_stop_reason(self) -> str: ...
    @property
    def model(self) -> str: ...


class ChatSpan:
    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def completed(self, completion: Completion) -> None:
        """Record the answer's usage and finish reason (a provider ``Completion``)."""
        span = self.span
        if not span.is_recording():
            return
        span.set_attribute("gen_ai.usage.input_tokens", completion.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", completion.output_tokens)
        cached = getattr(completion, "cached_input_tokens", 0)
        written = getattr(completion, "cache_write_tokens", 0)
        if cached:
            span.set_attribute("gen_ai.usage.cache_read.input_tokens", cached)
        if written:
            span.set_attribute("gen_ai.usage.cache_creation.input_tokens", written)
        reason = completion.raw_stop_reason or completion.stop_reason
        span.set_attribute("gen_ai.response.finish_reasons", [reason])
        if completion.model:
            span.set_attribute("gen_ai.response.model", completion.model)
        cost = getattr(completion, "reported_cost", None)
        if cost is not None:
            span.set_attribute("acthelm.cost_usd", float(cost))


def chat(
    *, provider_name: str, model: str, max_tokens: int | None = None, server: str = ""
) -> AbstractContextManager[ChatSpan]:
    """The span of one model request. A raised ProviderError is recorded by its code."""
    quiet = _quiet_span()
    if quiet is not None:
        return _Quiet(ChatSpan(quiet))
    return _chat(provider_name, model, max_tokens, server)


@contextlib.contextmanager
def _chat(
    provider_name: str, model: str, max_tokens: int | None, server: str
) -> Iterator[ChatSpan]:
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": provider_name,
        "gen_ai.system": provider_name,
        "gen_ai.request.model": model,
    }
    if max_tokens:
        attributes["gen_ai.request.max_tokens"] = max_tokens
    if server:
        from urllib.parse import urlsplit

        parts = urlsplit(server)
        if parts.hostname:
            attributes["server.address"] = parts.hostname
            if parts.port:
                attributes["server.port"] = parts.port
    with tracer().start_as_current_span(
        f"chat {model}",
        kind=SpanKind.CLIENT,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        try:
            yield ChatSpan(span)
        except Exception as exc:
            _record_error(span, getattr(exc, "code", None) or type(exc).__name__)
            raise


# -- execute_tool: one per tool call -----------------------------------------------------------


class ToolSpan:
    def __init__(self, span: trace.Span) -> None:
        self.span = span

    def outcome(self, outcome: str, *, error_code: str = "") -> None:
        """``outcome``: succeeded, failed, refused, awaiting_approval, cancelled, ..."""
        self.span.set_attribute("acthelm.tool.outcome", outcome)
        if error_code:
            _record_error(self.span, error_code)


def _tool_arguments_allowed() -> bool:
    # Providers and tools are also used without Django settings (their own tests): no arguments.
    return settings.configured and bool(getattr(settings, "ACTHELM_OTEL_TOOL_ARGUMENTS", False))


def execute_tool(
    *, tool: str, call_id: str = "", arguments: Any = None, recovery_class: str = ""
) -> AbstractContextManager[ToolSpan]:
    """The span of one tool call. Arguments are attached only when the setting allows it."""
    quiet = _quiet_span()
    if quiet is not None:
        return _Quiet(ToolSpan(quiet))
    return _execute_tool(tool, call_id, arguments, recovery_class)


@contextlib.contextmanager
def _execute_tool(
    tool: str, call_id: str, arguments: Any, recovery_class: str
) -> Iterator[ToolSpan]:
    attributes: dict[str, AttributeValue] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "gen_ai.tool.type": "extension" if "__" in tool else "function",
    }
    if call_id:
        attributes["gen_ai.tool.call.id"] = call_id
    if recovery_class:
        attributes["acthelm.tool.recovery_class"] = recovery_class
    if arguments is not None and _tool_arguments_allowed():
        attributes["gen_ai.tool.call.arguments"] = json.dumps(
            arguments, sort_keys=True, default=str
        )[:4000]
    with tracer().start_as_current_span(
        f"execute_tool {tool}",
        kind=SpanKind.INTERNAL,
        attributes=attributes,
        record_exception=False,
        set_status_on_exception=False,
    ) as span:
        tool_span = ToolSpan(span)
        try:
            yield tool_span
        except Exception as exc:
            tool_span.outcome("failed", error_code=getattr(exc, "code", "") or type(exc).__name__)
            raise
