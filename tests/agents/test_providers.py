"""Providers against real peers: the scripted HTTP model server and the scripted CLI.

No mocks: every test talks to a real socket or a real child process. Django-free.
"""

from __future__ import annotations

import json
import os
import pickle
import socket
import sys
import threading
import time
from pathlib import Path

import pytest

from agents.catalogue.providers import (
    PROVIDER_AUTH,
    PROVIDER_BAD_REQUEST,
    PROVIDER_BAD_RESPONSE,
    PROVIDER_CANCELLED,
    PROVIDER_CLI_FAILED,
    PROVIDER_OUTPUT_TOO_LARGE,
    PROVIDER_QUOTA,
    PROVIDER_RATE_LIMITED,
    PROVIDER_SERVER_ERROR,
    PROVIDER_TIMEOUT,
    PROVIDER_UNREACHABLE,
    Completion,
    Message,
    ProviderError,
    ToolCallRequest,
    ToolSpec,
    UnknownProviderKind,
    build_provider,
    get_provider_class,
)
from tests.fakes.model_server import (
    ScriptedModelServer,
    hang,
    huge,
    reply_error,
    reply_json,
    reply_raw,
    reply_text,
    reply_tool_calls,
    trickle,
)

pytestmark = pytest.mark.timeout(20)

CLI = str(Path(__file__).resolve().parents[1] / "fakes" / "scripted_cli.py")
SECRET = "sk-test-SECRET-0123456789abcdef"
MODEL = "test-model"
READ_TOOL = ToolSpec(
    name="read_file",
    description="Read a file",
    parameters={"type": "object", "properties": {"path": {"type": "string"}}},
)


@pytest.fixture
def oai():
    with ScriptedModelServer(flavor="openai") as server:
        yield server


@pytest.fixture
def ant():
    with ScriptedModelServer(flavor="anthropic") as server:
        yield server


def make(server: ScriptedModelServer, **kwargs):
    kwargs.setdefault("timeout", 5)
    kind = "openai_compatible" if server.flavor == "openai" else "anthropic"
    return build_provider(kind, base_url=server.url, **kwargs)


def ask(provider, text: str = "hi", *, tools=(), messages=None, **kwargs) -> Completion:
    return provider.complete(
        model=MODEL,
        messages=messages or [Message(role="user", content=text)],
        tools=list(tools),
        max_tokens=100,
        **kwargs,
    )


def error_of(provider, **kwargs) -> ProviderError:
    with pytest.raises(ProviderError) as info:
        ask(provider, **kwargs)
    return info.value


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def conversation() -> list[Message]:
    return [
        Message(role="system", content="You are terse."),
        Message(role="system", content="Use tools."),
        Message(role="user", content="Read a and b"),
        Message(
            role="assistant",
            content="Reading.",
            tool_calls=[
                ToolCallRequest(
                    id="c1", name="read_file", arguments={"path": "a"}, arguments_raw='{"path":"a"}'
                ),
                ToolCallRequest(id="c2", name="read_file", arguments=None, arguments_raw="{bad"),
            ],
        ),
        Message(role="tool", tool_call_id="c1", name="read_file", content="A-content"),
        Message(role="tool", tool_call_id="c2", name="read_file", content="error: bad json"),
        Message(role="user", content="Thanks, go on."),
    ]


# ======================================================================================
# Registry and models
# ======================================================================================


def test_registry_kinds_and_unknown_kind():
    assert get_provider_class("openai_compatible").kind == "openai_compatible"
    assert get_provider_class("anthropic").supports_tools
    assert not get_provider_class("cli").supports_tools
    with pytest.raises(UnknownProviderKind) as info:
        get_provider_class("nope")
    assert isinstance(info.value, KeyError) and isinstance(info.value, ValueError)
    assert "nope" in str(info.value) and "openai_compatible" in str(info.value)


def test_completion_flags_and_error_health():
    done = Completion(
        text="x",
        tool_calls=[],
        stop_reason="end",
        raw_stop_reason="stop",
        input_tokens=1,
        output_tokens=1,
        model="m",
    )
    assert not done.truncated_or_declined
    for reason in ("length", "content_filter", "refusal"):
        assert done.model_copy(update={"stop_reason": reason}).truncated_or_declined
    assert ProviderError(PROVIDER_AUTH, "x").health
    assert ProviderError(PROVIDER_QUOTA, "x").health
    assert ProviderError(PROVIDER_RATE_LIMITED, "x").health
    assert not ProviderError(PROVIDER_SERVER_ERROR, "x").health
    assert ProviderError(PROVIDER_SERVER_ERROR, "x").transient
    copy = pickle.loads(pickle.dumps(ProviderError(PROVIDER_QUOTA, "m", status=402)))
    assert (copy.code, copy.message, copy.status) == (PROVIDER_QUOTA, "m", 402)


