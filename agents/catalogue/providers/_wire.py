"""One HTTP/1.1 exchange on an asyncio protocol: what a model request needs, and no more.

A model request is a POST of JSON answered with JSON. Every request of a worker process runs on
its one event loop (`core.fibers`), so the loop's CPU per request caps how many agents a process
holds: through httpx's client it was 1.5 ms a request on this machine (3 ms with 50 in flight:
anyio's cancel scopes and locks, a pool that looks at every waiting request for each
connection), on asyncio's transport directly 0.1 ms (`bench/request_cpu.py`). So the direct
exchange is written here: the request in one write, the response parsed as it arrives — status
line, headers, a body by Content-Length, chunked, or to the end of the connection — decoded
(gzip, deflate) and capped as it grows. Connections are kept alive per origin (`Pool`) and
trusted for `KEEPALIVE_SECONDS` idle; one the server closed is dropped when the loop sees the
close. A new connection goes straight to the address the last one to its origin reached
(`ADDRESS_SECONDS`); one refused there resolves and races (Happy Eyeballs) again. A cancelled or
failed exchange aborts its connection. Redirects are answers like any
other (never followed). With a proxy in the environment, `_http` uses httpx's client instead.
A streamed answer's pieces are handed to the caller's `on_body` as they are decoded (the body
is kept whole as well, and capped as a whole); what `on_body` raises fails the exchange.
"""

from __future__ import annotations

import asyncio
import contextlib
import select
import socket
import ssl
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass

KEEPALIVE_SECONDS = 5.0
#: A response's status line and headers may take this much; more is a protocol error.
MAX_HEAD_BYTES = 64 * 1024


class WireError(Exception):
    """What went wrong, by kind: "connect" (no connection: refused, unresolvable, TLS), "closed"
    (the server closed the connection mid-response), "protocol" (not HTTP/1.1 as it should
    be), "decode" (a body its Content-Encoding does not decode), "too_large" (over the cap)."""

    def __init__(self, kind: str, message: str, status: int | None = None):
        super().__init__(message)
        self.kind, self.status = kind, status


#: Called on the loop with each decoded piece of a body as it arrives: the status, the headers
#: and the piece. What it raises fails the exchange (the connection is aborted).
type OnBody = Callable[[int, list[tuple[bytes, bytes]], bytes], None]


