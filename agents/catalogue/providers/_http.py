"""Shared HTTP machinery for the HTTP providers.

Every request runs on the process's event loop (`core.fibers`): a run waiting for its model
holds no thread (in a worker it steps aside; elsewhere the caller's thread waits). The exchange
itself is `_wire`'s, on asyncio's transport (a fraction of the CPU of a client library's, which
matters: one loop carries every request of a worker process); with a proxy in the environment
(``HTTP_PROXY``, ``HTTPS_PROXY``, ``ALL_PROXY``, ``NO_PROXY``) it is `httpx.AsyncClient`'s, which
applies it. The caller's cancel event cancels the request's task — called back by a
`CancelEvent`, polled for a plain `threading.Event` — and the connection is aborted. An overall
deadline bounds the whole exchange (slow-loris servers). The body is capped as it arrives,
counting decoded bytes; redirects are never followed. A streamed answer (Server-Sent Events) is
handed to the caller's `on_body` piece by piece as it arrives, on the loop, on either path.

httpx's clients (the proxied path) are kept per endpoint and shared by the requests in flight, at
most `SHARD` per client: httpcore's pool does work for each waiting request against each of its
connections when one is assigned, so a single client for thousands of requests in flight costs
quadratic CPU (encode/httpcore#1035).
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import functools
import json
import logging
import math
import re
import ssl
import threading
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any, NamedTuple

import httpx

from core import fibers

from . import _wire
from .base import (
    PROVIDER_AUTH,
    PROVIDER_BAD_REQUEST,
    PROVIDER_BAD_RESPONSE,
    PROVIDER_CANCELLED,
    PROVIDER_OUTPUT_TOO_LARGE,
    PROVIDER_QUOTA,
    PROVIDER_RATE_LIMITED,
    PROVIDER_SERVER_ERROR,
    PROVIDER_TIMEOUT,
    PROVIDER_UNREACHABLE,
    CancelEvent,
    Completion,
    Provider,
    ProviderError,
)

log = logging.getLogger("acthelm.providers")

CANCEL_POLL_INTERVAL = 0.1
_ERROR_TEXT_LIMIT = 500
#: How long an idle kept-alive connection is trusted (httpx's default).
_KEEPALIVE_EXPIRY = 5.0
#: Requests in flight one client carries (its connection limit); more open another client.
SHARD = 64

# Wording that turns a 429 into a quota problem.
_QUOTA_RE = re.compile(
    r"quota|billing|credit|payment required|insufficient[_ ]funds", re.IGNORECASE
)
# Stronger wording that turns another 4xx (e.g. Anthropic's 400 "credit balance is too
# low") into a quota problem.
_STRONG_QUOTA_RE = re.compile(
    r"credit balance|insufficient_quota|exceeded your current quota|billing", re.IGNORECASE
)


@dataclass(frozen=True)
class HttpResponse:
    status: int
    headers: httpx.Headers
    body: bytes

    def json(self, provider: Provider) -> Any:
        """Parse the body as JSON or raise ``provider_bad_response``."""
        try:
            return json.loads(self.body)
        except (ValueError, UnicodeDecodeError):
            # Redacted before it is cut: a cut through the key would leave part of it.
            snippet = provider.redact(self.body[:20000].decode("utf-8", "replace"))[:200]
            raise provider.error(
                PROVIDER_BAD_RESPONSE,
                f"response is not valid JSON: {snippet!r}",
                status=self.status,
            ) from None


def request(
    provider: Provider,
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    json_body: Any = None,
    encoded_body: bytes | None = None,
    cancel_event: threading.Event | None = None,
    timeout: float | None = None,
    on_body: OnBody | None = None,
) -> HttpResponse:
    """Send one request and return the full (capped) response; raise ProviderError on
    transport problems, timeout, cancellation or an oversized body. HTTP error statuses are
    returned, not raised: the caller classifies them with ``raise_for_status``. The body is
    ``json_body`` encoded here, or ``encoded_body``, JSON the caller encoded already.
    ``on_body(status, headers, piece)`` is called on the loop with each decoded piece of the
    body as it arrives (the whole body is returned as well); what it raises ends the request."""
    provider.check_config()
    provider.check_request_url(url)
    if cancel_event is not None and cancel_event.is_set():
        raise provider.error(PROVIDER_CANCELLED, "request cancelled before it was sent")
    content = encoded_body
    if json_body is not None:
        content = json.dumps(json_body, ensure_ascii=False).encode("utf-8")
    if content is not None:
        headers = {"content-type": "application/json", **headers}
    body = None if content is None else _wire.Outgoing(content)
    del content, encoded_body  # the exchange takes the bytes when it writes them
    timeout = timeout or provider.timeout
    return fibers.wait(
        _request(provider, method, url, headers, body, cancel_event, timeout, on_body)
    )


# -- clients, on the loop ----------------------------------------------------------------------

type _ClientKey = tuple[str, str, float]
#: What sees a body's pieces as they arrive (on the loop): the status, the headers, the piece.
type OnBody = Callable[[int, httpx.Headers, bytes], None]


@dataclass
class _Client:
    client: httpx.AsyncClient
    in_flight: int = 0


@dataclass
class _Clients:
    """The clients of one endpoint (touched on the loop only)."""

    shards: list[_Client] = field(default_factory=list)

    def take(self, timeout: float) -> _Client:
        for shard in self.shards:
            if shard.in_flight < SHARD:
                break
        else:
            shard = _Client(_new_client(timeout))
            self.shards.append(shard)
        shard.in_flight += 1
        return shard


_clients: dict[_ClientKey, _Clients] = {}
#: The direct path's kept-alive connections (touched on the loop only).
_direct = _wire.Pool()
#: The headers sent unless the request sets them (what httpx sends by default).
_DEFAULTS = (
    ("accept", "*/*"),
    ("accept-encoding", "gzip, deflate"),
    ("connection", "keep-alive"),
    ("user-agent", f"python-httpx/{httpx.__version__}"),
)


@functools.cache
def _proxied() -> bool:
    """Whether the environment names a proxy (read once, as a client reads it once)."""
    return any(urllib.request.getproxies().values())


def reset_clients() -> None:
    """Close every kept client: the next requests open new ones, which read the environment's
    proxy settings again (a client reads them once, when it is made)."""

    async def close() -> None:
        shards = [shard for clients in _clients.values() for shard in clients.shards]
        _clients.clear()
        _direct.close()
        _proxied.cache_clear()
        for shard in shards:
            await shard.client.aclose()

    fibers.wait(close())


def _new_client(timeout: float) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        verify=_ssl_context(),
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        limits=httpx.Limits(
            max_connections=SHARD,
            max_keepalive_connections=SHARD,
            keepalive_expiry=_KEEPALIVE_EXPIRY,
        ),
    )


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """Building an SSL context (loading the CA bundle) costs ~50 ms: once per process (an
    SSLContext may be shared by clients and threads)."""
    return httpx.create_ssl_context()


class _Canceller:
    """Cancels the request's task when the caller's event is set: called back by a
    `CancelEvent` (in the thread that sets it), polled for a plain `threading.Event`. Once
    closed, a late cancel finds nothing to abort (a request that ended stays as it ended)."""

    __slots__ = ("aborted", "event", "loop", "over", "poll", "task")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        task: asyncio.Task[Any],
        event: threading.Event | None,
    ) -> None:
        self.loop, self.task, self.event = loop, task, event
        self.aborted = self.over = False
        self.poll: asyncio.TimerHandle | None = None
        if isinstance(event, CancelEvent):
            event.add_callback(self.wake)
        elif event is not None:
            self.poll = loop.call_later(CANCEL_POLL_INTERVAL, self.check)

    def abort(self) -> None:  # on the loop
        if not self.over:
            self.aborted = True
            self.task.cancel()

    def wake(self) -> None:  # in the thread that set the event
        # RuntimeError: the loop closed meanwhile; the request is over anyway.
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.abort)

    def check(self) -> None:
        if self.event is not None and self.event.is_set():
            self.abort()
        elif not self.over:
            self.poll = self.loop.call_later(CANCEL_POLL_INTERVAL, self.check)

    def close(self) -> None:
        self.over = True
        if isinstance(self.event, CancelEvent):
            self.event.remove_callback(self.wake)
        if self.poll is not None:
            self.poll.cancel()


class _Target(NamedTuple):
    """What the direct exchange needs of a URL."""

    scheme: str
    host: str  # as a person reads it ("" when the URL has none)
    raw_host: str  # as it is connected to (IDNA-encoded)
    port: int
    path: str  # the request target: path and query, as sent
    netloc: str  # the Host header


@functools.lru_cache(maxsize=256)
def _target(url: str) -> _Target:
    """`url` parsed once for all the requests to it (a run's requests go to one URL; a
    NamedTuple of strings, shared by the runs). Raises what httpx.URL raises."""
    parsed = httpx.URL(url)
    return _Target(
        scheme=parsed.scheme,
        host=parsed.host,
        raw_host=parsed.raw_host.decode("ascii"),
        port=parsed.port or (443 if parsed.scheme == "https" else 80),
        path=parsed.raw_path.decode("ascii"),
        netloc=parsed.netloc.decode("ascii"),
    )


async def _request(
    provider: Provider,
    method: str,
    url: str,
    headers: dict[str, str],
    body: _wire.Outgoing | None,
    cancel_event: threading.Event | None,
    timeout: float,
    on_body: OnBody | None = None,
) -> HttpResponse:
    """The exchange, as a task on the process's loop: the caller's cancel event cancels this
    very task (no watcher task), `asyncio.timeout` bounds it. A cancelled or timed-out exchange
    closes its connection (httpcore does, for a response not read to its end)."""
    try:
        target = _target(url)
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise provider.error(PROVIDER_UNREACHABLE, f"invalid URL {url!r}: {exc}") from None
    if target.scheme not in ("http", "https") or not target.host:
        raise provider.error(
            PROVIDER_UNREACHABLE, f"invalid URL {url!r}: it needs http:// or https:// and a host"
        )
    task = asyncio.current_task()
    assert task is not None
    if cancel_event is not None and cancel_event.is_set():  # set while the task was queued
        raise provider.error(PROVIDER_CANCELLED, "request cancelled before it was sent")
    canceller = _Canceller(asyncio.get_running_loop(), task, cancel_event)
    shard: _Client | None = None
    try:
        async with asyncio.timeout(timeout):
            if not _proxied():
                return await _send_direct(provider, target, method, url, headers, body, on_body)
            key = (type(provider).__name__, _origin(url), timeout)
            shard = _clients.setdefault(key, _Clients()).take(timeout)
            content = None if body is None else body.take()
            return await _send(
                provider, shard.client, method, url, headers, content, timeout, on_body
            )
    except TimeoutError:
        raise provider.error(
            PROVIDER_TIMEOUT, f"no complete response within {timeout:g} s (overall deadline)"
        ) from None
    except asyncio.CancelledError:
        if canceller.aborted:
            raise provider.error(PROVIDER_CANCELLED, "request cancelled by the caller") from None
        raise
    finally:
        canceller.close()
        if shard is not None:
            shard.in_flight -= 1


async def _send_direct(
    provider: Provider,
    target: _Target,
    method: str,
    url: str,
    headers: dict[str, str],
    body: _wire.Outgoing | None,
    on_body: OnBody | None = None,
) -> HttpResponse:
    """The exchange on `_wire`'s connection (no proxy applies)."""
    request = _wire.Outgoing(_wire_request(target, method, headers, body))
    wire_on_body: _wire.OnBody | None = None
    if on_body is not None:
        seen: list[httpx.Headers] = []  # the answer's headers, built once

        def wire_on_body(status: int, raw: list[tuple[bytes, bytes]], piece: bytes) -> None:
            if not seen:
                seen.append(httpx.Headers(raw))
            on_body(status, seen[0], piece)

    try:
        answer = await _direct.send(
            scheme=target.scheme,
            host=target.raw_host,
            port=target.port,
            request=request,
            cap=provider.max_response_bytes,
            head_only=method == "HEAD",
            ssl_context=_ssl_context() if target.scheme == "https" else None,
            on_body=wire_on_body,
        )
    except _wire.WireError as exc:
        if exc.kind == "connect":
            code, message = PROVIDER_UNREACHABLE, f"cannot connect to {_origin(url)}: {exc}"
        elif exc.kind in ("too_large", "decode"):
            code, message = PROVIDER_BAD_RESPONSE, str(exc)
        else:
            code, message = PROVIDER_SERVER_ERROR, f"connection to {_origin(url)} failed: {exc}"
        raise provider.error(code, message, status=exc.status) from None
    return HttpResponse(answer.status, httpx.Headers(answer.headers), answer.body)