# ======================================================================================
# OpenAI-compatible
# ======================================================================================


def test_openai_text_answer_and_request_shape(oai):
    oai.enqueue(reply_text("Hello there", usage={"prompt_tokens": 42, "completion_tokens": 7}))
    result = ask(make(oai), "hi")
    assert result.text == "Hello there"
    assert result.stop_reason == "end" and result.raw_stop_reason == "stop"
    assert (result.input_tokens, result.output_tokens) == (42, 7)
    assert result.model == MODEL and result.tool_calls == []
    req = oai.completion_requests[-1]
    assert req.path == "/v1/chat/completions"
    assert "authorization" not in req.headers
    assert req.json == {
        "model": MODEL,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 100,
        "stream": False,
    }


def test_openai_default_usage_and_missing_usage(oai):
    oai.enqueue(
        reply_text("a"),
        reply_json(200, {"choices": [{"message": {"content": None}, "finish_reason": "stop"}]}),
    )
    first = ask(make(oai))
    assert (first.input_tokens, first.output_tokens) == (10, 5)
    second = ask(make(oai))
    assert (second.text, second.input_tokens, second.output_tokens) == ("", 0, 0)
    assert second.model == MODEL


def test_openai_tool_calls_parsed_including_malformed_arguments(oai):
    oai.enqueue(
        reply_tool_calls(
            [
                ("read_file", {"path": "a.txt"}, "call_1"),
                ("read_file", '{"path": "b.txt"', "call_2"),
                ("read_file", "[1, 2]", "call_3"),
                ("list_dir", "", "call_4"),
            ]
        )
    )
    result = ask(make(oai), tools=[READ_TOOL])
    assert result.stop_reason == "tool_calls"
    ok, broken, not_object, empty = result.tool_calls
    assert (ok.id, ok.name, ok.arguments) == ("call_1", "read_file", {"path": "a.txt"})
    assert json.loads(ok.arguments_raw) == {"path": "a.txt"}
    assert broken.arguments is None and broken.arguments_raw == '{"path": "b.txt"'
    assert not_object.arguments is None and not_object.arguments_raw == "[1, 2]"
    assert empty.arguments == {} and empty.name == "list_dir"
    assert oai.completion_requests[-1].json["tools"] == [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file",
                "parameters": READ_TOOL.parameters,
            },
        }
    ]


def test_openai_tool_calls_with_stop_finish_are_tool_calls(oai):
    # Ollama reports finish_reason "stop" together with tool calls.
    oai.enqueue(reply_tool_calls([("read_file", {"path": "x"})], finish="stop"))
    result = ask(make(oai), tools=[READ_TOOL])
    assert result.stop_reason == "tool_calls" and result.raw_stop_reason == "stop"


