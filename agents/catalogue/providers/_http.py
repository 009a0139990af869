"""Shared HTTP machinery for the HTTP providers.

A request runs in the caller's thread on httpcore's sync connection pool, over non-blocking
sockets waited on with `poll`: no event loop per thread (a loop's task, timer and callbacks per
request cost more CPU than a local model's answer). It can still be really aborted: the caller's
cancel event shuts the socket down (called back by a `CancelEvent`, polled for a plain
`threading.Event`), and the connection is closed. Each thread keeps one connection pool per
provider endpoint, so a worker reuses its connection to the model server from turn to turn (and
hands it to its next run thread, `release_thread_http`); a cancelled, timed-out or failed
request discards its pool. An overall deadline bounds the whole exchange (slow-loris servers):
every wait on a socket ends at it. The body is streamed with a byte cap; redirects are never
followed (httpcore does not).

The request is sent with httpcore's connection pool directly (the transport under httpx): the
client layers above it (request and response objects, header merging, cookies, auth and
redirect flows, event hooks) cost more CPU than the exchange itself with a local model, and a
model request needs none of them. When the environment names a proxy (``HTTP_PROXY``,
``HTTPS_PROXY``, ``ALL_PROXY``), requests go through an ``httpx.AsyncClient`` on this thread's
event loop instead, which applies it (and ``NO_PROXY``) as it always did.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import email.utils
import functools
import json
import math
import os
import re
import select
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable
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
    if not _proxied():
        return _sync_request(provider, method, url, headers, content, cancel_event, timeout)
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
#: httpx's client, when a proxy applies.
type _Pool = httpx.AsyncClient

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
    """This thread is done with model requests (a worker's run thread ending): its pools, with
    their kept-alive connections, go to the next thread that asks (and its loop, with the
    proxied clients, when a proxy applies). Only a loop that is not running is given back;
    beyond `_IDLE_MAX` idle ones, they are closed."""
    direct: dict[_PoolKey, httpcore.ConnectionPool] | None = getattr(_local, "pools", None)
    _local.pools = None
    if direct:
        with _idle_lock:
            if len(_idle_direct) < _IDLE_MAX:
                _idle_direct.append(direct)
                direct = None
        for core_pool in (direct or {}).values():
            core_pool.close()
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


#: The direct pools threads gave back (`release_thread_http`), for the next thread.
_idle_direct: list[dict[_PoolKey, httpcore.ConnectionPool]] = []


def _direct_pool(key: _PoolKey, target: _Target) -> httpcore.ConnectionPool:
    """This thread's pool for the endpoint (one connection: scheme, host, port); a thread
    starts with the pools an ended thread gave back, when there are some."""
    pools: dict[_PoolKey, httpcore.ConnectionPool] | None = getattr(_local, "pools", None)
    if pools is None:
        with _idle_lock:
            pools = _idle_direct.pop() if _idle_direct else {}
        _local.pools = pools
    pool = pools.get(key)
    if pool is None:
        pool = pools[key] = httpcore.ConnectionPool(
            # a plain-http endpoint (a local model) needs none
            ssl_context=_ssl_context() if target.url.scheme == b"https" else None,
            max_connections=1,
            max_keepalive_connections=1,
            keepalive_expiry=_KEEPALIVE_EXPIRY,
            network_backend=_SYNC_BACKEND,
        )
    return pool


def _sync_request(
    provider: Provider,
    method: str,
    url: str,
    headers: dict[str, str],
    content: bytes | None,
    cancel_event: threading.Event | None,
    timeout: float,
) -> HttpResponse:
    """The exchange in the caller's thread, on its pool's kept-alive connection: no event loop
    (a loop's turn per read, its task, timer and callbacks cost more CPU than a local model's
    answer). The socket's waits end at the overall deadline; the caller's cancel event shuts
    the socket down (`_Exchange`). A cancelled, timed-out or failed request discards the pool,
    and with it its connection."""
    try:
        target = _target(url)
    except (httpx.InvalidURL, httpcore.UnsupportedProtocol, TypeError, ValueError) as exc:
        raise provider.error(PROVIDER_UNREACHABLE, f"invalid URL {url!r}: {exc}") from None
    key = (type(provider).__name__, target.origin, timeout)
    pool = _direct_pool(key, target)
    exchange = _local.exchange = _Exchange(time.monotonic() + timeout, cancel_event)
    ok = False
    try:
        result = _send(provider, pool, method, target, headers, content, timeout)
        ok = True
        return result
    except _PastDeadline:
        raise provider.error(
            PROVIDER_TIMEOUT, f"no complete response within {timeout:g} s (overall deadline)"
        ) from None
    except _Cancelled:
        raise provider.error(PROVIDER_CANCELLED, "request cancelled by the caller") from None
    finally:
        exchange.close()  # from here on, a cancel touches no socket
        _local.exchange = None
        if not ok:
            pools = getattr(_local, "pools", None) or {}
            if pools.get(key) is pool:
                del pools[key]
            pool.close()  # closes its connection


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
    return httpx.AsyncClient(
        verify=_ssl_context(),
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1 if keep_alive else 0),
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


# --------------------------------------------------------------------------------------
# The direct exchange: httpcore's sync pool on blocking-style sockets, in the caller's thread
# --------------------------------------------------------------------------------------


class _Cancelled(Exception):
    """The caller's cancel event was set while the exchange ran."""


class _PastDeadline(Exception):
    """The exchange's overall deadline passed."""


_local = threading.local()


def _shutdown(sock: socket.socket) -> None:
    # The plain socket's shutdown, also for a TLS socket (whose own `shutdown` drops its SSL
    # object under the reading thread): a blocked wait on it wakes up with the end of stream.
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Exchange:
    """One request's overall deadline and its caller's cancel event, as its sockets see them.
    A `CancelEvent` calls back (in the thread that sets it): the socket the request waits on is
    shut down, which wakes the wait at once. A plain `threading.Event` is polled: a wait lasts
    at most `CANCEL_POLL_INTERVAL`. Once closed, a late cancel finds nothing to abort, and a
    socket is detached (under the lock) before it is closed, so a cancel never reaches a
    descriptor that was closed and reused meanwhile."""

    __slots__ = ("aborted", "deadline", "event", "lock", "over", "polled", "sock")

    def __init__(self, deadline: float, event: threading.Event | None) -> None:
        self.deadline = deadline
        self.event = event
        self.polled = event is not None and not isinstance(event, CancelEvent)
        self.aborted = self.over = False
        self.sock: socket.socket | None = None
        self.lock = threading.Lock()
        if isinstance(event, CancelEvent):
            event.add_callback(self.abort)

    def abort(self) -> None:  # in the thread that set the event
        with self.lock:
            if self.over:
                return
            self.aborted = True
            if self.sock is not None:
                _shutdown(self.sock)

    def attach(self, sock: socket.socket) -> None:
        with self.lock:
            self.sock = sock
            if self.aborted:
                _shutdown(sock)

    def detach(self, sock: socket.socket) -> None:
        with self.lock:
            if self.sock is sock:
                self.sock = None

    def wait_ms(self, cap: float | None = None) -> int:
        """How long the next wait on a socket may last, in ms; raises once cancelled or past
        the deadline."""
        if self.aborted or (self.polled and self.event.is_set()):  # type: ignore[union-attr]
            self.aborted = True
            raise _Cancelled
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise _PastDeadline
        if self.polled:
            left = min(left, CANCEL_POLL_INTERVAL)
        if cap is not None:
            left = min(left, cap)
        return max(1, math.ceil(left * 1000))

    def close(self) -> None:
        with self.lock:
            self.over = True
            self.sock = None
        if isinstance(self.event, CancelEvent):
            self.event.remove_callback(self.abort)


def _exchange() -> _Exchange:
    exchange: _Exchange | None = getattr(_local, "exchange", None)
    if exchange is None:  # pragma: no cover - a stream is used only inside `_sync_request`
        raise httpcore.NetworkError("no exchange in progress")
    return exchange


_WANT_READ = (BlockingIOError, ssl.SSLWantReadError)
_WANT_WRITE = (BlockingIOError, ssl.SSLWantWriteError)


class _SyncStream(httpcore.NetworkStream):
    """A non-blocking socket, waited on with `poll` up to the exchange's deadline (httpcore's
    per-operation timeouts equal that deadline, which started before them: not applied). A
    read tries the socket first: an answer that arrived costs one system call."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._poll = select.poll()
        self._poll.register(sock.fileno(), select.POLLIN | select.POLLPRI)

    def _wait(self, exchange: _Exchange, events: int) -> None:
        if exchange.sock is not self._sock:
            exchange.attach(self._sock)
        if events != select.POLLIN:
            self._poll.modify(self._sock.fileno(), events)
        try:
            self._poll.poll(exchange.wait_ms())
        finally:
            if events != select.POLLIN:
                self._poll.modify(self._sock.fileno(), select.POLLIN | select.POLLPRI)
        if exchange.aborted:
            raise _Cancelled

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        exchange = _exchange()
        while True:
            try:
                data = self._sock.recv(max_bytes)
            except _WANT_READ:
                self._wait(exchange, select.POLLIN | select.POLLPRI)
                continue
            except ssl.SSLWantWriteError:  # pragma: no cover - TLS renegotiation
                self._wait(exchange, select.POLLOUT)
                continue
            except OSError as exc:
                if exchange.aborted:
                    raise _Cancelled from None
                raise httpcore.ReadError(exc) from exc
            if not data and exchange.aborted:
                raise _Cancelled
            return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        exchange = _exchange()
        view = memoryview(buffer)
        while view:
            try:
                sent = self._sock.send(view)
            except _WANT_WRITE:
                self._wait(exchange, select.POLLOUT)
                continue
            except ssl.SSLWantReadError:  # pragma: no cover - TLS renegotiation
                self._wait(exchange, select.POLLIN)
                continue
            except OSError as exc:
                if exchange.aborted:
                    raise _Cancelled from None
                raise httpcore.WriteError(exc) from exc
            view = view[sent:]

    def close(self) -> None:
        exchange = getattr(_local, "exchange", None)
        if exchange is not None:
            exchange.detach(self._sock)
        # Closed at once (a cancelled or failed exchange must not linger).
        with contextlib.suppress(OSError):
            self._sock.close()

    def start_tls(
        self,
        ssl_context: ssl.SSLContext,
        server_hostname: str | None = None,
        timeout: float | None = None,
    ) -> httpcore.NetworkStream:
        exchange = _exchange()
        stream: _SyncStream = self  # the one to close on failure (the TLS socket, once made)
        try:
            sock = ssl_context.wrap_socket(
                self._sock, server_hostname=server_hostname, do_handshake_on_connect=False
            )
            stream = _SyncStream(sock)
            while True:
                try:
                    sock.do_handshake()
                    return stream
                except ssl.SSLWantReadError:
                    stream._wait(exchange, select.POLLIN)
                except ssl.SSLWantWriteError:
                    stream._wait(exchange, select.POLLOUT)
        except (OSError, ssl.SSLError, EOFError) as exc:
            stream.close()
            if exchange.aborted:
                raise _Cancelled from None
            raise httpcore.ConnectError(exc) from exc
        except BaseException:
            stream.close()
            raise

    def get_extra_info(self, info: str) -> Any:
        sock = self._sock
        if info == "ssl_object":
            return getattr(sock, "_sslobj", None)
        if info == "socket":
            return sock
        if info == "client_addr":
            return sock.getsockname()
        if info == "server_addr":
            return sock.getpeername()
        if info == "is_readable":
            # Data or the end of the stream: an idle kept-alive connection that is readable was
            # closed (or spoilt) by the server.
            pending = isinstance(sock, ssl.SSLSocket) and sock.pending() > 0
            return pending or is_socket_readable(sock)
        return None


#: A silent address is given this long before the next one is tried too (as asyncio's and
#: anyio's happy eyeballs do: an unreachable IPv6 route).
_NEXT_ADDRESS_DELAY = 0.25


class _SyncBackend(httpcore.NetworkBackend):
    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        exchange = _exchange()
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError as exc:
            raise httpcore.ConnectError(exc) from exc
        sock = _connect_first(exchange, infos)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return _SyncStream(sock)

    def connect_unix_socket(  # pragma: no cover - not used: URLs name hosts
        self,
        path: str,
        timeout: float | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not used")

    def sleep(self, seconds: float) -> None:  # pragma: no cover - no retries configured
        time.sleep(seconds)


def _connect_first(exchange: _Exchange, infos: list[Any]) -> socket.socket:
    """The first of the addresses to accept a connection: the next one is started when the
    ones before stay silent for `_NEXT_ADDRESS_DELAY` (or fail), the earlier ones keep trying;
    the others are closed. Waits are at most `CANCEL_POLL_INTERVAL` long, so a cancel is seen."""
    pending: dict[int, socket.socket] = {}
    poller = select.poll()
    queue = list(infos)
    last: OSError | None = None
    next_at = 0.0
    try:
        while True:
            now = time.monotonic()
            if queue and (now >= next_at or not pending):
                family, kind, proto, _, address = queue.pop(0)
                try:
                    sock = socket.socket(family, kind, proto)
                except OSError as exc:
                    last = exc
                    continue
                sock.setblocking(False)
                try:
                    sock.connect(address)
                except BlockingIOError:
                    pass
                except OSError as exc:
                    sock.close()
                    last = exc
                    continue
                pending[sock.fileno()] = sock
                poller.register(sock, select.POLLOUT)
                next_at = now + _NEXT_ADDRESS_DELAY
            if not pending:
                raise httpcore.ConnectError(last or OSError("no address to connect to"))
            cap = max(0.0, next_at - now) if queue else None
            cap = CANCEL_POLL_INTERVAL if cap is None else min(cap, CANCEL_POLL_INTERVAL)
            for fd, _ in poller.poll(exchange.wait_ms(cap)):
                sock = pending.pop(fd)
                poller.unregister(fd)
                error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if error == 0:
                    return sock
                sock.close()
                last = OSError(error, os.strerror(error))
            if exchange.aborted:
                raise _Cancelled
    finally:
        for sock in pending.values():
            sock.close()


_SYNC_BACKEND = _SyncBackend()


_ssl_lock = threading.Lock()


def _ssl_context() -> ssl.SSLContext:
    """Building an SSL context (loading the CA bundle) costs ~50 ms; do it once, under a lock
    (a worker's run threads start together: each built its own). SSLContext objects are safe
    to share between threads and event loops."""
    with _ssl_lock:
        return _new_ssl_context()


@functools.cache
def _new_ssl_context() -> ssl.SSLContext:
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


def _read_body(provider: Provider, resp: httpcore.Response) -> bytes:
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
    assert isinstance(stream, Iterable)
    for raw in stream:
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


def _send(
    provider: Provider,
    pool: httpcore.ConnectionPool,
    method: str,
    target: _Target,
    headers: dict[str, str],
    content: bytes | None,
    timeout: float,
) -> HttpResponse:
    try:
        resp = pool.handle_request(_core_request(method, target, headers, content, timeout))
        try:
            body = _read_body(provider, resp)
        finally:
            resp.close()
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
