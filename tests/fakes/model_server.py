#!/usr/bin/env python3
"""A scripted fake model server speaking the OpenAI Chat Completions or the Anthropic
Messages wire format over real HTTP (stdlib only, no project imports).

In-process use::

    from tests.fakes.model_server import ScriptedModelServer, reply_text, hang

    with ScriptedModelServer([reply_text("hi"), hang(30)], flavor="openai") as server:
        provider = build_provider("openai_compatible", base_url=server.url)
        ...
        server.requests[-1].json          # what the client sent
        server.wait_aborted(2)            # the client closed a held connection

Standalone (e.g. for crash tests in a separate process)::

    python -m tests.fakes.model_server --flavor openai --port 0 \
        --script steps.json --ready-file ready.txt --record requests.jsonl

(``python tests/fakes/model_server.py ...`` works too.) The ready file receives the base
URL (``server.url``) once listening; the record file gets one JSON line per event:
``{"event": "request", ...}`` for each request and ``{"event": "abort", ...}`` when a client
closes a connection the server was still holding or writing.

Streaming: a text or tool-call step answers a request that asks ``"stream": true`` with
Server-Sent Events, as the real servers do (word by word; ``pace`` seconds between events,
``cut_after`` events before the connection is dropped mid-answer), unless the server was made
with ``streams=False`` (then it answers the whole JSON body, as a server that does not stream).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import select
import signal
import socket
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FLAVORS = ("openai", "anthropic")

# --------------------------------------------------------------------------------------
# Steps
# --------------------------------------------------------------------------------------


@dataclass
class Step:
    """One scripted reaction to a completion request. Build with the helper functions."""

    type: str
    text: str = ""
    calls: list[tuple[str, Any, str | None]] = field(default_factory=list)
    finish: str | None = None
    status: int = 200
    body: Any = None
    content_type: str = "application/json"
    headers: dict[str, str] = field(default_factory=dict)
    seconds: float = 0.0
    bytes_per_sec: int = 0
    total: int = 0
    content_length: bool = True
    reasoning: str | None = None
    refusal: str | None = None
    usage: dict[str, Any] | None = None
    model: str | None = None
    delay: float = 0.0
    then: Step | None = None
    #: Streamed: seconds between two events; ``cut_after``: events sent before the connection
    #: is dropped mid-answer (None: the whole answer).
    pace: float = 0.0
    cut_after: int | None = None


StepLike = Step | Callable[[Any], Any] | dict


def reply_text(
    text: str,
    finish: str | None = None,
    *,
    reasoning: str | None = None,
    refusal: str | None = None,
    usage: dict[str, Any] | None = None,
    model: str | None = None,
    delay: float = 0.0,
    pace: float = 0.0,
    cut_after: int | None = None,
) -> Step:
    """A normal text answer. ``finish`` is the raw wire value (default ``stop`` for openai,
    ``end_turn`` for anthropic). ``reasoning`` adds ``reasoning_content``/``reasoning``
    (openai) or a ``thinking`` + ``redacted_thinking`` block (anthropic). ``refusal`` sets
    the openai ``message.refusal`` field. ``usage`` overrides token counts, using the
    flavor's key names (e.g. ``{"prompt_tokens": 7}`` or ``{"cache_read_input_tokens": 3}``),
    nested ones too: ``{"prompt_tokens_details": {"cached_tokens": 6}, "cost": 0.0012}``
    (OpenAI cached input, OpenRouter's reported cost).
    ``delay`` holds the request that many seconds first (aborts are detected). Streamed (a
    request with ``"stream": true``): ``pace`` seconds between events, ``cut_after`` events
    before the connection drops."""
    return Step(
        "text",
        text=text,
        finish=finish,
        reasoning=reasoning,
        refusal=refusal,
        usage=usage,
        model=model,
        delay=delay,
        pace=pace,
        cut_after=cut_after,
    )


def reply_streamed(text: str, *, seconds: float = 1.5, cut_after: int | None = None) -> Step:
    """A text answer that, streamed, comes word by word over about ``seconds``."""
    events = max(1, len(text.split()))
    return reply_text(text, pace=seconds / events, cut_after=cut_after)


def reply_tool_calls(
    calls: Iterable[tuple],
    finish: str | None = None,
    *,
    text: str = "",
    reasoning: str | None = None,
    usage: dict[str, Any] | None = None,
    model: str | None = None,
    delay: float = 0.0,
    pace: float = 0.0,
    cut_after: int | None = None,
) -> Step:
    """Tool calls: ``[(name, args), ...]`` or ``[(name, args, call_id), ...]``; ``args`` is a
    dict or a raw string sent verbatim (openai ``arguments``; for anthropic a raw string is
    parsed if it is JSON, otherwise sent as a string ``input``)."""
    normalized = []
    for index, call in enumerate(calls):
        name, args = call[0], call[1]
        call_id = call[2] if len(call) > 2 else None
        normalized.append((name, args, call_id or f"call_{index}_{uuid.uuid4().hex[:8]}"))
    return Step(
        "tool_calls",
        text=text,
        calls=normalized,
        finish=finish,
        reasoning=reasoning,
        usage=usage,
        model=model,
        delay=delay,
        pace=pace,
        cut_after=cut_after,
    )


def reply_endless(
    piece: str = "and more ",
    *,
    tool_call: str | None = None,
    pace: float = 0.0,
    count_tokens: bool = False,
    seconds: float = 60.0,
) -> Step:
    """A server that ignores ``max_tokens``: asked to stream, it writes ``piece`` after ``piece``
    (as text, or as the arguments of a call of ``tool_call``), ``pace`` seconds apart, until the
    client leaves (an abort is recorded) or ``seconds`` pass; ``count_tokens`` adds its count of
    output tokens so far (one a piece) to every event, as vLLM's continuous usage stats do (an
    Anthropic ``message_delta`` with usage and no stop reason). Asked for a whole answer, it
    answers ``piece`` once."""
    return Step(
        "endless",
        text=piece,
        calls=[(tool_call, {}, f"call_{uuid.uuid4().hex[:8]}")] if tool_call else [],
        pace=pace,
        seconds=seconds,
        usage={"count": True} if count_tokens else None,
    )


def reply_error(status: int, body: Any = None, *, headers: dict[str, str] | None = None) -> Step:
    """An HTTP error. ``body``: dict/list (sent as JSON), str/bytes (sent verbatim) or None
    (a flavor-typical error object)."""
    return Step("error", status=status, body=body, headers=dict(headers or {}))


def reply_json(status: int, obj: Any, *, headers: dict[str, str] | None = None) -> Step:
    """Any JSON document with any status (e.g. wrong-shaped 200 answers)."""
    return Step("json", status=status, body=obj, headers=dict(headers or {}))


def reply_raw(
    status: int, data: bytes | str, content_type: str = "application/octet-stream"
) -> Step:
    """Raw bytes with the given status and content type (garbage bodies)."""
    return Step("raw", status=status, body=data, content_type=content_type)


def hang(seconds: float, then: Step | None = None) -> Step:
    """Hold the request open without answering; afterwards send ``then`` or close the
    connection without a response. Records an abort if the client closes first."""
    return Step("hang", seconds=seconds, then=then)


def trickle(bytes_per_sec: int, total: int) -> Step:
    """Slow-loris: send 200 + headers, then a valid (space-padded) JSON answer of ``total``
    bytes at about ``bytes_per_sec``."""
    return Step("trickle", bytes_per_sec=max(1, int(bytes_per_sec)), total=int(total))


def huge(n_bytes: int | None, *, content_length: bool = True) -> Step:
    """A 200 answer of ``n_bytes`` junk bytes (``None`` = endless until the client leaves);
    ``content_length=False`` omits the header (body delimited by connection close)."""
    return Step(
        "huge", total=-1 if n_bytes is None else int(n_bytes), content_length=content_length
    )


def step_from_dict(data: StepLike) -> StepLike:
    """Build a Step from a JSON-able dict (script files); Steps and callables pass through.

    Types: ``text`` (text, finish, reasoning, refusal, usage, model, delay), ``tool_calls``
    (calls: [{name, arguments, id?}], text, finish, usage, delay), ``error`` (status, body,
    headers), ``json`` (status, body), ``raw`` (status, body, content_type), ``hang``
    (seconds, then), ``trickle`` (bytes_per_sec, total), ``huge`` (bytes, content_length).
    """
    if isinstance(data, Step) or callable(data):
        return data
    if not isinstance(data, dict) or "type" not in data:
        raise ValueError(f"step must be a dict with a 'type': {data!r}")
    kind = data["type"]
    keys = ("usage", "model", "delay", "reasoning", "pace", "cut_after")
    common = {k: data[k] for k in keys if k in data}
    if kind == "text":
        return reply_text(
            data.get("text", ""), data.get("finish"), refusal=data.get("refusal"), **common
        )
    if kind == "tool_calls":
        calls = [(c["name"], c.get("arguments", {}), c.get("id")) for c in data.get("calls", [])]
        return reply_tool_calls(calls, data.get("finish"), text=data.get("text", ""), **common)
    if kind == "error":
        return reply_error(
            int(data.get("status", 500)), data.get("body"), headers=data.get("headers")
        )
    if kind == "json":
        return reply_json(
            int(data.get("status", 200)), data.get("body"), headers=data.get("headers")
        )
    if kind == "raw":
        return reply_raw(
            int(data.get("status", 200)),
            data.get("body", ""),
            data.get("content_type", "application/octet-stream"),
        )
    if kind == "hang":
        then = data.get("then")
        return hang(float(data.get("seconds", 3600)), step_from_dict(then) if then else None)
    if kind == "trickle":
        return trickle(int(data.get("bytes_per_sec", 10)), int(data.get("total", 1000)))
    if kind == "huge":
        return huge(data.get("bytes"), content_length=bool(data.get("content_length", True)))
    raise ValueError(f"unknown step type {kind!r}")


# --------------------------------------------------------------------------------------
# Wire rendering
# --------------------------------------------------------------------------------------


def _default_error_body(flavor: str, status: int) -> dict:
    if flavor == "anthropic":
        kind = {
            401: "authentication_error",
            403: "permission_error",
            429: "rate_limit_error",
            529: "overloaded_error",
        }.get(status, "api_error" if status >= 500 else "invalid_request_error")
        return {"type": "error", "error": {"type": kind, "message": f"fake error {status}"}}
    kind = {429: "rate_limit_exceeded", 401: "invalid_api_key"}.get(status, "fake_error")
    return {"error": {"message": f"fake error {status}", "type": kind, "code": kind}}


def _prompt_cache_usage(request_json: Any, defaults: dict[str, Any]) -> dict[str, int]:
    """Anthropic prompt caching, emulated: the prefix up to the last ``cache_control`` mark
    (tools, then system) is written to the cache the first time and read from it after."""
    if not isinstance(request_json, dict):
        return {}
    system = request_json.get("system")
    blocks = [*(request_json.get("tools") or []), *(system if isinstance(system, list) else [])]
    marked = [i for i, b in enumerate(blocks) if isinstance(b, dict) and b.get("cache_control")]
    if not marked:
        return {}
    prefix = json.dumps(blocks[: marked[-1] + 1], sort_keys=True)
    tokens = max(1, len(prefix) // 4)
    seen = defaults.setdefault("cache_seen", set())
    if prefix in seen:
        return {"cache_read_input_tokens": tokens, "cache_creation_input_tokens": 0}
    seen.add(prefix)
    return {"cache_read_input_tokens": 0, "cache_creation_input_tokens": tokens}


def render_reply(step: Step, flavor: str, request_json: Any, defaults: dict[str, Any]) -> dict:
    """The JSON body for a text/tool_calls step in the given flavor."""
    model = (
        step.model
        or (request_json.get("model") if isinstance(request_json, dict) else None)
        or "test-model"
    )
    if flavor == "anthropic":
        content: list[dict] = []
        if step.reasoning is not None:
            content.append({"type": "thinking", "thinking": step.reasoning, "signature": "sig"})
            content.append({"type": "redacted_thinking", "data": "c2VjcmV0"})
        if step.text:
            content.append({"type": "text", "text": step.text})
        for name, args, call_id in step.calls:
            tool_input = args
            if isinstance(args, str):
                with contextlib.suppress(ValueError):
                    tool_input = json.loads(args)
            content.append({"type": "tool_use", "id": call_id, "name": name, "input": tool_input})
        finish = step.finish or ("tool_use" if step.calls else "end_turn")
        usage = {
            "input_tokens": defaults["prompt_tokens"],
            "output_tokens": defaults["completion_tokens"],
        }
        if defaults.get("prompt_cache"):
            usage.update(_prompt_cache_usage(request_json, defaults))
        usage.update(step.usage or {})
        return {
            "id": f"msg_{uuid.uuid4().hex[:12]}",
            "type": "message",
            "role": "assistant",
            "model": model,
            "content": content,
            "stop_reason": finish,
            "stop_sequence": None,
            "usage": usage,
        }
    message: dict[str, Any] = {"role": "assistant", "content": step.text or None}
    if step.type == "text" and step.text == "" and not step.calls:
        message["content"] = ""
    if step.reasoning is not None:
        message["reasoning_content"] = step.reasoning
        message["reasoning"] = step.reasoning
    if step.refusal is not None:
        message["refusal"] = step.refusal
    if step.calls:
        message["tool_calls"] = [
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": args if isinstance(args, str) else json.dumps(args),
                },
            }
            for name, args, call_id in step.calls
        ]
    finish = step.finish or ("tool_calls" if step.calls else "stop")
    usage = {
        "prompt_tokens": defaults["prompt_tokens"],
        "completion_tokens": defaults["completion_tokens"],
    }
    usage.update(step.usage or {})
    usage["total_tokens"] = usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


def _words(text: str) -> list[str]:
    """``text`` in pieces of one word each (with the space after it): joined, the text."""
    pieces: list[str] = []
    for word in text.split(" "):
        pieces.append(word + " ")
    pieces[-1] = pieces[-1][:-1]
    return [p for p in pieces if p]


def _fragments(text: str, n: int = 3) -> list[str]:
    size = max(1, -(-len(text) // n))
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


def _sse(data: Any, name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def _anthropic_stream(whole: dict[str, Any]) -> list[bytes]:
    """A Messages answer as its stream's events (message_start, content blocks, message_delta,
    message_stop)."""
    events: list[bytes] = []

    def emit(data: Any, name: str | None = None) -> None:
        events.append(_sse(data, name))

    usage = whole["usage"]
    start = {**whole, "content": [], "stop_reason": None}
    start["usage"] = {**usage, "output_tokens": 1}
    emit({"type": "message_start", "message": start}, "message_start")
    for index, block in enumerate(whole["content"]):
        kind = block["type"]
        # Each block: how it starts, then the deltas that complete it.
        if kind == "text":
            opening = {"type": "text", "text": ""}
            deltas = [{"type": "text_delta", "text": word} for word in _words(block["text"])]
        elif kind == "tool_use":
            opening = {**block, "input": {}}
            deltas = [
                {"type": "input_json_delta", "partial_json": part}
                for part in _fragments(json.dumps(block["input"]))
            ]
        elif kind == "thinking":
            opening = {"type": "thinking", "thinking": ""}
            deltas = [{"type": "thinking_delta", "thinking": block["thinking"]}]
        else:
            opening, deltas = block, []
        emit(
            {"type": "content_block_start", "index": index, "content_block": opening},
            "content_block_start",
        )
        for delta in deltas:
            emit(
                {"type": "content_block_delta", "index": index, "delta": delta},
                "content_block_delta",
            )
        emit({"type": "content_block_stop", "index": index}, "content_block_stop")
    emit(
        {
            "type": "message_delta",
            "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": None},
            "usage": {"output_tokens": usage.get("output_tokens", 0)},
        },
        "message_delta",
    )
    emit({"type": "message_stop"}, "message_stop")
    return events


def render_stream(step: Step, flavor: str, request_json: Any, defaults: dict[str, Any]) -> list:
    """The Server-Sent Events of a text/tool_calls step, each one's bytes: the same answer as
    `render_reply`'s, in pieces (text word by word, tool-call arguments in fragments)."""
    whole = render_reply(step, flavor, request_json, defaults)
    if flavor == "anthropic":
        return _anthropic_stream(whole)
    events: list[bytes] = []

    def emit(data: Any, name: str | None = None) -> None:
        events.append(_sse(data, name))

    message = whole["choices"][0]["message"]
    head = {k: whole[k] for k in ("id", "created", "model")}
    head["object"] = "chat.completion.chunk"

    def chunk(delta: dict[str, Any], finish: str | None = None) -> None:
        emit({**head, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})

    chunk({"role": "assistant", "content": ""})
    if message.get("reasoning_content"):
        for word in _words(message["reasoning_content"]):
            chunk({"reasoning_content": word})
    for word in _words(message.get("content") or ""):
        chunk({"content": word})
    if message.get("refusal"):
        chunk({"refusal": message["refusal"]})
    for index, call in enumerate(message.get("tool_calls") or []):
        function = call["function"]
        first = {"name": function["name"], "arguments": ""}
        chunk(
            {
                "tool_calls": [
                    {"index": index, "id": call["id"], "type": "function", "function": first}
                ]
            }
        )
        for part in _fragments(function["arguments"]):
            chunk({"tool_calls": [{"index": index, "function": {"arguments": part}}]})
    chunk({}, whole["choices"][0]["finish_reason"])
    emit({**head, "choices": [], "usage": whole["usage"]})
    events.append(b"data: [DONE]\n\n")
    return events