def test_openai_message_mapping_round_trip(oai):
    ask(make(oai), messages=conversation(), tools=[READ_TOOL])
    sent = oai.completion_requests[-1].json["messages"]
    assert sent == [
        {"role": "system", "content": "You are terse."},
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Read a and b"},
        {
            "role": "assistant",
            "content": "Reading.",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a"}'},
                },
                {
                    "id": "c2",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": "{bad"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "A-content"},
        {"role": "tool", "tool_call_id": "c2", "content": "error: bad json"},
        {"role": "user", "content": "Thanks, go on."},
    ]


@pytest.mark.parametrize(
    ("finish", "expected"),
    [
        ("stop", "end"),
        ("length", "length"),
        ("content_filter", "content_filter"),
        ("function_call", "tool_calls"),
        ("something_new", "other"),
        (None, "other"),
    ],
)
def test_openai_stop_reason_mapping(oai, finish, expected):
    body = {
        "model": MODEL,
        "choices": [{"message": {"role": "assistant", "content": "x"}, "finish_reason": finish}],
    }
    oai.enqueue(reply_json(200, body))
    result = ask(make(oai))
    assert result.stop_reason == expected
    assert result.raw_stop_reason == (finish or "")
    assert result.truncated_or_declined == (expected in ("length", "content_filter"))


def test_openai_refusal_field(oai):
    oai.enqueue(reply_text("", refusal="I can't help with that."))
    result = ask(make(oai))
    assert result.stop_reason == "refusal" and result.truncated_or_declined
    assert result.text == "I can't help with that."


def test_openai_reasoning_fields_ignored_and_never_requested(oai):
    oai.enqueue(reply_text("visible", reasoning="SECRET CHAIN OF THOUGHT"))
    result = ask(make(oai))
    assert result.text == "visible"
    assert "SECRET" not in result.model_dump_json()
    body = oai.completion_requests[-1].json
    assert not {"reasoning", "reasoning_effort", "thinking"} & set(body)


def test_openai_key_header_extra_headers_and_trailing_slash(oai):
    provider = build_provider(
        "openai_compatible",
        base_url=oai.url + "/",
        api_key=SECRET,
        extra_headers={"HTTP-Referer": "https://acthelm.test"},
        timeout=5,
    )
    ask(provider)
    req = oai.completion_requests[-1]
    assert req.path == "/v1/chat/completions"
    assert req.headers["authorization"] == f"Bearer {SECRET}"
    assert req.headers["http-referer"] == "https://acthelm.test"
    assert SECRET not in repr(provider)


OPENAI_ERRORS = [
    (
        401,
        {
            "error": {
                "message": "Incorrect API key",
                "type": "invalid_request_error",
                "code": "invalid_api_key",
            }
        },
        PROVIDER_AUTH,
    ),
    (403, {"error": {"message": "Forbidden"}}, PROVIDER_AUTH),
    (
        429,
        {
            "error": {
                "message": "Rate limit reached for requests",
                "type": "requests",
                "code": "rate_limit_exceeded",
            }
        },
        PROVIDER_RATE_LIMITED,
    ),
    (
        429,
        {
            "error": {
                "message": "You exceeded your current quota, please check your plan.",
                "type": "insufficient_quota",
                "code": "insufficient_quota",
            }
        },
        PROVIDER_QUOTA,
    ),
    (402, {"error": {"message": "Insufficient credits", "code": 402}}, PROVIDER_QUOTA),
    (500, {"error": {"message": "internal"}}, PROVIDER_SERVER_ERROR),
    (503, "upstream unavailable", PROVIDER_SERVER_ERROR),
    (400, {"error": {"message": "messages: invalid role"}}, PROVIDER_BAD_REQUEST),
    (404, {"error": "model 'x' not found"}, PROVIDER_BAD_REQUEST),
]


@pytest.mark.parametrize(("status", "body", "code"), OPENAI_ERRORS)
def test_openai_http_errors_classified(oai, status, body, code):
    oai.enqueue(reply_error(status, body))
    err = error_of(make(oai, api_key=SECRET))
    assert err.code == code and err.status == status
    assert err.health == (code in (PROVIDER_AUTH, PROVIDER_RATE_LIMITED, PROVIDER_QUOTA))
    assert f"HTTP {status}" in err.message


def test_openai_retry_after_header(oai):
    oai.enqueue(reply_error(429, {"error": {"message": "slow down"}}, headers={"Retry-After": "7"}))
    err = error_of(make(oai))
    assert err.code == PROVIDER_RATE_LIMITED and err.retry_after == 7.0


def test_openai_error_object_inside_200_uses_its_code(oai):
    oai.enqueue(reply_json(200, {"error": {"message": "Rate limit exceeded", "code": 429}}))
    assert error_of(make(oai)).code == PROVIDER_RATE_LIMITED


def test_api_key_never_in_error_messages(oai):
    echo = {
        "error": {"message": f"Incorrect API key provided: {SECRET}", "code": "invalid_api_key"}
    }
    oai.enqueue(reply_error(401, echo), reply_raw(200, f"garbage {SECRET}", "text/plain"))
    provider = make(oai, api_key=SECRET)
    for _ in range(2):
        err = error_of(provider)
        for text in (str(err), repr(err), err.message, str(err.args)):
            assert SECRET not in text
    assert oai.completion_requests[0].headers["authorization"] == f"Bearer {SECRET}"


@pytest.mark.parametrize(
    "step",
    [
        reply_raw(200, b"<html>not json</html>", "text/html"),
        reply_raw(200, b"", "application/json"),
        reply_json(200, []),
        reply_json(200, {"choices": []}),
        reply_json(200, {"choices": ["x"]}),
        reply_json(200, {"choices": [{"finish_reason": "stop"}]}),
        reply_json(200, {"choices": [{"message": {"content": 5}}]}),
        reply_json(200, {"choices": [{"message": {"content": "", "tool_calls": {"a": 1}}}]}),
        reply_json(200, {"choices": [{"message": {"tool_calls": [{"function": {"x": 1}}]}}]}),
    ],
    ids=[
        "html",
        "empty",
        "list",
        "no-choices",
        "choice-str",
        "no-message",
        "content-int",
        "tool-calls-dict",
        "tool-call-no-name",
    ],
)
def test_openai_bad_responses(oai, step):
    oai.enqueue(step)
    err = error_of(make(oai))
    assert err.code == PROVIDER_BAD_RESPONSE and err.status == 200


@pytest.mark.parametrize("content_length", [True, False])
def test_openai_body_over_cap(oai, content_length):
    oai.enqueue(huge(2 * 1024 * 1024, content_length=content_length))
    err = error_of(make(oai, max_response_bytes=64 * 1024))
    assert err.code == PROVIDER_BAD_RESPONSE and "exceeds" in err.message


def test_openai_50mb_and_endless_bodies_are_cut_fast(oai):
    oai.enqueue(huge(50 * 1024 * 1024), huge(None, content_length=False))
    provider = make(oai)  # default cap: 8 MiB
    for _ in range(2):
        started = time.monotonic()
        err = error_of(provider)
        assert err.code == PROVIDER_BAD_RESPONSE
        assert time.monotonic() - started < 2.0


def test_openai_slow_loris_ends_at_overall_timeout(oai):
    oai.enqueue(trickle(bytes_per_sec=40, total=100_000))
    started = time.monotonic()
    err = error_of(make(oai, timeout=1.0))
    assert err.code == PROVIDER_TIMEOUT
    assert time.monotonic() - started < 2.0


def test_openai_read_timeout_on_hang(oai):
    oai.enqueue(hang(30))
    started = time.monotonic()
    err = error_of(make(oai, timeout=0.5))
    assert err.code == PROVIDER_TIMEOUT
    assert time.monotonic() - started < 1.5
    assert oai.wait_aborted(2), "timed-out request must close the connection"


def test_server_closing_without_answer_is_server_error(oai):
    oai.enqueue(hang(0.1))  # closes the connection without any response
    assert error_of(make(oai)).code == PROVIDER_SERVER_ERROR


def test_connection_refused_is_unreachable():
    provider = build_provider(
        "openai_compatible", base_url=f"http://127.0.0.1:{free_port()}/v1", api_key=SECRET
    )
    err = error_of(provider)
    assert err.code == PROVIDER_UNREACHABLE and SECRET not in str(err)


def test_invalid_base_url_is_unreachable():
    err = error_of(build_provider("openai_compatible", base_url="localhost:11434/v1"))
    assert err.code == PROVIDER_UNREACHABLE


def cancel_after(event: threading.Event, delay: float) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(delay), event.set()), daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_cancel_aborts_in_flight_request(flavor):
    with ScriptedModelServer([hang(30)], flavor=flavor) as server:
        event = threading.Event()
        cancel_after(event, 0.3)
        started = time.monotonic()
        err = error_of(make(server, timeout=60), cancel_event=event)
        elapsed = time.monotonic() - started
        assert err.code == PROVIDER_CANCELLED
        assert 0.25 < elapsed < 1.3
        assert server.wait_aborted(2), "server must observe the client closing the connection"
        assert server.abort_count == 1


def test_cancel_already_set_sends_nothing(oai):
    event = threading.Event()
    event.set()
    assert error_of(make(oai), cancel_event=event).code == PROVIDER_CANCELLED
    assert oai.completion_requests == []


def test_unfired_cancel_event_does_not_disturb(oai):
    oai.enqueue(reply_text("fine", delay=0.3))
    assert ask(make(oai), cancel_event=threading.Event()).text == "fine"


def test_openai_max_completion_tokens_fallback(oai):
    def step(request):
        if "max_tokens" in request:
            return reply_error(
                400,
                {
                    "error": {
                        "message": "Unsupported parameter: 'max_tokens' is not supported "
                        "with this model. Use 'max_completion_tokens' instead.",
                        "type": "invalid_request_error",
                        "code": "unsupported_parameter",
                    }
                },
            )
        return reply_text(f"limit={request['max_completion_tokens']}")

    oai.enqueue(step, step, step)
    provider = make(oai)
    assert ask(provider).text == "limit=100"
    assert len(oai.completion_requests) == 2
    assert ask(provider).text == "limit=100"  # remembered: the next turn asks for it at once
    assert len(oai.completion_requests) == 3


# ======================================================================================
# Anthropic
# ======================================================================================


def test_anthropic_text_answer_and_request_shape(ant):
    ant.enqueue(reply_text("Bonjour"))
    result = ask(
        make(ant, api_key=SECRET),
        messages=[
            Message(role="system", content="S1"),
            Message(role="system", content="S2"),
            Message(role="user", content="hi"),
        ],
    )
    assert result.text == "Bonjour" and result.stop_reason == "end"
    assert result.raw_stop_reason == "end_turn"
    assert (result.input_tokens, result.output_tokens) == (10, 5)
    req = ant.completion_requests[-1]
    assert req.path == "/v1/messages"
    assert req.headers["x-api-key"] == SECRET
    assert req.headers["anthropic-version"] == "2023-06-01"
    assert "authorization" not in req.headers
    assert req.json == {
        "model": MODEL,
        "max_tokens": 100,
        "system": [{"type": "text", "text": "S1\n\nS2", "cache_control": {"type": "ephemeral"}}],
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    }


def test_anthropic_base_url_with_v1_suffix(ant):
    provider = build_provider("anthropic", base_url=ant.url + "/v1/", timeout=5)
    ask(provider)
    assert ant.completion_requests[-1].path == "/v1/messages"


def test_anthropic_tool_use_parsed(ant):
    ant.enqueue(
        reply_tool_calls(
            [("read_file", {"path": "a"}, "toolu_1"), ("read_file", "not json", "toolu_2")],
            text="Let me look.",
        )
    )
    result = ask(make(ant), tools=[READ_TOOL])
    assert result.stop_reason == "tool_calls" and result.text == "Let me look."
    good, bad = result.tool_calls
    assert (good.id, good.name, good.arguments) == ("toolu_1", "read_file", {"path": "a"})
    assert json.loads(good.arguments_raw) == {"path": "a"}
    assert bad.arguments is None and json.loads(bad.arguments_raw) == "not json"
    assert ant.completion_requests[-1].json["tools"] == [
        {
            "name": "read_file",
            "description": "Read a file",
            "input_schema": READ_TOOL.parameters,
            "cache_control": {"type": "ephemeral"},
        }
    ]


def test_anthropic_message_mapping_round_trip(ant):
    ask(make(ant), messages=conversation(), tools=[READ_TOOL])
    body = ant.completion_requests[-1].json
    assert body["system"][0]["text"] == "You are terse.\n\nUse tools."
    assert "thinking" not in body
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "Read a and b"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Reading."},
                {"type": "tool_use", "id": "c1", "name": "read_file", "input": {"path": "a"}},
                {"type": "tool_use", "id": "c2", "name": "read_file", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "c1", "content": "A-content"},
                {"type": "tool_result", "tool_use_id": "c2", "content": "error: bad json"},
                {"type": "text", "text": "Thanks, go on."},
            ],
        },
    ]