def _wire_request(
    target: _Target, method: str, headers: dict[str, str], body: _wire.Outgoing | None
) -> bytes:
    """The request's head and body, as written (the body taken from `body`)."""
    own = {name.lower() for name in headers}
    lines = [f"{method} {target.path} HTTP/1.1"]
    if "host" not in own:
        lines.append(f"host: {target.netloc}")
    lines += [f"{name}: {value}" for name, value in _DEFAULTS if name not in own]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    content = None if body is None else body.take()
    if content is not None and "content-length" not in own:
        lines.append(f"content-length: {len(content)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    return head + content if content else head


async def _send(
    provider: Provider,
    client: httpx.AsyncClient,
    method: str,
    url: str,
    headers: dict[str, str],
    content: bytes | None,
    timeout: float,
    on_body: OnBody | None = None,
) -> HttpResponse:
    cap = provider.max_response_bytes
    try:
        async with client.stream(method, url, headers=headers, content=content) as resp:
            declared = resp.headers.get("content-length")
            if declared and declared.isdigit() and int(declared) > cap:
                raise provider.error(
                    PROVIDER_BAD_RESPONSE,
                    f"response body of {int(declared)} bytes exceeds the limit of {cap} bytes",
                    status=resp.status_code,
                )
            chunks: list[bytes] = []
            total = 0
            async for chunk in resp.aiter_bytes():
                total += len(chunk)
                if total > cap:
                    raise provider.error(
                        PROVIDER_BAD_RESPONSE,
                        f"response body exceeds the limit of {cap} bytes",
                        status=resp.status_code,
                    )
                chunks.append(chunk)
                if on_body is not None and chunk:
                    on_body(resp.status_code, resp.headers, chunk)
            return HttpResponse(resp.status_code, resp.headers, b"".join(chunks))
    except ProviderError:
        raise
    except httpx.TimeoutException as exc:
        kind = type(exc).__name__
        raise provider.error(
            PROVIDER_TIMEOUT, f"{kind}: no progress within {timeout:g} s"
        ) from None
    except httpx.ConnectError as exc:
        raise provider.error(
            PROVIDER_UNREACHABLE, f"cannot connect to {_origin(url)}: {exc}"
        ) from None
    except (httpx.UnsupportedProtocol, httpx.InvalidURL) as exc:
        raise provider.error(PROVIDER_UNREACHABLE, f"invalid URL {url!r}: {exc}") from None
    except httpx.DecodingError as exc:
        raise provider.error(PROVIDER_BAD_RESPONSE, f"cannot decode response body: {exc}") from None
    except httpx.TransportError as exc:
        raise provider.error(
            PROVIDER_SERVER_ERROR,
            f"connection to {_origin(url)} failed: {type(exc).__name__}: {exc}",
        ) from None
    except httpx.HTTPError as exc:  # pragma: no cover - defensive
        raise provider.error(PROVIDER_BAD_RESPONSE, f"{type(exc).__name__}: {exc}") from None


# --------------------------------------------------------------------------------------
# Streamed answers (Server-Sent Events)
# --------------------------------------------------------------------------------------


class EventStream:
    """A streamed answer's Server-Sent Events, parsed as its pieces arrive: pass it as a
    request's ``on_body``. Each complete event goes to ``on_event(event, data)`` (the event's
    name, "" when none, and its data lines joined). An answer that is not a 2xx
    ``text/event-stream`` (an error, or a server that answered a whole JSON body to a streamed
    request) is left alone: ``streamed`` stays False and the caller reads the body as today."""

    def __init__(self, on_event: Callable[[str, str], None]) -> None:
        self.on_event = on_event
        self.streamed: bool | None = None  # None: no piece yet
        self._buffer = bytearray()
        self._event = ""
        self._data: list[str] = []

    def __call__(self, status: int, headers: httpx.Headers, piece: bytes) -> None:
        if self.streamed is None:
            kind = headers.get("content-type", "").split(";", 1)[0].strip().lower()
            self.streamed = 200 <= status < 300 and kind == "text/event-stream"
        if self.streamed:
            self.feed(piece)

    def feed(self, piece: bytes) -> None:
        buffer = self._buffer
        buffer += piece
        start = 0
        while True:
            end = buffer.find(b"\n", start)
            if end < 0:
                break
            line = bytes(buffer[start:end]).rstrip(b"\r").decode("utf-8", "replace")
            start = end + 1
            self._line(line)
        del buffer[:start]

    def _line(self, line: str) -> None:
        if not line:
            if self._data or self._event:
                event, data = self._event, "\n".join(self._data)
                self._event, self._data = "", []
                self.on_event(event, data)
            return
        if line.startswith(":"):
            return  # a comment (a keep-alive)
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value

    def close(self) -> None:
        """The body ended: an event not followed by its blank line still counts."""
        if self._buffer:
            self._line(bytes(self._buffer).rstrip(b"\r").decode("utf-8", "replace"))
            self._buffer.clear()
        self._line("")


def safe_delta(
    on_delta: Callable[[str, dict[str, Any]], None] | None,
) -> Callable[[str, dict[str, Any]], None]:
    """``on_delta`` that never raises into the request (what it raises is logged)."""

    def call(kind: str, data: dict[str, Any]) -> None:
        if on_delta is None:
            return
        try:
            on_delta(kind, data)
        except Exception:
            log.exception("provider.on_delta_failed")

    return call


# --------------------------------------------------------------------------------------
# The output-per-turn limit, as a streamed answer grows
# --------------------------------------------------------------------------------------

#: The most characters one token of a model's output can decode to, with room to spare: the
#: longest tokens of the common vocabularies (runs of spaces, of dashes or of `=` in
#: byte-level BPE, tiktoken's and its descendants'; SentencePiece's pieces are at most 16 by
#: default) decode to well under this many. So an answer of `max_tokens` tokens has at most
#: `max_tokens * MAX_CHARS_PER_TOKEN` characters of text and tool calls, and a stream that
#: has written more has passed the limit for certain: no answer within it is ever cut.
MAX_CHARS_PER_TOKEN = 256
#: What `raw_stop_reason` says of an answer the server let run past the output limit.
OUTPUT_LIMIT_EXCEEDED = "output_limit_exceeded"


def past_limit(tokens: int, max_tokens: int) -> bool:
    """Whether a server's count of output tokens is clearly more than the `max_tokens` it was
    asked for: by more than a quarter and 16 tokens, so that a count of the end-of-turn token,
    or a gateway's count in another tokenizer than the model's, is not taken for it."""
    return tokens > max_tokens + max_tokens // 4 + 16


class OutputLimitReached(ProviderError):
    """A streamed answer has clearly passed the turn's output limit (raised on the loop, by
    `OutputMeter`): the exchange fails, so the connection is dropped at once, and the provider
    answers with `OutputMeter.cut`, a turn truncated at the limit. Never reaches the loop."""


class OutputMeter:
    """What a streamed turn has produced so far, held against its output limit as it grows: the
    characters of visible text, refusal and tool calls (names and arguments) — hidden reasoning
    is not counted (some servers do not count it against the limit either; the byte cap and the
    deadline bound it) — and the count of output tokens when the stream reports one. It raises
    `OutputLimitReached` once either shows the limit passed."""

    def __init__(self, provider: Provider, max_tokens: int) -> None:
        self.provider = provider
        self.max_tokens = max(1, int(max_tokens))
        self.chars = 0
        self.reported = 0

    def add(self, text: str) -> None:
        self.chars += len(text)
        if self.chars > self.max_tokens * MAX_CHARS_PER_TOKEN:
            self._reached(f"{self.chars} characters")

    def report(self, tokens: int) -> None:
        """The stream's own count of output tokens so far (hidden reasoning's taken off)."""
        self.reported = max(self.reported, tokens)
        if past_limit(self.reported, self.max_tokens):
            self._reached(f"{self.reported} tokens by its own count")

    @property
    def tokens(self) -> int:
        """Output tokens the answer took at least: what it reported, or what its characters
        prove (at most `MAX_CHARS_PER_TOKEN` a token), and more than the limit."""
        proven = -(-self.chars // MAX_CHARS_PER_TOKEN)
        return max(self.reported, proven, self.max_tokens + 1)

    def _reached(self, what: str) -> None:
        raise OutputLimitReached(
            PROVIDER_OUTPUT_TOO_LARGE,
            f"the streamed answer passed the output limit of {self.max_tokens} tokens "
            f"({what}): the server did not stop at it",
        )

    def cut(self, whole: Completion) -> Completion:
        """The turn a stream cut at the limit gives: `whole`, the Completion of what the stream
        said before its text (its usage, its model), as a turn truncated at the output limit,
        with nothing of what was written — no text, no tool call — and the tokens it took."""
        return whole.model_copy(
            update={
                "text": "",
                "tool_calls": [],
                "stop_reason": "length",
                "raw_stop_reason": OUTPUT_LIMIT_EXCEEDED,
                "output_tokens": self.tokens,
            }
        )


def at_output_limit(completion: Completion, max_tokens: int, visible: int | None) -> Completion:
    """A whole answer whose server counts more visible output tokens (`visible`: None when it
    cannot be told apart from hidden reasoning) than `past_limit` allows: the server ignored
    the limit, and the turn is one truncated at it (`stop_reason` "length": discarded unrun)."""
    if completion.stop_reason == "length" or visible is None:
        return completion
    if not past_limit(visible, max_tokens):
        return completion
    return completion.model_copy(
        update={"stop_reason": "length", "raw_stop_reason": OUTPUT_LIMIT_EXCEEDED}
    )


@functools.lru_cache(maxsize=256)
def _origin(url: str) -> str:
    try:
        parsed = httpx.URL(url)
        port = f":{parsed.port}" if parsed.port else ""
        return f"{parsed.scheme}://{parsed.host}{port}"
    except (httpx.InvalidURL, TypeError, ValueError):
        return "the provider"


# --------------------------------------------------------------------------------------
# Error classification
# --------------------------------------------------------------------------------------


def error_text(body: bytes, redact: Callable[[str], str] | None = None) -> tuple[str, str]:
    """Return ``(summary, searchable)`` for an error body in any common server format.

    ``summary`` is a short human text, ``searchable`` also contains error type/code fields.
    ``redact`` (the provider's) runs before anything is cut: on the raw text and on the message
    read from its JSON, so no cut leaves a piece of the key.
    """
    redact = redact or (lambda text: text)
    text = redact(body[:20000].decode("utf-8", "replace"))
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    parts: list[str] = []
    message = ""
    if isinstance(data, dict):
        err = data.get("error", data)
        if isinstance(err, str):
            message = err
        elif isinstance(err, dict):
            for key in ("type", "code", "status"):
                value = err.get(key)
                if isinstance(value, (str, int)) and str(value):
                    parts.append(str(value))
            msg = err.get("message") or err.get("detail") or data.get("detail") or ""
            message = msg if isinstance(msg, str) else json.dumps(msg)[:_ERROR_TEXT_LIMIT]
    if not message:
        message = " ".join(text.split())
    message = redact(message)[:_ERROR_TEXT_LIMIT]
    prefix = f"[{'/'.join(dict.fromkeys(parts))}] " if parts else ""
    summary = f"{prefix}{message}".strip() or "(empty body)"
    return summary, f"{summary} {text[:2000]}"


def retry_after_seconds(headers: httpx.Headers) -> float | None:
    value = headers.get("retry-after")
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def raise_for_status(provider: Provider, resp: HttpResponse) -> None:
    """Raise a classified ProviderError for non-2xx responses."""
    status = resp.status
    if 200 <= status < 300:
        return
    summary, searchable = error_text(resp.body, provider.redact)
    retry_after = retry_after_seconds(resp.headers)
    if status in (401, 403):
        code = PROVIDER_AUTH
    elif status == 429:
        code = PROVIDER_QUOTA if _QUOTA_RE.search(searchable) else PROVIDER_RATE_LIMITED
    elif status == 402:
        code = PROVIDER_QUOTA
    elif status == 408:
        code = PROVIDER_TIMEOUT
    elif status >= 500:
        code = PROVIDER_SERVER_ERROR
    elif 400 <= status < 500:
        code = PROVIDER_QUOTA if _STRONG_QUOTA_RE.search(searchable) else PROVIDER_BAD_REQUEST
    else:
        code = PROVIDER_BAD_RESPONSE
        summary = f"unexpected HTTP status {status}: {summary}"
    raise provider.error(code, f"HTTP {status}: {summary}", status=status, retry_after=retry_after)


def bad_shape(provider: Provider, what: str, status: int | None = None) -> ProviderError:
    return provider.error(
        PROVIDER_BAD_RESPONSE, f"unexpected response shape: {what}", status=status
    )


def as_int(value: Any) -> int:
    if isinstance(value, bool):
        return 0
    if isinstance(value, int):
        return max(0, value)
    if isinstance(value, float):
        return max(0, int(value)) if math.isfinite(value) else 0
    return 0


def as_cost(value: Any) -> Decimal | None:
    """A reported cost (a JSON number, US dollars) as a Decimal; None when absent or odd."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return None
    if not number.is_finite() or number < 0 or number > 1_000_000:
        return None
    return number