def _endless_anthropic(step: Step, model: str, defaults: dict[str, Any]) -> Iterator[bytes]:
    call = step.calls[0] if step.calls else None
    message = {
        "id": f"msg_{uuid.uuid4().hex[:12]}", "type": "message", "role": "assistant",
        "model": model, "content": [], "stop_reason": None,
        "usage": {"input_tokens": defaults["prompt_tokens"], "output_tokens": 1},
    }  # fmt: skip
    yield _sse({"type": "message_start", "message": message}, "message_start")
    if call:
        block = {"type": "tool_use", "id": call[2], "name": call[0], "input": {}}
        delta = {"type": "input_json_delta", "partial_json": step.text}
    else:
        block = {"type": "text", "text": ""}
        delta = {"type": "text_delta", "text": step.text}
    start = {"type": "content_block_start", "index": 0, "content_block": block}
    yield _sse(start, "content_block_start")
    piece = {"type": "content_block_delta", "index": 0, "delta": delta}
    for n in itertools.count(1):
        yield _sse(piece, "content_block_delta")
        if step.usage:
            count = {"type": "message_delta", "delta": {}, "usage": {"output_tokens": n}}
            yield _sse(count, "message_delta")


def render_endless(
    step: Step, flavor: str, request_json: Any, defaults: dict[str, Any]
) -> Iterator[bytes]:
    """The Server-Sent Events of `reply_endless`: a turn that never finishes."""
    model = (request_json or {}).get("model") or "test-model"
    if flavor == "anthropic":
        yield from _endless_anthropic(step, model, defaults)
        return
    call = step.calls[0] if step.calls else None
    head = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "object": "chat.completion.chunk",
        "created": int(time.time()), "model": model,
    }  # fmt: skip

    def chunk(delta: dict, n: int) -> bytes:
        data = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        if step.usage:  # a count as it goes (vLLM's continuous usage stats)
            data["usage"] = {"prompt_tokens": defaults["prompt_tokens"], "completion_tokens": n}
        return _sse(data)

    if call:
        first = {"index": 0, "id": call[2], "type": "function"}
        first["function"] = {"name": call[0], "arguments": ""}
        yield chunk({"role": "assistant", "tool_calls": [first]}, 0)
        delta: dict[str, Any] = {"tool_calls": [{"index": 0, "function": {"arguments": step.text}}]}
    else:
        yield chunk({"role": "assistant", "content": ""}, 0)
        delta = {"content": step.text}
    for n in itertools.count(1):
        yield chunk(delta, n)