def test_anthropic_thinking_blocks_dropped(ant):
    ant.enqueue(reply_text("answer", reasoning="PRIVATE THOUGHTS"))
    result = ask(make(ant))
    assert result.text == "answer"
    assert "PRIVATE" not in result.model_dump_json()


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("end_turn", "end"),
        ("stop_sequence", "end"),
        ("max_tokens", "length"),
        ("refusal", "refusal"),
        ("pause_turn", "other"),
    ],
)
def test_anthropic_stop_reason_mapping(ant, raw, expected):
    ant.enqueue(reply_text("x", finish=raw))
    result = ask(make(ant))
    assert (result.stop_reason, result.raw_stop_reason) == (expected, raw)
    assert result.truncated_or_declined == (expected in ("length", "refusal"))


def test_anthropic_usage_includes_cache_tokens(ant):
    ant.enqueue(
        reply_text(
            "x",
            usage={
                "input_tokens": 3,
                "cache_read_input_tokens": 100,
                "cache_creation_input_tokens": 20,
                "output_tokens": 9,
            },
        )
    )
    result = ask(make(ant))
    assert (result.input_tokens, result.output_tokens) == (123, 9)


def _anthropic_error(kind: str, message: str) -> dict:
    return {"type": "error", "error": {"type": kind, "message": message}}


