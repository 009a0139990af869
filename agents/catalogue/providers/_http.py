"""Shared HTTP machinery for the HTTP providers.

Every request runs on a private event loop with ``httpx.AsyncClient`` so that it can be
really aborted: a watcher task polls the caller's ``threading.Event`` and cancels the
request task, and the client is closed, which closes the connection. Each thread keeps one
client per provider endpoint (its loop's), so a worker reuses its connection to the model
server from turn to turn; a cancelled, timed-out or failed request discards its client. An
overall deadline bounds the whole exchange (slow-loris servers), and the body is streamed with
a byte cap.
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
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

import httpx

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
) -> HttpResponse:
    """Send one request and return the full (capped) response; raise ProviderError on
    transport problems, timeout, cancellation or an oversized body. HTTP error statuses are
    returned, not raised: the caller classifies them with ``raise_for_status``. The body is
    ``json_body`` encoded here, or ``encoded_body``, JSON the caller encoded already."""
    provider.check_config()
    provider.check_request_url(url)

    def coro(reuse: bool) -> Coroutine[Any, Any, HttpResponse]:
        return _request(
            provider,
            method,
            url,
            headers=headers,
            json_body=json_body,
            encoded_body=encoded_body,
            cancel_event=cancel_event,
            timeout=timeout or provider.timeout,
            reuse=reuse,
        )

    return _run(coro)


# A thread's client is kept per (provider class name, origin, timeout).
type _ClientKey = tuple[str, str, float]

_loops = threading.local()
#: Loops (with their clients and kept-alive connections) that threads gave back
#: (`release_thread_http`), for the next thread: a worker runs each task in a thread of its own,
#: and a new loop, client and connection cost a task's first request more than the request.
_idle: list[tuple[asyncio.AbstractEventLoop, dict[_ClientKey, httpx.AsyncClient]]] = []
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
        loop, _loops.loop, _loops.clients = taken[0], taken[0], taken[1]
    return loop


def release_thread_http() -> None:
    """This thread is done with model requests (a worker's run thread ending): its loop, with
    its clients and their kept-alive connections, goes to the next thread that asks. Only a
    loop that is not running is given back; beyond `_IDLE_MAX` idle loops it is closed."""
    loop = getattr(_loops, "loop", None)
    clients: dict[_ClientKey, httpx.AsyncClient] = getattr(_loops, "clients", None) or {}
    _loops.loop, _loops.clients = None, None
    if loop is None or loop.is_closed() or loop.is_running():
        return
    with _idle_lock:
        if len(_idle) < _IDLE_MAX:
            _idle.append((loop, clients))
            return
    for client in clients.values():
        loop.run_until_complete(client.aclose())
    loop.close()


def _run[T](coro: Callable[[bool], Coroutine[Any, Any, T]]) -> T:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _thread_loop().run_until_complete(coro(True))
    # Called from inside a running event loop (e.g. async code calling the sync API):
    # run on a private loop in a helper thread so we never block or nest loops.
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, coro(False)).result()


def _new_client(timeout: float, *, keep_alive: bool) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        verify=_ssl_context(),
        timeout=httpx.Timeout(timeout),
        follow_redirects=False,
        limits=httpx.Limits(max_connections=1, max_keepalive_connections=1 if keep_alive else 0),
    )


def _client(provider: Provider, url: str, timeout: float) -> tuple[_ClientKey, httpx.AsyncClient]:
    """This thread's client for the endpoint (one per connection: scheme, host, port)."""
    clients: dict[_ClientKey, httpx.AsyncClient] | None = getattr(_loops, "clients", None)
    if clients is None:
        clients = _loops.clients = {}
    key: _ClientKey = (type(provider).__name__, _origin(url), timeout)
    client = clients.get(key)
    if client is None or client.is_closed:
        client = clients[key] = _new_client(timeout, keep_alive=True)
    return key, client


async def _discard(key: _ClientKey | None, client: httpx.AsyncClient) -> None:
    clients: dict[_ClientKey, httpx.AsyncClient] = getattr(_loops, "clients", {})
    if key is not None and clients.get(key) is client:
        del clients[key]
    await client.aclose()


async def _request(
    provider: Provider,
    method: str,
    url: str,
    *,
    headers: dict[str, str],
    json_body: Any,
    cancel_event: threading.Event | None,
    timeout: float,
    reuse: bool = False,
    encoded_body: bytes | None = None,
) -> HttpResponse:
    if cancel_event is not None and cancel_event.is_set():
        raise provider.error(PROVIDER_CANCELLED, "request cancelled before it was sent")
    content = encoded_body
    if json_body is not None:
        content = json.dumps(json_body, ensure_ascii=False).encode("utf-8")
    if content is not None:
        headers = {"content-type": "application/json", **headers}
    key: _ClientKey | None = None
    if reuse:
        key, client = _client(provider, url, timeout)
    else:
        client = _new_client(timeout, keep_alive=False)
    watcher: asyncio.Task[None] | None = None
    task: asyncio.Task[HttpResponse] | None = None
    ok = False
    try:
        task = asyncio.create_task(_send(provider, client, method, url, headers, content, timeout))
        waiters: set[asyncio.Task[Any]] = {task}
        if cancel_event is not None:
            watcher = asyncio.create_task(_watch(cancel_event))
            waiters.add(watcher)
        done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if task in done:
            result = task.result()
            ok = True
            return result
        await _cancel(task)
        if watcher is not None and watcher in done:
            raise provider.error(PROVIDER_CANCELLED, "request cancelled by the caller")
        raise provider.error(
            PROVIDER_TIMEOUT, f"no complete response within {timeout:g} s (overall deadline)"
        )
    finally:
        if task is not None and not task.done():
            await _cancel(task)
        if watcher is not None:
            await _cancel(watcher)
        if not (ok and reuse):
            # Cancelled, timed out or failed: closing the client closes its connection.
            await _discard(key, client)


@functools.cache
def _ssl_context() -> ssl.SSLContext:
    """Building an SSL context (loading the CA bundle) costs ~50 ms; do it once.
    SSLContext objects are safe to share between threads and event loops."""
    return httpx.create_ssl_context()


async def _cancel(task: asyncio.Task[Any]) -> None:
    """Cancel ``task`` and wait until it is finished, without raising its outcome."""
    if task.done():
        return
    task.cancel()
    await asyncio.wait({task})
    if not task.cancelled():
        task.exception()  # mark a late exception as retrieved


async def _watch(event: threading.Event) -> None:
    """Return when `event` is set: woken by it when it can call back (`CancelEvent`, what the
    engine passes), else by polling."""
    if isinstance(event, CancelEvent):
        loop = asyncio.get_running_loop()
        woken: asyncio.Future[None] = loop.create_future()

        def settle() -> None:
            if not woken.done():
                woken.set_result(None)

        def wake() -> None:
            # RuntimeError: the loop closed meanwhile; the request is over anyway.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(settle)

        event.add_callback(wake)
        try:
            await woken
        finally:
            event.remove_callback(wake)
        return
    while not event.is_set():
        await asyncio.sleep(CANCEL_POLL_INTERVAL)


async def _send(
    provider: Provider,
    client: httpx.AsyncClient,
    method: str,
    url: str,
    headers: dict[str, str],
    content: bytes | None,
    timeout: float,
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
