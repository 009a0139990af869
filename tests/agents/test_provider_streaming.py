"""Streamed model answers (issue 52): the OpenAI-compatible and Anthropic providers ask for
Server-Sent Events when given `on_delta`, hand each visible piece over as it arrives, and return
the very Completion a whole answer gives. A server that answers whole, a stream cut off, the byte
cap, a cancel mid-stream and the proxied path. The scripted model server streams on loopback."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from agents.catalogue.providers import Message, ProviderError, build_provider
from agents.catalogue.providers import _http as provider_http
from agents.catalogue.providers.base import (
    PROVIDER_BAD_RESPONSE,
    PROVIDER_CANCELLED,
    PROVIDER_SERVER_ERROR,
    CancelEvent,
)
from tests.agents.test_provider_http import in_thread
from tests.fakes.model_server import (
    ScriptedModelServer,
    reply_endless,
    reply_error,
    reply_streamed,
    reply_text,
    reply_tool_calls,
)

pytestmark = pytest.mark.timeout(30)

KINDS = {"openai": "openai_compatible", "anthropic": "anthropic"}
TEXT = "The launch moves to April and the team agrees"
CALL = ("fetch_url", {"url": "https://example.com/notes", "max_bytes": 2000})


def provider_for(server: ScriptedModelServer, **kwargs):
    return build_provider(KINDS[server.flavor], base_url=server.url, **kwargs)


def ask(provider, *, on_delta=None, cancel_event=None):
    """One turn, asked from a thread of its own as a worker asks (never from a thread where an
    event loop runs, as Playwright's does in the e2e tests' process)."""
    return in_thread(
        lambda: provider.complete(
            model="test-model",
            messages=[Message(role="user", content="Summarise the notes")],
            tools=[],
            max_tokens=100,
            on_delta=on_delta,
            cancel_event=cancel_event,
        )
    )


def same(streamed, whole) -> None:
    """The same Completion, the tool calls' ids aside (the scripted model makes new ones)."""
    strip = {"tool_calls"}
    assert streamed.model_dump(exclude=strip) == whole.model_dump(exclude=strip)
    assert [c.model_dump(exclude={"id"}) for c in streamed.tool_calls] == [
        c.model_dump(exclude={"id"}) for c in whole.tool_calls
    ]


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@pytest.mark.parametrize("keep_alive", [False, True], ids=["close-delimited", "chunked"])
def test_a_streamed_turn_is_the_whole_answer_and_its_pieces_come_in_order(flavor, keep_alive):
    turns = [
        reply_text(TEXT, reasoning="the hidden chain of thought", pace=0.01),
        reply_tool_calls([CALL], text="Let me read it", pace=0.01),
    ]
    with ScriptedModelServer(turns + turns, flavor=flavor, keep_alive=keep_alive) as server:
        provider = provider_for(server)
        pieces: list[tuple[str, dict]] = []
        streamed = [ask(provider, on_delta=lambda k, d: pieces.append((k, d))) for _ in turns]
        whole = [ask(provider) for _ in turns]
        asked = [r.json.get("stream") for r in server.completion_requests]
    assert asked[:2] == [True, True] and not any(asked[2:])
    for s, w in zip(streamed, whole, strict=True):
        same(s, w)
    assert streamed[0].text == TEXT and streamed[0].stop_reason == "end"
    assert streamed[1].tool_calls[0].arguments == CALL[1]
    text = "".join(d["text"] for k, d in pieces if k == "text")
    assert text == TEXT + "Let me read it"
    assert len([k for k, _ in pieces if k == "text"]) > 5  # word by word, not whole
    calls = [d for k, d in pieces if k == "tool_call"]
    assert calls[0]["name"] == "fetch_url" and {c["index"] for c in calls} == {0}
    assert "".join(c["arguments"] for c in calls) == streamed[1].tool_calls[0].arguments_raw
    assert "hidden" not in repr(pieces)  # reasoning is never handed over


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_pieces_arrive_while_the_answer_is_still_being_written(flavor):
    with ScriptedModelServer([reply_streamed(TEXT, seconds=1.5)], flavor=flavor) as server:
        provider = provider_for(server)
        started = time.monotonic()
        times: list[float] = []
        completion = ask(provider, on_delta=lambda k, d: times.append(time.monotonic()))
        ended = time.monotonic()
    assert completion.text == TEXT
    assert times[0] - started < 0.5  # the first word, well before the end
    assert ended - started > 1.2
    assert ended - times[0] > 1.0


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_a_server_that_answers_whole_to_a_streamed_request_is_read_as_before(flavor):
    with ScriptedModelServer([reply_text(TEXT)] * 2, flavor=flavor, streams=False) as server:
        provider = provider_for(server)
        pieces: list = []
        streamed = ask(provider, on_delta=lambda k, d: pieces.append(d))
        whole = ask(provider)
        assert server.completion_requests[0].json["stream"] is True
    same(streamed, whole)
    assert pieces == []  # nothing came in pieces: the stored turn is all there is