@pytest.mark.parametrize(
    ("status", "body", "code"),
    [
        (401, _anthropic_error("authentication_error", "invalid x-api-key"), PROVIDER_AUTH),
        (403, _anthropic_error("permission_error", "no access"), PROVIDER_AUTH),
        (
            429,
            _anthropic_error(
                "rate_limit_error",
                "Number of request tokens has exceeded your per-minute rate limit",
            ),
            PROVIDER_RATE_LIMITED,
        ),
        (529, _anthropic_error("overloaded_error", "Overloaded"), PROVIDER_SERVER_ERROR),
        (500, _anthropic_error("api_error", "Internal server error"), PROVIDER_SERVER_ERROR),
        (
            400,
            _anthropic_error(
                "invalid_request_error",
                "Your credit balance is too low to access the Anthropic API.",
            ),
            PROVIDER_QUOTA,
        ),
        (400, _anthropic_error("invalid_request_error", "messages.0: bad"), PROVIDER_BAD_REQUEST),
        (413, _anthropic_error("request_too_large", "too large"), PROVIDER_BAD_REQUEST),
    ],
)
def test_anthropic_http_errors_classified(ant, status, body, code):
    ant.enqueue(reply_error(status, body))
    err = error_of(make(ant, api_key=SECRET))
    assert (err.code, err.status) == (code, status)
    assert SECRET not in str(err)


