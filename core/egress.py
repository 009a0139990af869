"""Outbound HTTP that cannot be turned against the inside: the address policy and DNS pinning.

Used by the `fetch_url` tool (agents) and by webhook delivery (tasks.notify), which sit in
different layers; this module imports no app.

* `address_refusal(ip)` says why an address may not be contacted: loopback, private, link-local
  (169.254.169.254 included), unspecified, multicast, reserved, shared or otherwise not global,
  IPv4 embedded in IPv6 (mapped, NAT64, 6to4, Teredo) included. `ip_literal` reads a host written
  as an address in any spelling the C resolver accepts (`127.1`, `0x7f.1`, `2130706433`).
* `resolve_host` resolves in a helper thread, so a slow resolver cannot outlive a deadline.
* `PinnedTransport` connects only to the addresses that were checked (no second resolution, no
  rebinding); the URL is not rewritten, so `Host`, SNI and certificate checks use the name.
* `Guard` holds one overall deadline (and an optional cancel event) from the first byte: every
  socket operation gets at most the time left and a watchdog shuts the socket down when it runs
  out, so a peer that trickles bytes cannot hold the caller past it.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx

GUARD_POLL_SECONDS = 0.1  # how often the watchdog looks at the cancel event

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")


class EgressError(Exception):
    """A request refused or interrupted by the policy; `code` is stable, `message` is for people."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class ResolveError(EgressError):
    """The host did not resolve (`failed`) or not in time (`timeout`)."""


def address_allowed_by(ip: IPAddress, allowed: tuple[str, ...] | list[str]) -> bool:
    """Is `ip` inside one of `allowed` (addresses or CIDR networks), the explicit exceptions a
    setting may make for internal peers?"""
    for entry in allowed:
        try:
            if ip in ipaddress.ip_network(entry.strip(), strict=False):
                return True
        except ValueError:
            continue
    return False


def checked_addresses(
    host: str, port: int, *, timeout: float, allowed: tuple[str, ...] | list[str] = ()
) -> list[str]:
    """Resolve `host` (or read it as an address) and refuse it unless every address is public or
    inside `allowed`. Returns the addresses to connect to (pin them); raises EgressError with
    `address_not_allowed`, or ResolveError."""
    lit = ip_literal(host)
    candidates = [str(lit)] if lit is not None else resolve_host(host, port, timeout)
    for text in candidates:
        try:
            ip = ipaddress.ip_address(text)
        except ValueError:
            raise EgressError(
                "address_not_allowed", f"{host!r} resolved to an unusable address."
            ) from None
        reason = address_refusal(ip)
        if reason and not address_allowed_by(ip, allowed):
            shown = host if lit is None else f"{host} ({ip})"
            raise EgressError(
                "address_not_allowed",
                f"Refused: {shown} is a {reason} address ({ip}); only public internet addresses "
                "can be reached.",
            )
    return candidates


def ip_literal(host: str) -> IPAddress | None:
    """The address a host string denotes by itself, in any spelling the resolver accepts."""
    if ":" in host:
        try:
            return ipaddress.IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return None
    if not host or not re.fullmatch(r"[0-9a-fx.]+", host):
        return None
    try:
        packed = socket.inet_aton(host)  # accepts 127.1, 0x7f.1, 2130706433, 0177.0.0.1
    except OSError:
        return None
    return ipaddress.IPv4Address(packed)


def _embedded_ipv4(ip: ipaddress.IPv6Address) -> list[ipaddress.IPv4Address]:
    found: list[ipaddress.IPv4Address] = []
    if ip.ipv4_mapped is not None:
        found.append(ip.ipv4_mapped)
    if ip.sixtofour is not None:
        found.append(ip.sixtofour)
    if ip.teredo is not None:
        found.extend(ip.teredo)
    if ip in _NAT64:
        found.append(ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF))
    return found


def address_refusal(ip: IPAddress) -> str | None:
    """Why this address may not be contacted (None when it is a public unicast address)."""
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.scope_id:
            return "scoped IPv6"
        for inner in _embedded_ipv4(ip):
            reason = address_refusal(inner)
            if reason:
                return f"{reason} (embedded in IPv6)"
    checks = (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("private", ip.is_private),
        ("reserved", ip.is_reserved),
        ("site-local", isinstance(ip, ipaddress.IPv6Address) and ip.is_site_local),
    )
    for reason, hit in checks:
        if hit:
            return reason
    if not ip.is_global:
        return "non-public"
    return None