def test_a_server_that_refuses_the_stream_field_is_asked_again_whole():
    """...and the provider (a run's) remembers: its next turn is asked whole at once, not
    refused first again."""
    refusal = {"error": {"message": "Unrecognized request argument supplied: stream"}}
    script = [reply_error(400, refusal), reply_text(TEXT), reply_text("again")]
    with ScriptedModelServer(script) as server:
        provider = provider_for(server)
        completion = ask(provider, on_delta=lambda k, d: None)
        assert ask(provider, on_delta=lambda k, d: None).text == "again"
        asked = [r.json.get("stream") for r in server.completion_requests]
    assert completion.text == TEXT
    assert asked == [True, False, False]
    with ScriptedModelServer([reply_text(TEXT, pace=0.01)]) as server:
        # Another run's provider asks for a stream again (the connection test decides for all).
        ask(provider_for(server), on_delta=lambda k, d: None)
        assert server.completion_requests[0].json.get("stream") is True


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@pytest.mark.parametrize("keep_alive", [False, True], ids=["close-delimited", "chunked"])
def test_a_stream_cut_off_mid_turn_is_an_interrupted_request(flavor, keep_alive):
    step = reply_text(TEXT, pace=0.01, cut_after=4)
    with ScriptedModelServer([step], flavor=flavor, keep_alive=keep_alive) as server:
        pieces: list = []
        with pytest.raises(ProviderError) as info:
            ask(provider_for(server), on_delta=lambda k, d: pieces.append(d))
    assert info.value.code == PROVIDER_SERVER_ERROR
    assert info.value.transient  # retried as an interrupted request is
    assert pieces  # some of it was shown before the cut


def test_the_byte_cap_counts_the_whole_stream_as_it_grows():
    with ScriptedModelServer([reply_text("word " * 400, pace=0.005)]) as server:
        provider = provider_for(server, max_response_bytes=4000)
        pieces: list = []
        with pytest.raises(ProviderError) as info:
            ask(provider, on_delta=lambda k, d: pieces.append(d))
    assert info.value.code == PROVIDER_BAD_RESPONSE
    assert "exceeds the limit" in info.value.message
    assert pieces  # it was cut as it grew, not after it ended


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_a_cancel_mid_stream_drops_the_connection_at_once(flavor):
    with ScriptedModelServer([reply_streamed(TEXT * 20, seconds=60)], flavor=flavor) as server:
        cancel = CancelEvent()
        first = threading.Event()
        outcome: list = []

        def run() -> None:
            try:
                ask(provider_for(server), on_delta=lambda k, d: first.set(), cancel_event=cancel)
            except ProviderError as exc:
                outcome.append((exc.code, time.monotonic()))

        thread = threading.Thread(target=run)
        thread.start()
        assert first.wait(10)
        cancelled = time.monotonic()
        cancel.set()
        thread.join(5)
        assert server.wait_aborted(3)  # the server saw the connection go
    assert outcome and outcome[0][0] == PROVIDER_CANCELLED
    assert outcome[0][1] - cancelled < 1.0


@pytest.fixture
def scripted_proxy(monkeypatch):
    """HTTP_PROXY names the scripted model: the proxied path (httpx) streams too."""
    server = ScriptedModelServer([reply_streamed(TEXT, seconds=1.0)]).start()
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", server.root_url)
    provider_http.reset_clients()
    yield server
    provider_http.reset_clients()
    server.stop()


def test_through_an_environment_proxy_the_answer_streams_too(scripted_proxy):
    with socket.socket() as sock:  # a target nobody listens on: only the proxy answers
        sock.bind(("127.0.0.1", 0))
        target = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    provider = build_provider("openai_compatible", base_url=target)
    times: list[float] = []
    completion = ask(provider, on_delta=lambda k, d: times.append(time.monotonic()))
    ended = time.monotonic()
    assert completion.text == TEXT
    assert len(times) == len(TEXT.split())
    assert ended - times[0] > 0.5  # the first word came long before the end


# -- the output-per-turn limit, as the stream grows --------------------------------------------


def ask_at_most(provider, max_tokens: int, *, on_delta=None):
    return in_thread(
        lambda: provider.complete(
            model="test-model",
            messages=[Message(role="user", content="Summarise the notes")],
            tools=[],
            max_tokens=max_tokens,
            on_delta=on_delta,
        )
    )