# --------------------------------------------------------------------------------------
# Server
# --------------------------------------------------------------------------------------


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    json: Any
    time: float

    def to_dict(self) -> dict:
        return {
            "event": "request",
            "method": self.method,
            "path": self.path,
            "headers": self.headers,
            "json": self.json,
            "time": self.time,
        }


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False
    allow_reuse_address = True
    request_queue_size = 64
    owner: ScriptedModelServer


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.0"  # one request per connection; close delimits bodies
    disable_nagle_algorithm = True  # headers and body are separate writes

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- entry points --------------------------------------------------------------------

    def do_GET(self) -> None:
        owner = self.server.owner
        rec = self._record(b"")
        path = rec.path.split("?", 1)[0].rstrip("/")
        if owner.flavor == "openai" and path in ("/v1/models", "/models"):
            self._send_json(200, owner.models_body())
        elif path in ("", "/health"):
            self._send_json(200, {"status": "ok"})
        else:
            self._send_json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})

    def do_POST(self) -> None:
        owner = self.server.owner
        length = int(self.headers.get("content-length") or 0)
        body = self.rfile.read(length) if length > 0 else b""
        rec = self._record(body)
        path = rec.path.split("?", 1)[0]
        if not path.endswith(owner.completion_suffix):
            self._send_json(404, {"error": {"message": f"no route {path}", "type": "not_found"}})
            return
        step = owner.next_step(rec.json)
        self._play(step, rec.json)

    # -- helpers -------------------------------------------------------------------------

    def _record(self, body: bytes) -> RecordedRequest:
        try:
            parsed = json.loads(body) if body else None
        except ValueError:
            parsed = None
        rec = RecordedRequest(
            method=self.command,
            path=self.path,
            headers={k.lower(): v for k, v in self.headers.items()},
            body=body,
            json=parsed,
            time=time.time(),
        )
        self.server.owner.add_request(rec)
        return rec

    def _aborted(self) -> None:
        self.close_connection = True
        self.server.owner.add_abort(self.path)

    def _hold(self, seconds: float) -> bool:
        """Keep the connection open for ``seconds``; False if the client closed it (or the
        server is stopping)."""
        owner = self.server.owner
        end = time.monotonic() + seconds
        sock = self.connection
        while (left := end - time.monotonic()) > 0:
            if owner.stopping.is_set():
                return False
            try:
                # Asleep until the time is up, the client closes or the server stops (its
                # pipe turns readable): no polling, so 500 held requests cost no CPU.
                readable, _, _ = select.select([sock, owner.stop_fd], [], [], left)
                if owner.stop_fd in readable:
                    return False
                if readable:
                    data = sock.recv(1, socket.MSG_PEEK)
                    if not data:
                        self._aborted()
                        return False
                    time.sleep(0.05)
            except (OSError, ValueError):
                self._aborted()
                return False
        return True

    def _write(self, data: bytes) -> bool:
        try:
            self.wfile.write(data)
            self.wfile.flush()
            return True
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._aborted()
            return False

    def _send(self, status: int, body: bytes, content_type: str, headers: dict | None = None):
        try:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            for key, value in (headers or {}).items():
                self.send_header(key, value)
            self.end_headers()
        except (BrokenPipeError, ConnectionResetError, OSError):
            self._aborted()
            return
        self._write(body)

    def _send_json(self, status: int, obj: Any, headers: dict | None = None) -> None:
        self._send(status, json.dumps(obj).encode(), "application/json", headers)

    def _play(self, step: Step, request_json: Any) -> None:
        owner = self.server.owner
        if step.delay and not self._hold(step.delay):
            return
        if step.type in ("text", "tool_calls", "endless"):
            asked = isinstance(request_json, dict) and request_json.get("stream") is True
            if asked and owner.streams:
                self._stream(step, request_json)
            else:
                whole = reply_text(step.text) if step.type == "endless" else step
                self._send_json(
                    200, render_reply(whole, owner.flavor, request_json, owner.defaults)
                )
        elif step.type == "error":
            body = (
                step.body
                if step.body is not None
                else _default_error_body(owner.flavor, step.status)
            )
            if isinstance(body, (dict, list)):
                self._send_json(step.status, body, step.headers)
            else:
                data = body.encode() if isinstance(body, str) else bytes(body)
                self._send(step.status, data, "text/plain", step.headers)
        elif step.type == "json":
            self._send_json(step.status, step.body, step.headers)
        elif step.type == "raw":
            data = step.body.encode() if isinstance(step.body, str) else bytes(step.body)
            self._send(step.status, data, step.content_type, step.headers)
        elif step.type == "hang":
            if self._hold(step.seconds) and step.then is not None:
                self._play(step.then, request_json)
            self.close_connection = True
        elif step.type == "trickle":
            self._trickle(step, request_json)
        elif step.type == "huge":
            self._huge(step)
        else:  # pragma: no cover - step_from_dict validates types
            self._send_json(500, {"error": {"message": f"bad step {step.type}"}})

    def _stream(self, step: Step, request_json: Any) -> None:
        """Server-Sent Events, ``step.pace`` seconds apart (an abort is seen meanwhile):
        chunked on a kept-alive connection, else delimited by the close; ``step.cut_after``
        events, then the connection is dropped with the answer unfinished."""
        owner = self.server.owner
        if step.type == "endless":
            events: Iterable[bytes] = render_endless(
                step, owner.flavor, request_json, owner.defaults
            )
        else:
            events = render_stream(step, owner.flavor, request_json, owner.defaults)
        chunked = self.request_version == "HTTP/1.1" and self.protocol_version == "HTTP/1.1"
        try:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            if chunked:
                self.send_header("Transfer-Encoding", "chunked")
            else:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.flush()
        except OSError:
            self._aborted()
            return
        end = time.monotonic() + (step.seconds or 3600)  # an endless step's bound
        for sent, event in enumerate(events):
            if owner.stopping.is_set() or time.monotonic() > end:
                self.close_connection = True
                return
            if step.cut_after is not None and sent >= step.cut_after:
                self.close_connection = True
                with contextlib.suppress(OSError):
                    self.connection.shutdown(socket.SHUT_RDWR)
                return
            if sent and step.pace and not self._hold(step.pace):
                return
            data = b"%x\r\n%s\r\n" % (len(event), event) if chunked else event
            if not self._write(data):
                return
        if chunked:
            self._write(b"0\r\n\r\n")
        else:
            self.close_connection = True

    def _trickle(self, step: Step, request_json: Any) -> None:
        owner = self.server.owner
        answer = json.dumps(
            render_reply(reply_text("trickled"), owner.flavor, request_json, owner.defaults)
        ).encode()
        body = b" " * max(0, step.total - len(answer)) + answer
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.flush()
        except OSError:
            self._aborted()
            return
        chunk = max(1, step.bytes_per_sec // 10)
        interval = chunk / step.bytes_per_sec
        for start in range(0, len(body), chunk):
            if owner.stopping.is_set() or not self._write(body[start : start + chunk]):
                return
            time.sleep(interval)

    def _huge(self, step: Step) -> None:
        owner = self.server.owner
        try:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            if step.content_length and step.total >= 0:
                self.send_header("Content-Length", str(step.total))
            self.end_headers()
        except OSError:
            self._aborted()
            return
        block = b'{"junk":"' + b"a" * (256 * 1024)
        remaining = step.total
        while remaining != 0 and not owner.stopping.is_set():
            piece = block if remaining < 0 else block[: min(len(block), remaining)]
            if not self._write(piece):
                return
            if remaining > 0:
                remaining -= len(piece)
        self.close_connection = True


class _KeepAliveHandler(_Handler):
    """HTTP/1.1 with persistent connections, as a deployed model server keeps them (every reply
    of a text or tool-call step has a Content-Length; a hang, a huge body or a trickle closes)."""

    protocol_version = "HTTP/1.1"


class ScriptedModelServer:
    """A real HTTP model server on 127.0.0.1 answering from a script of steps.

    ``script``: steps (Step objects, step dicts, or callables ``(request_json) -> step``)
    consumed in order by completion requests; afterwards ``default`` (reply_text("done")).
    """

    def __init__(
        self,
        script: Iterable[StepLike] | None = None,
        *,
        flavor: str = "openai",
        default: StepLike | None = None,
        host: str = "127.0.0.1",
        port: int = 0,
        context_length: int | None = 8192,
        model_ids: Iterable[str] = ("test-model",),
        models: Any = None,
        prompt_tokens: int = 10,
        completion_tokens: int = 5,
        record_path: str | os.PathLike | None = None,
        prompt_cache: bool = False,
        keep_alive: bool = False,
        streams: bool = True,
    ) -> None:
        if flavor not in FLAVORS:
            raise ValueError(f"flavor must be one of {FLAVORS}")
        self.flavor = flavor
        self.host = host
        self._port = port
        self._script: list[StepLike] = [step_from_dict(s) for s in (script or [])]
        self.default = step_from_dict(default) if default is not None else reply_text("done")
        self.context_length = context_length
        self.model_ids = list(model_ids)
        self.models = models
        # prompt_cache (anthropic): report cache writes/reads for the cache_control prefix.
        self.defaults = {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "prompt_cache": prompt_cache,
        }
        self.record_path = os.fspath(record_path) if record_path else None
        self.requests: list[RecordedRequest] = []
        self.aborted = threading.Event()
        self.aborts: list[str] = []
        self.stopping = threading.Event()
        self.keep_alive = keep_alive
        self.streams = streams
        self.stop_fd = -1  # readable once the server stops (a held request wakes on it)
        self._stop_w = -1
        self._lock = threading.Lock()
        self._new_request = threading.Condition(self._lock)
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- lifecycle -----------------------------------------------------------------------

    def start(self) -> ScriptedModelServer:
        if self._httpd is not None:
            return self
        httpd = _HTTPServer(
            (self.host, self._port), _KeepAliveHandler if self.keep_alive else _Handler
        )
        httpd.owner = self
        self._httpd = httpd
        self.stopping.clear()
        self.stop_fd, self._stop_w = os.pipe()
        weakref.finalize(self, os.close, self.stop_fd)
        self._thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        httpd, self._httpd = self._httpd, None
        if httpd is None:
            return
        self.stopping.set()
        os.write(self._stop_w, b"x")
        httpd.shutdown()
        httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        # The read end stays open while a handler may still select on it (closed with self).
        os.close(self._stop_w)

    def __enter__(self) -> ScriptedModelServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- addresses -----------------------------------------------------------------------

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("server not started")
        return self._httpd.server_address[1]

    @property
    def root_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """The base URL to configure: ``.../v1`` for openai, the root for anthropic."""
        return self.root_url + ("/v1" if self.flavor == "openai" else "")

    @property
    def completion_suffix(self) -> str:
        return "/chat/completions" if self.flavor == "openai" else "/messages"

    # -- script --------------------------------------------------------------------------

    def enqueue(self, *steps: StepLike) -> None:
        with self._lock:
            self._script.extend(step_from_dict(s) for s in steps)

    @property
    def remaining_steps(self) -> int:
        with self._lock:
            return len(self._script)

    def next_step(self, request_json: Any) -> Step:
        with self._lock:
            step = self._script.pop(0) if self._script else self.default
        for _ in range(10):  # callables may return callables; bounded
            if isinstance(step, Step):
                return step
            step = step_from_dict(step(request_json) if callable(step) else step)
        raise ValueError("callable step did not produce a Step")

    def models_body(self) -> Any:
        if self.models is not None:
            return self.models
        entries = []
        for model_id in self.model_ids:
            entry: dict[str, Any] = {"id": model_id, "object": "model", "owned_by": "fake"}
            if self.context_length is not None:
                entry["context_length"] = self.context_length
            entries.append(entry)
        return {"object": "list", "data": entries}

    # -- observations --------------------------------------------------------------------

    def add_request(self, rec: RecordedRequest) -> None:
        with self._new_request:
            self.requests.append(rec)
            self._append_record(rec.to_dict())
            self._new_request.notify_all()

    def add_abort(self, path: str) -> None:
        with self._lock:
            self.aborts.append(path)
            self._append_record({"event": "abort", "path": path, "time": time.time()})
        self.aborted.set()

    @property
    def abort_count(self) -> int:
        with self._lock:
            return len(self.aborts)

    @property
    def completion_requests(self) -> list[RecordedRequest]:
        """Recorded POSTs to the completion path (not /models etc.)."""
        with self._lock:
            return [
                r
                for r in self.requests
                if r.method == "POST" and r.path.split("?")[0].endswith(self.completion_suffix)
            ]

    def wait_aborted(self, timeout: float) -> bool:
        return self.aborted.wait(timeout)

    def wait_for_requests(self, count: int, timeout: float) -> bool:
        """Wait until at least ``count`` requests (any path) were received."""
        end = time.monotonic() + timeout
        with self._new_request:
            while len(self.requests) < count:
                left = end - time.monotonic()
                if left <= 0:
                    return False
                self._new_request.wait(left)
        return True

    def _append_record(self, line: dict) -> None:  # caller holds the lock
        if not self.record_path:
            return
        with open(self.record_path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line, default=str) + "\n")
            fh.flush()