@pytest.mark.parametrize(
    "step",
    [
        reply_raw(200, b"nope", "text/plain"),
        reply_json(200, {"type": "message"}),
        reply_json(200, {"content": [{"type": "text"}]}),
        reply_json(200, {"content": ["text"]}),
    ],
)
def test_anthropic_bad_responses(ant, step):
    ant.enqueue(step)
    assert error_of(make(ant)).code == PROVIDER_BAD_RESPONSE


def test_anthropic_body_over_cap(ant):
    ant.enqueue(huge(2 * 1024 * 1024))
    assert error_of(make(ant, max_response_bytes=100_000)).code == PROVIDER_BAD_RESPONSE


# ======================================================================================
# Probes
# ======================================================================================


def test_openai_probe_context_window_and_tools():
    with ScriptedModelServer(flavor="openai", context_length=32768) as server:
        server.enqueue(reply_text("OK"), reply_tool_calls([("ping", {})]))
        result = make(server).probe(model=MODEL, tools=True)
        assert result.ok and result.supports_tools is True
        assert result.context_window == 32768
        assert "ping was called" in result.message
        paths = [(r.method, r.path) for r in server.requests]
        assert paths == [
            ("GET", "/v1/models"),
            ("POST", "/v1/chat/completions"),
            ("POST", "/v1/chat/completions"),
        ]
        first, second = (r.json for r in server.completion_requests)
        assert first["max_tokens"] <= 16 and "tools" not in first
        assert [t["function"]["name"] for t in second["tools"]] == ["ping"]


@pytest.mark.parametrize(
    ("entry", "window"),
    [
        ({"id": MODEL, "max_model_len": 4096}, 4096),  # vLLM
        ({"id": "/models/q.gguf", "meta": {"n_ctx_train": 131072}}, 131072),  # llama.cpp
        ({"id": MODEL, "top_provider": {"context_length": 200000}}, 200000),  # OpenRouter
        ({"id": MODEL, "object": "model"}, None),  # Ollama: unknown
    ],
)
def test_openai_probe_context_window_formats(entry, window):
    with ScriptedModelServer(flavor="openai", models={"data": [entry]}) as server:
        result = make(server).probe(model=MODEL, tools=False)
        assert result.ok and result.context_window == window and result.supports_tools is None


def test_openai_probe_survives_missing_models_endpoint():
    with ScriptedModelServer(flavor="openai", models={"detail": "Not Found"}) as server:
        result = make(server).probe(model=MODEL, tools=False)
        assert result.ok and result.context_window is None


def test_openai_probe_failures(oai):
    oai.enqueue(reply_error(401, {"error": {"message": "bad key"}}))
    result = make(oai, api_key=SECRET).probe(model=MODEL, tools=True)
    assert not result.ok and result.error_code == PROVIDER_AUTH
    assert SECRET not in result.message

    oai.enqueue(reply_text("OK"), reply_error(400, {"error": {"message": "tools unsupported"}}))
    result = make(oai).probe(model=MODEL, tools=True)
    assert not result.ok and result.supports_tools is False
    assert result.error_code == PROVIDER_BAD_REQUEST


def test_anthropic_probe(ant):
    ant.enqueue(reply_text("OK"), reply_text("no tool for you"))
    result = make(ant).probe(model=MODEL, tools=True)
    # The model answered but never called ping: it is not shown to call tools.
    assert result.ok and result.supports_tools is False and result.tool_ignored
    assert result.context_window is None and "did not call the probe tool" in result.message
    assert ant.completion_requests[-1].json["tools"][0]["name"] == "ping"
    ant.enqueue(reply_text("OK"), reply_tool_calls([("ping", {})]))
    result = make(ant).probe(model=MODEL, tools=True)
    assert result.ok and result.supports_tools is True and "ping was called" in result.message