def shown(pieces) -> int:
    """Characters handed to `on_delta`: text, and tool calls' names and arguments."""
    return sum(
        len(d.get("text", "")) + len(d.get("name", "")) + len(d.get("arguments", ""))
        for d in pieces
    )


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@pytest.mark.parametrize("tool_call", [None, "write_artifact"], ids=["text", "tool-call"])
def test_a_server_that_streams_past_the_output_limit_is_cut_off_and_the_turn_is_truncated(
    flavor, tool_call
):
    """The server ignores max_tokens and writes forever: once what it wrote is more than
    max_tokens tokens can be (`MAX_CHARS_PER_TOKEN` characters each) the connection is dropped,
    and the turn is one truncated at the limit, with nothing of what was written in it."""
    limit = 20
    with ScriptedModelServer(
        [reply_endless("and more ", tool_call=tool_call)], flavor=flavor
    ) as server:
        pieces: list[dict] = []
        completion = ask_at_most(
            provider_for(server), limit, on_delta=lambda k, d: pieces.append(d)
        )
        assert server.wait_aborted(10)  # it dropped the connection (the server writes 60 s)
        assert server.completion_requests[0].json["max_tokens"] == limit
    assert completion.stop_reason == "length" and completion.truncated_or_declined
    assert completion.raw_stop_reason == provider_http.OUTPUT_LIMIT_EXCEEDED
    assert completion.text == "" and completion.tool_calls == []
    bound = limit * provider_http.MAX_CHARS_PER_TOKEN
    # Cut at the bound: the piece that passes it is not handed over.
    assert bound - len("and more ") < shown(pieces) <= bound
    assert completion.output_tokens > limit


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_a_stream_that_counts_its_tokens_is_cut_by_its_own_count(flavor):
    """A stream that reports its output tokens as it goes (vLLM's continuous usage stats, an
    Anthropic message_delta before the end) is cut as soon as its count is clearly past the
    limit, long before its characters would prove it."""
    limit = 100
    step = reply_endless("word ", count_tokens=True)
    with ScriptedModelServer([step], flavor=flavor) as server:
        pieces: list[dict] = []
        completion = ask_at_most(
            provider_for(server), limit, on_delta=lambda k, d: pieces.append(d)
        )
        assert server.wait_aborted(10)
    assert completion.stop_reason == "length" and completion.text == ""
    allowed = limit + limit // 4 + 16  # `past_limit`'s tolerance
    assert completion.output_tokens == allowed + 1  # the count that passed the tolerance
    assert allowed <= len(pieces) <= allowed + 1  # (OpenAI's count comes with its piece)
    assert shown(pieces) < limit * provider_http.MAX_CHARS_PER_TOKEN


OVER = {"openai": {"completion_tokens": 500}, "anthropic": {"output_tokens": 500}}


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_an_answer_that_counts_more_tokens_than_asked_is_truncated_at_the_limit(flavor, streamed):
    """A whole answer (or a stream's end) whose usage says the server wrote clearly more than
    max_tokens: the server ignored the limit, and the turn is treated as one truncated at it,
    as a whole answer with finish_reason "length" is (its text kept, the turn discarded)."""
    script = [reply_text(TEXT, usage=OVER[flavor]), reply_text(TEXT, usage=OVER[flavor])]
    with ScriptedModelServer(script, flavor=flavor) as server:
        provider = provider_for(server)
        on_delta = (lambda k, d: None) if streamed else None
        over = ask_at_most(provider, 100, on_delta=on_delta)
        within = ask_at_most(provider, 400, on_delta=on_delta)  # 500 is within 400's tolerance
    assert over.stop_reason == "length" and over.truncated_or_declined
    assert over.raw_stop_reason == provider_http.OUTPUT_LIMIT_EXCEEDED
    assert over.text == TEXT and over.output_tokens == 500
    assert within.stop_reason == "end" and within.text == TEXT


@pytest.mark.parametrize(
    ("usage", "reasoning", "truncated"),
    [
        (
            {"completion_tokens": 500, "completion_tokens_details": {"reasoning_tokens": 450}},
            "why",
            False,
        ),
        ({"completion_tokens": 500}, "thinking it over", False),  # reasoning, count unsplit
        (
            {"completion_tokens": 500, "completion_tokens_details": {"reasoning_tokens": 100}},
            "why",
            True,
        ),
    ],
    ids=["reasoning-counted-apart", "reasoning-not-split", "visible-output-over"],
)
@pytest.mark.parametrize("streamed", [True, False], ids=["streamed", "whole"])
def test_hidden_reasoning_is_not_held_to_the_output_limit(usage, reasoning, truncated, streamed):
    """Some servers do not hold hidden reasoning to max_tokens: only the visible output's count
    is compared with it, and an answer whose count does not say how much was reasoning is not
    judged by its count."""
    with ScriptedModelServer([reply_text(TEXT, reasoning=reasoning, usage=usage)]) as server:
        on_delta = (lambda k, d: None) if streamed else None
        completion = ask_at_most(provider_for(server), 100, on_delta=on_delta)
    assert (completion.stop_reason == "length") is truncated
    assert completion.text == TEXT


def test_an_anthropic_server_that_refuses_the_stream_field_is_asked_again_whole():
    refusal = {
        "type": "error",
        "error": {"type": "invalid_request_error", "message": "stream: not supported"},
    }
    script = [reply_error(400, refusal), reply_text(TEXT), reply_text("again")]
    with ScriptedModelServer(script, flavor="anthropic") as server:
        provider = provider_for(server)
        completion = ask(provider, on_delta=lambda k, d: None)
        assert ask(provider, on_delta=lambda k, d: None).text == "again"
        asked = [r.json.get("stream") for r in server.completion_requests]
    assert completion.text == TEXT
    assert asked == [True, None, None]  # remembered: the next turn is asked whole at once