def resolve_host(host: str, port: int, timeout: float) -> list[str]:
    """getaddrinfo in a helper thread so a slow resolver cannot outlive the deadline."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            box["error"] = exc

    worker = threading.Thread(target=work, name="egress-dns", daemon=True)
    worker.start()
    worker.join(max(timeout, 0.05))
    if worker.is_alive():
        raise ResolveError("timeout", f"Resolving {host!r} timed out.")
    if "error" in box:
        raise ResolveError("failed", f"Could not resolve host {host!r}: {box['error']}.")
    addresses: list[str] = []
    for family, _type, _proto, _canon, sockaddr in box.get("infos", []):
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        ip = str(sockaddr[0]).split("%", 1)[0]
        if ip not in addresses:
            addresses.append(ip)
    if not addresses:
        raise ResolveError("failed", f"Host {host!r} has no IP address.")
    return addresses


# --------------------------------------------------------------------------- deadline guard


class Guard:
    """One fetch's deadline and cancel, enforced from the first byte.

    A per-read timeout is not enough: a server that sends ``102 Processing`` every 0.5 s, or
    trickles its headers a byte at a time, resets it for ever. So every socket operation gets
    at most the time left, and a watchdog thread shuts the connection's socket down the moment
    the deadline passes or the task is cancelled, which ends any blocked read, write or TLS
    handshake at once. ``check`` then turns the interruption into ``fetch_timeout`` or
    ``cancelled``.
    """

    def __init__(self, deadline: float, cancel_event: threading.Event | None) -> None:
        self.deadline = deadline
        self.cancel_event = cancel_event
        self.fired = ""  # "", "timeout" or "cancelled"
        self._fds: dict[int, Any] = {}  # fd -> the peer address it was connected to
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="egress-guard", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.is_set():
            if self.cancel_event is not None and self.cancel_event.is_set():
                self._fire("cancelled")
                return
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                self._fire("timeout")
                return
            self._done.wait(min(remaining, GUARD_POLL_SECONDS))

    def _fire(self, reason: str) -> None:
        with self._lock:
            if self._done.is_set():
                return
            self.fired = reason
            for fd, peer in self._fds.items():
                _shutdown_fd(fd, peer)

    def stop(self) -> None:
        with self._lock:
            self._done.set()
        self._thread.join(1)

    def register(self, fd: int, peer: Any) -> None:
        with self._lock:
            self._fds[fd] = peer
            if self.fired:
                _shutdown_fd(fd, peer)

    def unregister(self, fd: int) -> None:
        """Called before the socket is closed, so a late watchdog never touches a reused fd."""
        with self._lock:
            self._fds.pop(fd, None)

    def check(self, url: str = "") -> None:
        reason = self.fired
        if not reason:
            if self.cancel_event is not None and self.cancel_event.is_set():
                reason = "cancelled"
            elif time.monotonic() >= self.deadline:
                reason = "timeout"
        if reason == "cancelled":
            raise self.cancelled()
        if reason == "timeout":
            raise httpcore.ReadTimeout(f"the overall deadline passed{' for ' + url if url else ''}")

    def cancelled(self) -> Exception:
        """The error a cancelled operation raises (a tool turns it into its own)."""
        return EgressError("cancelled", "cancelled while the request was in flight")

    def timeout(self, timeout: float | None) -> float:
        """The time one socket operation may take: what is left, never more."""
        remaining = max(0.01, self.deadline - time.monotonic())
        return remaining if timeout is None else max(0.01, min(timeout, remaining))


def _shutdown_fd(fd: int, peer: Any) -> None:
    """Shut down the socket on ``fd`` (not close: its owner still closes it), but only if it is
    still the connection to ``peer``: a descriptor closed behind our back may have been reused."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        return
    try:
        if sock.getpeername() == peer:
            sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    finally:
        sock.detach()


class GuardedStream(httpcore.NetworkStream):
    """A network stream whose every operation is bounded by the guard's deadline and cancel."""

    def __init__(self, stream: httpcore.NetworkStream, guard: Guard, fd: int) -> None:
        self._stream = stream
        self._guard = guard
        self._fd = fd

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        self._guard.check()
        try:
            data = self._stream.read(max_bytes, self._guard.timeout(timeout))
        except httpcore.NetworkError:
            self._guard.check()
            raise
        if not data:
            self._guard.check()
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._guard.check()
        try:
            self._stream.write(buffer, self._guard.timeout(timeout))
        except httpcore.NetworkError:
            self._guard.check()
            raise

    def close(self) -> None:
        self._guard.unregister(self._fd)
        self._stream.close()

    def start_tls(
        self, ssl_context: Any, server_hostname: str | None = None, timeout: float | None = None
    ) -> httpcore.NetworkStream:
        self._guard.check()
        try:
            inner = self._stream.start_tls(
                ssl_context, server_hostname, self._guard.timeout(timeout)
            )
        except BaseException:
            # A failed handshake closes the socket itself: forget its descriptor first.
            self._guard.unregister(self._fd)
            self._guard.check()
            raise
        # The TLS socket keeps the same file descriptor.
        return GuardedStream(inner, self._guard, self._fd)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