def test_probe_unreachable():
    url = f"http://127.0.0.1:{free_port()}"
    result = build_provider("anthropic", base_url=url).probe(model=MODEL, tools=False)
    assert not result.ok and result.error_code == PROVIDER_UNREACHABLE


# ======================================================================================
# CLI
# ======================================================================================


def cli(*args: str, **kwargs):
    kwargs.setdefault("timeout", 10)
    return build_provider("cli", command=[sys.executable, CLI, *args], **kwargs)


def cli_error(provider, **kwargs) -> ProviderError:
    return error_of(provider, **kwargs)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def invocations(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_cli_echo_renders_labelled_prompt(tmp_path):
    prompt_file = tmp_path / "prompt.txt"
    provider = cli("--mode", "echo", "--prompt-file", str(prompt_file))
    result = ask(provider, messages=conversation(), tools=[READ_TOOL])  # tools ignored
    assert result.text.startswith("ANSWER: === SYSTEM ===\nYou are terse.\n\nUse tools.")
    assert result.stop_reason == "end" and result.tool_calls == []
    assert (result.input_tokens, result.output_tokens) == (0, 0)
    prompt = prompt_file.read_text()
    assert prompt.index("=== SYSTEM ===") < prompt.index("=== USER ===\nRead a and b")
    assert "=== ASSISTANT ===\nReading." in prompt
    assert "=== TOOL RESULT (read_file) ===\nA-content" in prompt
    assert prompt.rstrip("\x00END\n").endswith("=== USER ===\nThanks, go on.")


def test_cli_text_is_stripped():
    assert ask(cli("--mode", "text", "--text", "  hello  ")).text == "hello"


@pytest.mark.parametrize(
    ("document", "field", "expected"),
    [
        ({"result": "the answer"}, "result", "the answer"),
        ({"choices": [{"text": "first"}, {"text": "second"}]}, "choices.1.text", "second"),
        ({"data": {"n": 3}}, "data", '{"n": 3}'),
    ],
)
def test_cli_json_answer_field(document, field, expected):
    provider = cli("--mode", "json", "--json", json.dumps(document), answer_field=field)
    assert ask(provider).text == expected


def test_cli_json_usage():
    doc = {
        "result": "r",
        "usage": {"input_tokens": 12, "output_tokens": 4, "cache_read_input_tokens": 8},
    }
    result = ask(cli("--mode", "json", "--json", json.dumps(doc), answer_field="result"))
    assert (result.text, result.input_tokens, result.output_tokens) == ("r", 20, 4)


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (("--mode", "invalid-json"), "result"),
        (("--mode", "json", "--json", '{"other": 1}'), "result"),
        (("--mode", "json", "--json", '{"choices": []}'), "choices.0.text"),
        (("--mode", "json", "--json", '{"result": null}'), "result"),
    ],
    ids=["invalid-json", "missing-field", "missing-index", "null-field"],
)
def test_cli_bad_json_output(args, field):
    assert cli_error(cli(*args, answer_field=field)).code == PROVIDER_BAD_RESPONSE


def test_cli_json_is_error_flag():
    doc = {"is_error": True, "result": "Claude AI usage limit reached"}
    err = cli_error(cli("--mode", "json", "--json", json.dumps(doc), answer_field="result"))
    assert err.code == PROVIDER_QUOTA


@pytest.mark.parametrize(
    ("stderr", "code"),
    [
        ("Error: 429 Too Many Requests", PROVIDER_RATE_LIMITED),
        ("API Error: rate_limit_error", PROVIDER_RATE_LIMITED),
        ("You exceeded your current quota", PROVIDER_QUOTA),
        ("Claude AI usage limit reached|1760000000", PROVIDER_QUOTA),
        ("Invalid API key · Please run /login", PROVIDER_AUTH),
        ("Error: 401 Unauthorized", PROVIDER_AUTH),
        ("Traceback: something exploded", PROVIDER_CLI_FAILED),
    ],
)
def test_cli_nonzero_exit_classified(stderr, code):
    err = cli_error(cli("--mode", "fail", "--exit-code", "3", "--stderr", stderr))
    assert err.code == code and err.status == 3
    assert "exited with code 3" in err.message and stderr[:20] in err.message


def test_cli_failure_message_keeps_stderr_tail_and_hides_key():
    stderr = "x" * 2000 + f" token {SECRET} END"
    err = cli_error(cli("--mode", "fail", "--stderr", stderr, api_key=SECRET))
    assert err.code == PROVIDER_CLI_FAILED
    assert err.message.endswith("END") and len(err.message) < 700
    assert SECRET not in str(err)