# --------------------------------------------------------------------------------------
# Standalone process
# --------------------------------------------------------------------------------------


def load_script(path: str | os.PathLike) -> list[StepLike]:
    with open(path, encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, list):
        raise ValueError("script file must contain a JSON list of step objects")
    return [step_from_dict(item) for item in data]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--flavor", choices=FLAVORS, default="openai")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--script", help="JSON file: a list of step objects")
    parser.add_argument("--default", help="JSON step object used once the script is exhausted")
    parser.add_argument("--ready-file", help="write the base URL here once listening")
    parser.add_argument("--record", help="append one JSON line per request/abort here")
    parser.add_argument("--context-length", type=int, default=8192)
    parser.add_argument("--model-id", action="append", dest="model_ids")
    args = parser.parse_args(argv)

    server = ScriptedModelServer(
        load_script(args.script) if args.script else [],
        flavor=args.flavor,
        default=json.loads(args.default) if args.default else None,
        host=args.host,
        port=args.port,
        context_length=args.context_length,
        model_ids=args.model_ids or ["test-model"],
        record_path=args.record,
    )
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    server.start()
    if args.ready_file:
        tmp = f"{args.ready_file}.tmp{os.getpid()}"
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(server.url)
        os.replace(tmp, args.ready_file)
    else:
        print(server.url, flush=True)
    try:
        while not done.wait(0.2):
            pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