# --------------------------------------------------------------------------- pinned transport


class PinnedBackend(httpcore.SyncBackend):
    """Connects to the pre-checked IPs for one host name, never resolving it again."""

    def __init__(self, host: str, addresses: list[str], guard: Guard | None = None) -> None:
        self._host = host
        self._addresses = list(addresses)
        self._guard = guard

    def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.NetworkStream:
        if host.strip("[]").lower().rstrip(".") != self._host:
            raise httpcore.ConnectError(f"refusing to connect to unexpected host {host!r}")
        last: Exception | None = None
        for ip in self._addresses:
            if self._guard is not None:
                self._guard.check()
                timeout = self._guard.timeout(timeout)
            try:
                stream = super().connect_tcp(ip, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as exc:
                last = exc
                continue
            if self._guard is None:
                return stream
            sock = stream.get_extra_info("socket")
            fd = sock.fileno()
            try:
                peer = sock.getpeername()
            except OSError:
                stream.close()
                raise httpcore.ConnectError("the connection closed at once") from None
            self._guard.register(fd, peer)
            return GuardedStream(stream, self._guard, fd)
        if self._guard is not None:
            self._guard.check()
        raise last or httpcore.ConnectError("no address to connect to")

    def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("unix sockets are not allowed")


_EXC_MAP: tuple[tuple[type[Exception], type[httpx.HTTPError]], ...] = (
    (httpcore.ConnectTimeout, httpx.ConnectTimeout),
    (httpcore.ReadTimeout, httpx.ReadTimeout),
    (httpcore.WriteTimeout, httpx.WriteTimeout),
    (httpcore.PoolTimeout, httpx.PoolTimeout),
    (httpcore.TimeoutException, httpx.TimeoutException),
    (httpcore.ConnectError, httpx.ConnectError),
    (httpcore.ReadError, httpx.ReadError),
    (httpcore.WriteError, httpx.WriteError),
    (httpcore.RemoteProtocolError, httpx.RemoteProtocolError),
    (httpcore.LocalProtocolError, httpx.LocalProtocolError),
    (httpcore.ProtocolError, httpx.ProtocolError),
    (httpcore.UnsupportedProtocol, httpx.UnsupportedProtocol),
    (httpcore.NetworkError, httpx.NetworkError),
)


@contextmanager
def map_httpcore_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for core_cls, httpx_cls in _EXC_MAP:
            if isinstance(exc, core_cls):
                raise httpx_cls(str(exc) or core_cls.__name__) from exc
        raise


class PinnedStream(httpx.SyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with map_httpcore_errors():
            yield from self._stream

    def close(self) -> None:
        close = getattr(self._stream, "close", None)
        if close is not None:
            close()


_SSL_CONTEXT = None
_SSL_LOCK = threading.Lock()


def _ssl_context() -> Any:
    global _SSL_CONTEXT
    with _SSL_LOCK:
        if _SSL_CONTEXT is None:
            _SSL_CONTEXT = httpx.create_ssl_context(trust_env=False)
        return _SSL_CONTEXT


class PinnedTransport(httpx.BaseTransport):
    """An httpx transport whose sockets go only to ``addresses`` for ``host``."""

    def __init__(self, host: str, addresses: list[str], guard: Guard | None = None) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=_ssl_context(),
            max_connections=1,
            max_keepalive_connections=0,
            http1=True,
            http2=False,
            retries=0,
            network_backend=PinnedBackend(host, addresses, guard),
        )

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(
                scheme=request.url.raw_scheme,
                host=request.url.raw_host,
                port=request.url.port,
                target=request.url.raw_path,
            ),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        with map_httpcore_errors():
            core_response = self._pool.handle_request(core_request)
        return httpx.Response(
            status_code=core_response.status,
            headers=core_response.headers,
            stream=PinnedStream(core_response.stream),
            extensions=core_response.extensions,
        )

    def close(self) -> None:
        self._pool.close()
