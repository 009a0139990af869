"""Shared HTTP machinery for the HTTP providers.

Every request runs on this thread's event loop so that it can be really aborted: the caller's
cancel event cancels the request task (called back by a `CancelEvent`, polled for a plain
`threading.Event`), and the connection is closed. Each thread keeps one connection pool per
provider endpoint (its loop's), so a worker reuses its connection to the model server from turn
to turn; a cancelled, timed-out or failed request discards its pool. An overall deadline bounds
the whole exchange (slow-loris servers), and the body is streamed with a byte cap.

The request is sent with httpcore's connection pool directly (the transport under httpx): the
client layers above it (request and response objects, header merging, cookies, auth and
redirect flows, event hooks) cost more CPU than the exchange itself with a local model, and a
model request needs none of them. When the environment names a proxy (``HTTP_PROXY``,
``HTTPS_PROXY``, ``ALL_PROXY``), requests go through an ``httpx.AsyncClient`` instead, which
applies it (and ``NO_PROXY``) as it always did.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import email.utils
import functools
import json
import math
import re
import ssl
import threading
import time
from collections.abc import AsyncIterable, Callable, Iterable
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import httpcore
import httpx
from httpcore._utils import is_socket_readable
from httpx._client import ACCEPT_ENCODING, USER_AGENT
from httpx._decoders import SUPPORTED_DECODERS, ContentDecoder, MultiDecoder
from httpx._utils import get_environment_proxies

from .base import (
    PROVIDER_AUTH,
    PROVIDER_BAD_REQUEST,
    PROVIDER_BAD_RESPONSE,
    PROVIDER_CANCELLED,
    PROVIDER_QUOTA,
    PROVIDER_RATE_LIMITED,
    PROVIDER_SERVER_ERROR,
    PROVIDER_TIMEOUT,
    PROVIDER_UNREACHABLE,
    CancelEvent,
    Provider,
    ProviderError,
)

CANCEL_POLL_INTERVAL = 0.1
_ERROR_TEXT_LIMIT = 500
#: How long an idle kept-alive connection is trusted (httpx's default, which this used before).
_KEEPALIVE_EXPIRY = 5.0

# Wording that turns a 429 into a quota problem.
_QUOTA_RE = re.compile(
    r"quota|billing|credit|payment required|insufficient[_ ]funds", re.IGNORECASE
)
# Stronger wording that turns another 4xx (e.g. Anthropic's 400 "credit balance is too
# low") into a quota problem.
_STRONG_QUOTA_RE = re.compile(
    r"credit balance|insufficient_quota|exceeded your current quota|billing", re.IGNORECASE
)

#: The headers httpx sends by default, sent the same way (a request's own headers win).
_DEFAULT_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"accept", b"*/*"),
    (b"accept-encoding", ACCEPT_ENCODING.encode("ascii")),
    (b"connection", b"keep-alive"),
    (b"user-agent", USER_AGENT.encode("ascii")),
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
) -> HttpResponse:
    """Send one request and return the full (capped) response; raise ProviderError on
    transport problems, timeout, cancellation or an oversized body. HTTP error statuses are
    returned, not raised: the caller classifies them with ``raise_for_status``. The body is
    ``json_body`` encoded here, or ``encoded_body``, JSON the caller encoded already."""
    provider.check_config()
    provider.check_request_url(url)
    if cancel_event is not None and cancel_event.is_set():
        raise provider.error(PROVIDER_CANCELLED, "request cancelled before it was sent")
    content = encoded_body
    if json_body is not None:
        content = json.dumps(json_body, ensure_ascii=False).encode("utf-8")
    if content is not None:
        headers = {"content-type": "application/json", **headers}
    timeout = timeout or provider.timeout
    if asyncio._get_running_loop() is None:
        return _thread_loop().run_until_complete(
            _request(provider, method, url, headers, content, cancel_event, timeout, reuse=True)
        )
    # Called from inside a running event loop (e.g. async code calling the sync API):
    # run on a private loop in a helper thread so we never block or nest loops.
    coro = _request(provider, method, url, headers, content, cancel_event, timeout, reuse=False)
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro).result()


# A thread's connection pool is kept per (provider class name, origin, timeout).
type _PoolKey = tuple[str, str, float]
#: httpcore's pool, or httpx's client when a proxy applies.
type _Pool = httpcore.AsyncConnectionPool | httpx.AsyncClient

_loops = threading.local()
#: Loops (with their pools and kept-alive connections) that threads gave back
#: (`release_thread_http`), for the next thread: a worker runs each task in a thread of its own,
#: and a new loop, pool and connection cost a task's first request more than the request.
_idle: list[tuple[asyncio.AbstractEventLoop, dict[_PoolKey, _Pool]]] = []
_idle_lock = threading.Lock()
_IDLE_MAX = 64


def _thread_loop() -> asyncio.AbstractEventLoop:
    """One event loop per thread, reused: creating and tearing one down per request (what
    asyncio.run does) costs more than a local model's answer. A thread starts with a loop an
    ended thread gave back, when there is one."""
    loop = getattr(_loops, "loop", None)
    if loop is None or loop.is_closed():
        with _idle_lock:
            taken = _idle.pop() if _idle else None
        if taken is None or taken[0].is_closed():
            taken = (asyncio.new_event_loop(), {})
        loop, _loops.loop, _loops.pools = taken[0], taken[0], taken[1]
    return loop


def release_thread_http() -> None:
    """This thread is done with model requests (a worker's run thread ending): its loop, with
    its pools and their kept-alive connections, goes to the next thread that asks. Only a
    loop that is not running is given back; beyond `_IDLE_MAX` idle loops it is closed."""
    loop = getattr(_loops, "loop", None)
    pools: dict[_PoolKey, _Pool] = getattr(_loops, "pools", None) or {}
    _loops.loop, _loops.pools = None, None
    if loop is None or loop.is_closed() or loop.is_running():
        return
    with _idle_lock:
        if len(_idle) < _IDLE_MAX:
            _idle.append((loop, pools))
            return
    for pool in pools.values():
        loop.run_until_complete(pool.aclose())
    loop.close()


@dataclass(frozen=True)
class _Target:
    """A request URL, parsed once (by httpx's parser, with its checks)."""

    url: httpcore.URL
    host: bytes  # the Host header
    origin: str


@functools.lru_cache(maxsize=256)
def _target(url: str) -> _Target:
    """Raises httpx.InvalidURL or httpcore.UnsupportedProtocol, as a request to it would."""
    parsed = httpx.URL(url)
    if parsed.scheme not in ("http", "https"):
        raise httpcore.UnsupportedProtocol(
            f"Request URL has an unsupported protocol '{parsed.scheme}://'."
            if parsed.scheme
            else "Request URL is missing an 'http://' or 'https://' protocol."
        )
    if not parsed.host:
        raise httpx.InvalidURL("Request URL is missing a host.")
    return _Target(
        httpcore.URL(
            scheme=parsed.raw_scheme,
            host=parsed.raw_host,
            port=parsed.port,
            target=parsed.raw_path,
        ),
        parsed.netloc,
        _origin(url),
    )


@functools.cache
def _proxied() -> bool:
    """Whether the environment names a proxy (read once, as a client reads it once)."""
    return any(value for value in get_environment_proxies().values())


def _new_pool(timeout: float, *, keep_alive: bool) -> _Pool:
    if _proxied():
        return httpx.AsyncClient(
            verify=_ssl_context(),
            timeout=httpx.Timeout(timeout),
            follow_redirects=False,
            limits=httpx.Limits(
                max_connections=1, max_keepalive_connections=1 if keep_alive else 0
            ),
        )
    return httpcore.AsyncConnectionPool(
        ssl_context=_ssl_context(),
        max_connections=1,
        max_keepalive_connections=1 if keep_alive else 0,
        keepalive_expiry=_KEEPALIVE_EXPIRY,
        network_backend=_BACKEND,
    )


def _pool(key: _PoolKey, timeout: float) -> _Pool:
    """This thread's pool for the endpoint (one connection: scheme, host, port)."""
    pools: dict[_PoolKey, _Pool] | None = getattr(_loops, "pools", None)
    if pools is None:
        pools = _loops.pools = {}
    pool = pools.get(key)
    if pool is None:
        pool = pools[key] = _new_pool(timeout, keep_alive=True)
    return pool


async def _discard(key: _PoolKey | None, pool: _Pool) -> None:
    pools: dict[_PoolKey, _Pool] = getattr(_loops, "pools", None) or {}
    if key is not None and pools.get(key) is pool:
        del pools[key]
    await pool.aclose()


class _Canceller:
    """Cancels the request's task when the caller's event is set: called back by a
    `CancelEvent` (in the thread that sets it), polled for a plain `threading.Event`. Once
    closed, a late cancel finds nothing to abort (a request that ended stays as it ended)."""

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


async def _request(
    provider: Provider,
    method: str,
    url: str,
    headers: dict[str, str],
    content: bytes | None,
    cancel_event: threading.Event | None,
    timeout: float,
    *,
    reuse: bool,
) -> HttpResponse:
    """The exchange, in the task `run_until_complete` made: the caller's cancel event cancels
    this very task (no watcher task), `asyncio.timeout` bounds it."""
    try:
        target = _target(url)
    except (httpx.InvalidURL, httpcore.UnsupportedProtocol, TypeError, ValueError) as exc:
        raise provider.error(PROVIDER_UNREACHABLE, f"invalid URL {url!r}: {exc}") from None
    task = asyncio.current_task()
    assert task is not None
    canceller = _Canceller(asyncio.get_running_loop(), task, cancel_event)
    key: _PoolKey | None = None
    if reuse:
        key = (type(provider).__name__, target.origin, timeout)
        pool = _pool(key, timeout)
    else:
        pool = _new_pool(timeout, keep_alive=False)
    ok = False
    try:
        async with asyncio.timeout(timeout):
            if isinstance(pool, httpcore.AsyncConnectionPool):
                result = await _send(provider, pool, method, target, headers, content, timeout)
            else:
                result = await _send_httpx(provider, pool, method, url, headers, content, timeout)
        ok = True
        return result
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
        if not (ok and reuse):
            # Cancelled, timed out or failed: closing the pool closes its connection.
            await _discard(key, pool)


class _Stream(httpcore.AsyncNetworkStream):
    """A connection as asyncio's streams: what httpcore's default (anyio) backend does, without
    its per-read and per-write cancel scopes. The per-operation timeouts httpcore passes are not
    applied: they equal the overall deadline (`_request`), which starts before them and bounds
    every read and write of the exchange."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            return await self._reader.read(max_bytes)
        except OSError as exc:
            raise httpcore.ReadError(exc) from exc

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            self._writer.write(buffer)
            await self._writer.drain()
        except (OSError, RuntimeError) as exc:  # RuntimeError: written after the close
            raise httpcore.WriteError(exc) from exc

    async def aclose(self) -> None:
        # Closed at once (a cancelled or failed exchange must not linger), and the socket let
        # go before the loop stops.
        self._writer.transport.abort()
        await asyncio.sleep(0)

    async def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            await self._writer.start_tls(ssl_context, server_hostname=server_hostname)
        except (OSError, ssl.SSLError, EOFError, ConnectionError) as exc:
            await self.aclose()
            raise httpcore.ConnectError(exc) from exc
        except BaseException:
            await self.aclose()
            raise
        return self

    def get_extra_info(self, info: str) -> Any:
        if info in ("ssl_object", "socket"):
            return self._writer.get_extra_info(info)
        if info == "client_addr":
            return self._writer.get_extra_info("sockname")
        if info == "server_addr":
            return self._writer.get_extra_info("peername")
        if info == "is_readable":
            # Data or the end of the stream, already read by the loop or still in the socket:
            # an idle kept-alive connection that is readable was closed (or spoilt) by the server.
            return (
                self._writer.transport.is_closing()
                or self._reader.at_eof()
                or bool(getattr(self._reader, "_buffer", b""))
                or is_socket_readable(self._writer.get_extra_info("socket"))
            )
        return None


class _Backend(httpcore.AsyncNetworkBackend):
    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        try:
            # asyncio sets TCP_NODELAY on its TCP connections, as anyio's did; and like anyio,
            # tries the next address 0.25 s into a silent one (an unreachable IPv6 route).
            reader, writer = await asyncio.open_connection(
                host, port, limit=_READ_LIMIT, happy_eyeballs_delay=0.25
            )
        except OSError as exc:
            raise httpcore.ConnectError(exc) from exc
        return _Stream(reader, writer)

    async def connect_unix_socket(  # pragma: no cover - not used: URLs name hosts
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("unix sockets are not used")

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


#: The stream's read buffer: a read takes at most httpcore's 64 KiB anyway.
_READ_LIMIT = 2**17
_BACKEND = _Backend()


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """Building an SSL context (loading the CA bundle) costs ~50 ms; do it once.
    SSLContext objects are safe to share between threads and event loops."""
    return httpx.create_ssl_context()


def _decoder(encodings: list[bytes]) -> ContentDecoder | None:
    """The decoder for a response's Content-Encoding values, as httpx picks it (unknown
    codings are left alone); None for none."""
    decoders: list[ContentDecoder] = []
    for value in encodings:
        for coding in value.decode("latin-1").split(","):
            decoder_cls = SUPPORTED_DECODERS.get(coding.strip().lower())
            if decoder_cls is not None and coding.strip().lower() != "identity":
                decoders.append(decoder_cls())
    if not decoders:
        return None
    return decoders[0] if len(decoders) == 1 else MultiDecoder(children=decoders)


def _core_request(
    method: str, target: _Target, headers: dict[str, str], content: bytes | None, timeout: float
) -> httpcore.Request:
    """The request as httpx would send it: its default headers (the request's own win), Host,
    Content-Length, the timeout for each phase."""
    own = {name.lower() for name in headers}
    raw = [(b"host", target.host)] if "host" not in own else []
    raw.extend(item for item in _DEFAULT_HEADERS if item[0].decode() not in own)
    raw.extend((name.encode("ascii"), value.encode("ascii")) for name, value in headers.items())
    if content is not None and "content-length" not in own:
        raw.append((b"content-length", str(len(content)).encode("ascii")))
    return httpcore.Request(
        method.encode("ascii"),
        target.url,
        headers=raw,
        content=content,
        extensions={
            "timeout": {"connect": timeout, "read": timeout, "write": timeout, "pool": timeout}
        },
    )


async def _read_body(provider: Provider, resp: httpcore.Response) -> bytes:
    """The body, decoded as its Content-Encoding says; over the byte cap (declared, or counted
    as it is decoded) raises ``provider_bad_response``."""
    cap = provider.max_response_bytes
    declared: bytes | None = None
    encodings: list[bytes] = []
    for name, value in resp.headers:
        lowered = name.lower()
        if lowered == b"content-length":
            declared = value
        elif lowered == b"content-encoding":
            encodings.append(value)
    if declared and declared.isdigit() and int(declared) > cap:
        raise provider.error(
            PROVIDER_BAD_RESPONSE,
            f"response body of {int(declared)} bytes exceeds the limit of {cap} bytes",
            status=resp.status,
        )
    decoder = _decoder(encodings) if encodings else None
    chunks: list[bytes] = []
    total = 0
    stream = resp.stream
    assert isinstance(stream, AsyncIterable)
    async for raw in stream:
        chunk = raw if decoder is None else decoder.decode(raw)
        total += len(chunk)
        if total > cap:
            break
        chunks.append(chunk)
    else:
        if decoder is not None:
            chunks.append(decoder.flush())
            total += len(chunks[-1])
    if total > cap:
        raise provider.error(
            PROVIDER_BAD_RESPONSE,
            f"response body exceeds the limit of {cap} bytes",
            status=resp.status,
        )
    return b"".join(chunks)


async def _send(
    provider: Provider,
    pool: httpcore.AsyncConnectionPool,
    method: str,
    target: _Target,
    headers: dict[str, str],
    content: bytes | None,
    timeout: float,
) -> HttpResponse:
    try:
        resp = await pool.handle_async_request(
            _core_request(method, target, headers, content, timeout)
        )
        try:
            body = await _read_body(provider, resp)
        finally:
            await resp.aclose()
        return HttpResponse(resp.status, httpx.Headers(resp.headers), body)
    except ProviderError:
        raise
    except httpcore.TimeoutException as exc:
        kind = type(exc).__name__
        raise provider.error(
            PROVIDER_TIMEOUT, f"{kind}: no progress within {timeout:g} s"
        ) from None
    except httpcore.ConnectError as exc:
        raise provider.error(
            PROVIDER_UNREACHABLE, f"cannot connect to {target.origin}: {exc}"
        ) from None
    except httpcore.UnsupportedProtocol as exc:  # pragma: no cover - _target checks first
        raise provider.error(PROVIDER_UNREACHABLE, f"invalid URL: {exc}") from None
    except httpx.DecodingError as exc:
        raise provider.error(PROVIDER_BAD_RESPONSE, f"cannot decode response body: {exc}") from None
    except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.ProxyError) as exc:
        # the names httpx gives them too (its TransportError subclasses), as before
        raise provider.error(
            PROVIDER_SERVER_ERROR,
            f"connection to {target.origin} failed: {type(exc).__name__}: {exc}",
        ) from None


async def _send_httpx(
    provider: Provider,
    client: httpx.AsyncClient,
    method: str,
    url: str,
    headers: dict[str, str],
    content: bytes | None,
    timeout: float,
) -> HttpResponse:
    """The request through httpx's client (when a proxy applies)."""
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