def test_cli_timeout_kills_process(tmp_path):
    count = tmp_path / "count.jsonl"
    started = time.monotonic()
    err = cli_error(cli("--mode", "hang", "--count-file", str(count), timeout=1))
    assert err.code == PROVIDER_TIMEOUT
    assert time.monotonic() - started < 2.5
    (call,) = invocations(count)
    assert not alive(call["pid"])


def test_cli_output_too_large(tmp_path):
    count = tmp_path / "count.jsonl"
    started = time.monotonic()
    err = cli_error(
        cli("--mode", "huge", "--bytes", str(10 * 1024 * 1024), "--count-file", str(count))
    )
    assert err.code == PROVIDER_OUTPUT_TOO_LARGE
    assert time.monotonic() - started < 5
    assert not alive(invocations(count)[0]["pid"])


def test_cli_output_under_cap_is_fine():
    result = ask(cli("--mode", "huge", "--bytes", "300000", max_response_bytes=400_000))
    assert len(result.text) == 300000


def test_cli_cancel(tmp_path):
    count = tmp_path / "count.jsonl"
    event = threading.Event()
    cancel_after(event, 0.3)
    started = time.monotonic()
    err = cli_error(
        cli("--mode", "hang", "--count-file", str(count), timeout=30), cancel_event=event
    )
    assert err.code == PROVIDER_CANCELLED
    assert time.monotonic() - started < 1.5
    assert not alive(invocations(count)[0]["pid"])


def test_cli_missing_executable():
    provider = build_provider("cli", command=["/nonexistent/acthelm-model-cli", "-p"])
    err = cli_error(provider)
    assert err.code == PROVIDER_UNREACHABLE


def test_cli_key_via_env_only(tmp_path, monkeypatch):
    monkeypatch.delenv("ACTHELM_KEY_TEST", raising=False)
    count = tmp_path / "count.jsonl"
    args = ("--mode", "env", "--env-name", "ACTHELM_KEY_TEST", "--count-file", str(count))
    with_env = cli(*args, api_key=SECRET, api_key_env="ACTHELM_KEY_TEST")
    assert ask(with_env).text == f"ACTHELM_KEY_TEST={SECRET}"
    without_env = cli(*args, api_key=SECRET)
    assert ask(without_env).text == "ACTHELM_KEY_TEST unset"
    for call in invocations(count):
        assert SECRET not in json.dumps(call["argv"])


def test_cli_script_mode_across_invocations(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {"text": "first"},
                {"fail": {"code": 2, "stderr": "429 too many requests"}},
                {"sleep": 0.1, "text": "third"},
            ]
        )
    )
    count = tmp_path / "count.jsonl"
    provider = cli("--mode", "script", "--script", str(script), "--count-file", str(count))
    assert ask(provider).text == "first"
    assert cli_error(provider).code == PROVIDER_RATE_LIMITED
    assert ask(provider).text == "third"
    assert ask(provider).text == "done"
    assert len(invocations(count)) == 4


def test_cli_probe(tmp_path):
    result = cli("--mode", "text", "--text", "OK").probe(model="m", tools=True)
    assert result.ok and result.supports_tools is False
    assert not cli("--mode", "text", "--text", "").probe(model="m", tools=False).ok
    failed = cli("--mode", "fail", "--stderr", "not logged in").probe(model="m", tools=False)
    assert not failed.ok and failed.error_code == PROVIDER_AUTH


def test_cli_rejects_shell_string():
    with pytest.raises(ValueError):
        build_provider("cli", command=[])


@pytest.mark.parametrize("raw", ['{"a": NaN}', '{"a": [1, Infinity]}', '{"a": {"b": -Infinity}}'])
def test_non_finite_numbers_make_tool_arguments_unparsable(raw):
    from agents.catalogue.providers.base import ToolCallRequest
    from agents.catalogue.providers.openai_compat import parse_arguments

    arguments, text = parse_arguments(raw)
    call = ToolCallRequest(id="c", name="t", arguments=arguments, arguments_raw=text)
    assert call.arguments is None and call.arguments_raw == raw
    assert ToolCallRequest(id="c", name="t", arguments={"a": 1.5}, arguments_raw="").arguments == {
        "a": 1.5
    }


def test_non_finite_token_counts_read_as_zero():
    from agents.catalogue.providers import _http

    assert [_http.as_int(v) for v in (float("nan"), float("inf"), -float("inf"), 7.9)] == [
        0,
        0,
        0,
        7,
    ]