class Outgoing:
    """A request's bytes until the exchange writes them, then nothing: a run waiting for its
    answer keeps nothing of what it sent (a model request's body is the whole conversation)."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def take(self) -> bytes:
        data, self.data = self.data, b""
        return data


@dataclass(frozen=True)
class Answer:
    status: int
    headers: list[tuple[bytes, bytes]]
    body: bytes


class _Decoder:
    """Content-Encoding gzip or deflate (zlib-wrapped, or raw as some servers send it)."""

    def __init__(self, coding: bytes):
        self.raw_fallback = coding == b"deflate"
        wbits = 16 + zlib.MAX_WBITS if coding in (b"gzip", b"x-gzip") else zlib.MAX_WBITS
        self.inner = zlib.decompressobj(wbits)
        self.started = False

    def decode(self, data: bytes, room: int) -> bytes:
        """At most `room` + 1 bytes (enough to tell the cap was passed)."""
        try:
            out = self.inner.decompress(data, room + 1)
        except zlib.error:
            if self.raw_fallback and not self.started:
                self.inner, self.raw_fallback = zlib.decompressobj(-zlib.MAX_WBITS), False
                return self.decode(data, room)
            raise
        self.started = True
        return out

    def flush(self) -> bytes:
        return self.inner.flush()


class _Connection(asyncio.Protocol):
    """One connection, one exchange at a time; the response parsed in `data_received`. An
    exchange that ended lets go of what it used (its caller's `on_body`, the body's pieces): a
    kept-alive connection holds nothing of the run that used it last."""

    __slots__ = (
        "body",
        "buffer",
        "cap",
        "chunk_state",
        "closed",
        "decoder",
        "future",
        "head_only",
        "headers",
        "idle_since",
        "keep_alive",
        "loop",
        "mode",
        "on_body",
        "received",
        "remaining",
        "status",
        "total",
        "transport",
    )

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        #: The loop the connection lives on: only requests on that loop may reuse it.
        self.loop = asyncio.get_running_loop()
        self.closed = False
        self.idle_since = 0.0
        self._reset(None, 0, False)

    def _reset(
        self,
        future: asyncio.Future[Answer] | None,
        cap: int,
        head_only: bool,
        on_body: OnBody | None = None,
    ) -> None:
        self.future = future
        self.on_body = on_body
        self.cap = cap
        self.head_only = head_only
        self.buffer = bytearray()
        self.status = 0
        self.headers: list[tuple[bytes, bytes]] = []
        self.mode = ""  # "" head not read; "length", "chunked", "close", "none"
        self.remaining = 0  # bytes of the body (length) or of the chunk (chunked)
        self.chunk_state = "size"  # chunked: "size", "data", "crlf", "trailer"
        self.body: list[bytes] = []
        self.total = 0
        self.decoder: _Decoder | None = None
        self.keep_alive = True
        self.received = False

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self.future is None or self.future.done():
            # Bytes nobody asked for (on an idle connection): it cannot be reused.
            self.abort()
            return
        self.received = True
        self.buffer += data
        try:
            self._parse()
        except WireError as exc:
            self._fail(exc)
        except (zlib.error, ValueError) as exc:
            self._fail(WireError("decode", f"cannot decode response body: {exc}", self.status))
        except Exception as exc:  # noqa: BLE001 - what on_body raised: the exchange's error
            self._fail(exc)

    def eof_received(self) -> bool:
        return False  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self.future is None or self.future.done():
            return
        if self.mode == "close":
            try:
                self._finish()
            except WireError as error:
                self._fail(error)
            except zlib.error as error:
                self._fail(WireError("decode", f"cannot decode response body: {error}"))
            except Exception as error:  # noqa: BLE001 - what on_body raised
                self._fail(error)
            return
        why = f": {exc}" if exc else ""
        self._fail(WireError("closed", f"the server closed the connection mid-response{why}"))

    # -- one exchange ------------------------------------------------------------------------

    async def exchange(
        self, request: Outgoing, cap: int, *, head_only: bool, on_body: OnBody | None = None
    ) -> Answer:
        assert self.transport is not None
        future: asyncio.Future[Answer] = asyncio.get_running_loop().create_future()
        self._reset(future, cap, head_only, on_body)
        self.transport.write(request.take())  # what the socket did not take, the transport keeps
        return await future

    def quiet(self) -> bool:
        """Whether the idle connection has nothing to read: a server that closed it (or said
        anything unasked) makes its socket readable before the loop gets to handle it."""
        sock = self.transport.get_extra_info("socket") if self.transport is not None else None
        if sock is None:
            return False
        poller = select.poll()
        poller.register(sock.fileno(), select.POLLIN | select.POLLPRI)
        return not poller.poll(0)

    def abort(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.abort()

    def _fail(self, exc: Exception) -> None:
        self.keep_alive = False
        if self.future is not None and not self.future.done():
            self.future.set_exception(exc)
        self.abort()

    # -- the response --------------------------------------------------------------------------

    def _parse(self) -> None:
        if not self.mode and not self._head():
            return
        if self.mode == "length":
            take = min(self.remaining, len(self.buffer))
            self._body(bytes(self.buffer[:take]))
            del self.buffer[:take]
            self.remaining -= take
            if self.remaining == 0:
                self._finish()
        elif self.mode == "chunked":
            self._chunks()
        elif self.mode == "close":
            self._body(bytes(self.buffer))
            self.buffer.clear()
        elif self.mode == "none":
            self._finish()

    def _head(self) -> bool:
        """The status line and headers, once complete (1xx answers skipped)."""
        while True:
            end = self.buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    raise WireError("protocol", "response headers too large")
                return False
            lines = bytes(self.buffer[:end]).split(b"\r\n")
            del self.buffer[: end + 4]
            parts = lines[0].split(b" ", 2)
            if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
                raise WireError("protocol", f"not an HTTP/1.1 status line: {lines[0][:80]!r}")
            status = int(parts[1])
            if 100 <= status < 200 and status != 101:
                continue  # 100 Continue and the like: the real answer follows
            headers = []
            for line in lines[1:]:
                name, sep, value = line.partition(b":")
                if not sep or not name or name != name.strip():
                    raise WireError("protocol", f"malformed header line: {line[:80]!r}")
                headers.append((name, value.strip()))
            self.status, self.headers = status, headers
            self._body_mode(parts[0] == b"HTTP/1.0")
            return True

    def _body_mode(self, http10: bool) -> None:
        length: int | None = None
        chunked = False
        codings: list[bytes] = []
        connection = b""
        for name, value in self.headers:
            lowered = name.lower()
            if lowered == b"content-length":
                if not value.isdigit() or (length is not None and int(value) != length):
                    raise WireError("protocol", "invalid Content-Length")
                length = int(value)
            elif lowered == b"transfer-encoding":
                chunked = value.lower().split(b",")[-1].strip() == b"chunked"
            elif lowered == b"content-encoding":
                codings += [c.strip().lower() for c in value.split(b",") if c.strip()]
            elif lowered == b"connection":
                connection = value.lower()
        self.keep_alive = b"close" not in connection and (not http10 or b"keep-alive" in connection)
        codings = [c for c in codings if c != b"identity"]
        if codings:
            if len(codings) > 1 or codings[0] not in (b"gzip", b"x-gzip", b"deflate"):
                raise WireError("decode", f"unsupported Content-Encoding {b', '.join(codings)!r}")
            self.decoder = _Decoder(codings[0])
        if self.head_only or self.status in (204, 304):
            self.mode = "none"
        elif chunked:
            self.mode = "chunked"
        elif length is not None:
            if length > self.cap:
                raise WireError(
                    "too_large",
                    f"response body of {length} bytes exceeds the limit of {self.cap} bytes",
                    self.status,
                )
            self.mode, self.remaining = "length", length
        else:
            self.mode, self.keep_alive = "close", False

    def _chunks(self) -> None:
        while True:
            if self.chunk_state == "data":
                take = min(self.remaining, len(self.buffer))
                if take:
                    self._body(bytes(self.buffer[:take]))
                    del self.buffer[:take]
                    self.remaining -= take
                if self.remaining:
                    return
                self.chunk_state = "crlf"
            end = self.buffer.find(b"\r\n")
            if end < 0:
                if len(self.buffer) > MAX_HEAD_BYTES:
                    raise WireError("protocol", "a chunk line too long")
                return
            line = bytes(self.buffer[:end])
            del self.buffer[: end + 2]
            if self.chunk_state == "crlf":
                if line:
                    raise WireError("protocol", "no CRLF after a chunk")
                self.chunk_state = "size"
            elif self.chunk_state == "size":
                size = line.split(b";", 1)[0].strip()
                try:
                    self.remaining = int(size, 16)
                except ValueError:
                    raise WireError("protocol", f"invalid chunk size {size[:20]!r}") from None
                self.chunk_state = "data" if self.remaining else "trailer"
            elif not line:  # the empty line that ends the trailers
                self._finish()
                return

    def _body(self, data: bytes) -> None:
        if self.decoder is not None:
            data = self.decoder.decode(data, self.cap - self.total)
        self._keep(data)

    def _keep(self, data: bytes) -> None:
        """Decoded body bytes: counted against the cap, kept, handed to `on_body`."""
        self.total += len(data)
        if self.total > self.cap:
            raise WireError(
                "too_large", f"response body exceeds the limit of {self.cap} bytes", self.status
            )
        self.body.append(data)
        if self.on_body is not None and data:
            self.on_body(self.status, self.headers, data)

    def _finish(self) -> None:
        if self.decoder is not None:
            self._keep(self.decoder.flush())
        if self.buffer:  # bytes after the answer: the connection is out of step
            self.keep_alive = False
        assert self.future is not None
        answer = Answer(self.status, self.headers, b"".join(self.body))
        self.body, self.on_body, self.decoder = [], None, None
        if not self.future.done():
            self.future.set_result(answer)
        self.idle_since = time.monotonic()


class Pool:
    """Kept-alive connections per origin (touched on the loop only)."""

    def __init__(self) -> None:
        self.idle: dict[tuple[str, str, int], list[_Connection]] = {}

    def take(self, key: tuple[str, str, int]) -> _Connection | None:
        idle = self.idle.get(key)
        now = time.monotonic()
        loop = asyncio.get_running_loop()
        while idle:
            conn = idle.pop()
            if conn.loop is not loop:
                # Made on another loop (a request made where a loop already ran gets a private
                # one, gone since): its transport can never be read again here.
                with contextlib.suppress(RuntimeError):  # that loop is closed
                    conn.abort()
                continue
            if not conn.closed and now - conn.idle_since < KEEPALIVE_SECONDS and conn.quiet():
                return conn
            conn.abort()
        return None

    def give_back(self, key: tuple[str, str, int], conn: _Connection) -> None:
        if conn.closed or not conn.keep_alive:
            conn.abort()
            return
        conn.future = conn.on_body = None
        self.idle.setdefault(key, []).append(conn)

    def close(self) -> None:
        for idle in self.idle.values():
            for conn in idle:
                conn.abort()
        self.idle.clear()

    async def send(
        self,
        *,
        scheme: str,
        host: str,
        port: int,
        request: Outgoing,
        cap: int,
        head_only: bool,
        ssl_context: ssl.SSLContext | None,
        on_body: OnBody | None = None,
    ) -> Answer:
        """One exchange on a kept-alive or new connection. A connection that did not end its
        exchange cleanly (cancelled, timed out, failed) is aborted, never reused. `on_body`, if
        given, sees each decoded piece of the body as it arrives (a streamed answer); the body
        is kept whole as well, and the cap counts all of it."""
        key = (scheme, host, port)
        conn = self.take(key)
        if conn is None:
            conn = await _connect(host, port, ssl_context)
        done = False
        try:
            answer = await conn.exchange(request, cap, head_only=head_only, on_body=on_body)
            done = True
            return answer
        finally:
            if done:
                self.give_back(key, conn)
            else:
                conn.abort()


#: How long the address a connection to an origin reached is used for the next connections
#: without resolving and racing again (asyncio's resolving and Happy Eyeballs were a fifth of a
#: worker's CPU while 10,000 agents made their first requests).
ADDRESS_SECONDS = 30.0
_reached: dict[tuple[str, int], tuple[float, int, tuple[object, ...]]] = {}


async def _connect(host: str, port: int, context: ssl.SSLContext | None) -> _Connection:
    """A new connection to host:port: straight to the address the last one reached (within
    `ADDRESS_SECONDS`), else resolved and raced (Happy Eyeballs) as asyncio does it."""
    loop = asyncio.get_running_loop()
    name = host.strip("[]")
    key = (name, port)
    server_hostname = name if context is not None else None
    reached = _reached.get(key)
    if reached is not None and reached[0] > time.monotonic():
        _, family, address = reached
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            await loop.sock_connect(sock, address)
        except OSError:
            sock.close()
            _reached.pop(key, None)  # moved or down: resolve and race again
        except BaseException:
            sock.close()
            raise
        else:
            try:
                _, conn = await loop.create_connection(
                    _Connection, sock=sock, ssl=context, server_hostname=server_hostname
                )
            except ssl.SSLError as exc:
                raise WireError("connect", f"TLS: {exc}") from None
            except OSError as exc:
                raise WireError("connect", str(exc) or type(exc).__name__) from None
            return conn
    try:
        transport, conn = await loop.create_connection(
            _Connection,
            name,
            port,
            ssl=context,
            server_hostname=server_hostname,
            happy_eyeballs_delay=0.25,
        )
    except ssl.SSLError as exc:
        raise WireError("connect", f"TLS: {exc}") from None
    except OSError as exc:
        raise WireError("connect", str(exc) or type(exc).__name__) from None
    sock = transport.get_extra_info("socket")
    address = transport.get_extra_info("peername")
    if sock is not None and address is not None:
        _reached[key] = (time.monotonic() + ADDRESS_SECONDS, sock.family, tuple(address))
    return conn
