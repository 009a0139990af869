"""``fetch_url``: one HTTP(S) GET with SSRF protection, for unattended agents.

Defences, in the order they apply:

* **URL shape**: only ``http``/``https``; no ``user:pass@``; the host must be a
  plain DNS name or an IP literal (``%``-escapes, spaces etc. refused); at most
  2,000 characters.
* **Address check**: IP literals in *any* spelling (``127.1``, ``0x7f.1``,
  ``2130706433``, ``[::1]``, ``[::ffff:127.0.0.1]``) are parsed like the C
  resolver does (``inet_aton``); names are resolved with ``getaddrinfo``.
  Unless ``ctx.allow_private_network``, the request is refused when *any*
  resolved address is loopback, private, link-local (incl. 169.254.169.254),
  unspecified, multicast, reserved, shared (100.64/10) or otherwise not global,
  including IPv4 addresses embedded in IPv6 (IPv4-mapped, NAT64 64:ff9b::/96,
  6to4, Teredo).  This happens before any connection is opened.
* **DNS pinning (anti-rebinding)**: the connection goes to exactly the
  addresses that were checked.  Each hop uses an ``httpx.Client`` whose
  transport wraps an ``httpcore.ConnectionPool`` with a custom *network
  backend*: its ``connect_tcp`` ignores DNS and connects to the checked IPs
  (refusing any other host name).  The URL is not rewritten, so the ``Host``
  header, TLS SNI and certificate verification all use the original host name;
  only the socket's destination is pinned.  Environment proxies and ``.netrc``
  are ignored (``trust_env=False``).
* **Redirects** are followed by hand (at most 5, else ``too_many_redirects``);
  every hop is re-checked (scheme, credentials, address) and must stay on the
  first URL's host or a host covered by ``ctx.allowed_domains``, else
  ``url_domain_not_allowed``.
* **Budget**: every request, redirects included, counts against
  ``ctx.network_requests_remaining``; a request that would exceed it is not
  made (``network_limit``).  ``ToolResult.network_requests`` and
  ``ToolError.network_requests`` report how many were made.
* **Size and time**: ``Content-Length`` above the cap is refused before the
  body is read; otherwise the body is streamed as it arrives and the call
  stops once it passes the cap (``response_too_large``).  ``Accept-Encoding:
  identity`` is requested; a gzip/deflate body sent anyway is decompressed
  with a bound (no zip bombs).  One overall deadline (``ctx.fetch_timeout``)
  covers DNS, connecting, every hop and the body (``fetch_timeout``);
  ``ctx.cancel_event`` is checked between chunks.
"""

from __future__ import annotations

import hashlib
import ipaddress
import re
import socket
import threading
import time
import unicodedata
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import httpcore
import httpx
from pydantic import Field

from .base import RecoveryClass, Tool, ToolArgs, ToolContext, ToolError, ToolResult
from .registry import register

MAX_URL_CHARS = 2000
MAX_REDIRECTS = 5
USER_AGENT = "Acthelm-agent/1.0 (+fetch_url)"
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
BINARY_PREVIEW_BYTES = 32
GUARD_POLL_SECONDS = 0.1  # how often the watchdog looks at the cancel event

_HOSTNAME_RE = re.compile(r"[a-z0-9_](?:[a-z0-9_-]{0,62})(?:\.[a-z0-9_](?:[a-z0-9_-]{0,62}))*\.?")
_TEXT_MIME_EXACT = frozenset(
    {
        "application/json",
        "application/xml",
        "application/javascript",
        "application/ecmascript",
        "application/x-javascript",
        "application/x-www-form-urlencoded",
        "application/x-ndjson",
        "application/csv",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/sql",
        "image/svg+xml",
    }
)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

_NAT64 = ipaddress.ip_network("64:ff9b::/96")

# Refused anywhere in a URL: format characters (Cf: bidi overrides and isolates, zero-width
# spaces and joiners, soft hyphens, BOM) and non-ASCII separators. They are invisible or
# reorder what a person reads on the approval card.
_INVISIBLE_CATEGORIES = frozenset({"Cf", "Zs", "Zl", "Zp"})


class FetchUrlArgs(ToolArgs):
    url: str = Field(
        ..., min_length=1, max_length=MAX_URL_CHARS, description="http:// or https:// URL to GET."
    )
    max_bytes: int | None = Field(
        None,
        ge=1,
        le=50_000_000,
        description="Refuse bodies larger than this (the task's own limit applies too).",
    )


# --------------------------------------------------------------------------- URL + host checks


def _refuse(code: str, message: str) -> ToolError:
    return ToolError(code, message)


def parse_url(raw: str) -> httpx.URL:
    """Parse and validate a URL's shape (not its address).  Raises ToolError."""
    if not isinstance(raw, str):
        raise _refuse("url_invalid", "The URL must be a string.")
    raw = raw.strip()
    if len(raw) > MAX_URL_CHARS:
        raise _refuse("url_invalid", f"The URL is longer than {MAX_URL_CHARS} characters.")
    if re.search(r"[\x00-\x20\x7f]", raw):
        raise _refuse("url_invalid", "The URL contains spaces or control characters.")
    for ch in raw:
        if not ch.isascii() and unicodedata.category(ch) in _INVISIBLE_CATEGORIES:
            name = unicodedata.name(ch, "unnamed character")
            raise _refuse(
                "url_invalid",
                f"The URL contains an invisible formatting or bidirectional character "
                f"(U+{ord(ch):04X} {name}), which can make a URL read differently from where it "
                "goes; remove it.",
            )
    scheme_match = re.match(r"([A-Za-z][A-Za-z0-9+.-]*):", raw)
    if not scheme_match:
        raise _refuse(
            "url_scheme_not_allowed",
            f"The URL {raw!r} has no scheme; use a full http:// or https:// URL.",
        )
    scheme = scheme_match.group(1).lower()
    if scheme not in ("http", "https"):
        raise _refuse(
            "url_scheme_not_allowed",
            f"Only http and https URLs can be fetched, not {scheme}:.",
        )
    try:
        url = httpx.URL(raw)
    except (httpx.InvalidURL, ValueError, TypeError) as exc:
        raise _refuse("url_invalid", f"Invalid URL {raw!r}: {exc}.") from None
    if url.scheme not in ("http", "https"):  # pragma: no cover - checked above
        raise _refuse("url_scheme_not_allowed", "Only http and https URLs can be fetched.")
    if url.userinfo:
        raise _refuse(
            "url_credentials_not_allowed",
            "URLs with a user name or password (user:pass@host) are not allowed.",
        )
    host = normalize_host(url)
    if not host:
        raise _refuse("url_invalid", f"The URL {raw!r} has no host.")
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            raise _refuse("url_invalid", f"Invalid IPv6 address in URL: {host!r}.") from None
    elif not _HOSTNAME_RE.fullmatch(host) or len(host) > 253:
        raise _refuse("url_invalid", f"Invalid host name in URL: {host!r}.")
    return url


def request_target(url: httpx.URL) -> str:
    """``scheme://ascii-host:port/path?query`` exactly as the request will use it."""
    host = normalize_host(url)
    if ":" in host:
        host = f"[{host}]"
    port = url.port or (443 if url.scheme == "https" else 80)
    path = url.raw_path.decode("ascii", "replace") or "/"
    return f"{url.scheme}://{host}:{port}{path}"


def urlsplit_host(raw: str) -> str:
    """The host part of a URL as the model typed it (for showing), or ''."""
    match = re.match(r"\s*[A-Za-z][A-Za-z0-9+.-]*://([^/?#]*)", raw)
    if not match:
        return ""
    host = match.group(1).rsplit("@", 1)[-1]
    if host.startswith("["):
        return host.split("]", 1)[0] + "]"
    return host.split(":", 1)[0]


def normalize_host(url: httpx.URL) -> str:
    """ASCII (IDNA) host, lower-case, without a trailing dot or IPv6 brackets."""
    try:
        host = url.raw_host.decode("ascii")
    except UnicodeDecodeError:  # pragma: no cover - httpx always gives ASCII
        return ""
    return host.strip("[]").lower().rstrip(".")


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


def normalize_domain(entry: str) -> str:
    d = entry.strip().lower()
    for prefix in ("*.", "."):
        if d.startswith(prefix):
            d = d[len(prefix) :]
    d = d.strip("[]").rstrip(".")
    if d and not d.isascii():
        try:
            d = normalize_host(httpx.URL(f"http://{d}/"))
        except (httpx.InvalidURL, ValueError):
            return ""
    return d


def host_allowed(host: str, allowed_domains: tuple[str, ...] | list[str]) -> bool:
    """Is ``host`` covered: equal to an entry, or a subdomain of it (``a.example.com``)?

    Label-wise, so ``evilexample.com`` is *not* covered by ``example.com``.  IP
    literals only match the same address.
    """
    host = host.strip("[]").lower().rstrip(".")
    if not host:
        return False
    lit = ip_literal(host)
    for entry in allowed_domains:
        d = normalize_domain(entry)
        if not d:
            continue
        if lit is not None:
            if ip_literal(d) == lit:
                return True
            continue
        if host == d or host.endswith("." + d):
            return True
    return False


def resolve_host(host: str, port: int, timeout: float) -> list[str]:
    """getaddrinfo in a helper thread so a slow resolver cannot outlive the deadline."""
    box: dict[str, Any] = {}

    def work() -> None:
        try:
            box["infos"] = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            box["error"] = exc

    worker = threading.Thread(target=work, name="fetch-url-dns", daemon=True)
    worker.start()
    worker.join(max(timeout, 0.05))
    if worker.is_alive():
        raise ToolError("fetch_timeout", f"Resolving {host!r} timed out.")
    if "error" in box:
        raise ToolError("fetch_failed", f"Could not resolve host {host!r}: {box['error']}.")
    addresses: list[str] = []
    for family, _type, _proto, _canon, sockaddr in box.get("infos", []):
        if family not in (socket.AF_INET, socket.AF_INET6):
            continue
        ip = str(sockaddr[0]).split("%", 1)[0]
        if ip not in addresses:
            addresses.append(ip)
    if not addresses:
        raise ToolError("fetch_failed", f"Host {host!r} has no IP address.")
    return addresses


def _port(url: httpx.URL) -> int:
    return url.port or (443 if url.scheme == "https" else 80)


def _endpoint_allowed(ip: IPAddress, url: httpx.URL, ctx: ToolContext) -> bool:
    """Is this exact address and port one of ctx.allowed_endpoints ("127.0.0.1:8123")?"""
    if not ctx.allowed_endpoints:
        return False
    shown = f"[{ip}]" if isinstance(ip, ipaddress.IPv6Address) else str(ip)
    return f"{shown}:{_port(url)}" in ctx.allowed_endpoints


def check_addresses(url: httpx.URL, ctx: ToolContext, deadline: float | None = None) -> list[str]:
    """Resolve the URL's host and check every address.  Returns the IPs to connect to."""
    host = normalize_host(url)
    lit = ip_literal(host)
    if lit is not None:
        candidates = [str(lit)]
    else:
        remaining = ctx.fetch_timeout if deadline is None else deadline - time.monotonic()
        if remaining <= 0:
            raise ToolError("fetch_timeout", f"Timed out before resolving {host!r}.")
        candidates = resolve_host(host, _port(url), remaining)
    if not ctx.allow_private_network:
        for text in candidates:
            try:
                ip = ipaddress.ip_address(text)
            except ValueError:
                raise ToolError(
                    "url_address_not_allowed", f"{host!r} resolved to an unusable address."
                ) from None
            reason = None if _endpoint_allowed(ip, url, ctx) else address_refusal(ip)
            if reason:
                shown = host if lit is None else f"{host} ({ip})"
                raise ToolError(
                    "url_address_not_allowed",
                    f"Refused: {shown} is a {reason} address ({ip}); only public internet "
                    "addresses can be fetched.",
                )
    return candidates


# --------------------------------------------------------------------------- deadline guard


class _Guard:
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
        self._thread = threading.Thread(target=self._watch, name="fetch-url-guard", daemon=True)
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
            raise ToolError("cancelled", "The task was cancelled while this tool was running.")
        if reason == "timeout":
            raise httpcore.ReadTimeout(f"the overall deadline passed{' for ' + url if url else ''}")

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


class _GuardedStream(httpcore.NetworkStream):
    """A network stream whose every operation is bounded by the guard's deadline and cancel."""

    def __init__(self, stream: httpcore.NetworkStream, guard: _Guard, fd: int) -> None:
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
        return _GuardedStream(inner, self._guard, self._fd)

    def get_extra_info(self, info: str) -> Any:
        return self._stream.get_extra_info(info)


# --------------------------------------------------------------------------- pinned transport


class _PinnedBackend(httpcore.SyncBackend):
    """Connects to the pre-checked IPs for one host name, never resolving it again."""

    def __init__(self, host: str, addresses: list[str], guard: _Guard | None = None) -> None:
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
            return _GuardedStream(stream, self._guard, fd)
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
def _map_httpcore_errors() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        for core_cls, httpx_cls in _EXC_MAP:
            if isinstance(exc, core_cls):
                raise httpx_cls(str(exc) or core_cls.__name__) from exc
        raise


class _PinnedStream(httpx.SyncByteStream):
    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def __iter__(self) -> Iterator[bytes]:
        with _map_httpcore_errors():
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

    def __init__(self, host: str, addresses: list[str], guard: _Guard | None = None) -> None:
        self._pool = httpcore.ConnectionPool(
            ssl_context=_ssl_context(),
            max_connections=1,
            max_keepalive_connections=0,
            http1=True,
            http2=False,
            retries=0,
            network_backend=_PinnedBackend(host, addresses, guard),
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
        with _map_httpcore_errors():
            core_response = self._pool.handle_request(core_request)
        return httpx.Response(
            status_code=core_response.status,
            headers=core_response.headers,
            stream=_PinnedStream(core_response.stream),
            extensions=core_response.extensions,
        )

    def close(self) -> None:
        self._pool.close()


# --------------------------------------------------------------------------- body decoding


class _BoundedDecoder:
    """Content-Encoding decoder that never produces more than the caller allows."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.supported = encoding in ("", "identity", "gzip", "x-gzip", "deflate")
        self._z: Any = None
        if encoding in ("gzip", "x-gzip"):
            self._z = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._z = zlib.decompressobj(zlib.MAX_WBITS)
        self._first = True

    def feed(self, data: bytes, room: int) -> bytes:
        """Decode ``data``; returns at most ``room + 1`` bytes (more means "too large")."""
        if self._z is None:
            return data
        try:
            out = self._z.decompress(data, room + 1)
        except zlib.error:
            if self.encoding == "deflate" and self._first:  # raw deflate without zlib header
                self._z = zlib.decompressobj(-zlib.MAX_WBITS)
                self._first = False
                return self.feed(data, room)
            raise ToolError(
                "fetch_failed", "The response body is not valid compressed data."
            ) from None
        self._first = False
        return out

    def flush(self, room: int) -> bytes:
        if self._z is None:
            return b""
        try:
            return self._z.flush()[: room + 1]
        except zlib.error:  # pragma: no cover
            raise ToolError(
                "fetch_failed", "The response body is not valid compressed data."
            ) from None


def _is_text_mime(mime: str) -> bool:
    return (
        mime.startswith("text/")
        or mime in _TEXT_MIME_EXACT
        or mime.endswith("+json")
        or mime.endswith("+xml")
    )


def _charset(content_type: str) -> str:
    m = re.search(r"charset\s*=\s*\"?([A-Za-z0-9._:-]+)", content_type, re.IGNORECASE)
    if m:
        import codecs

        try:
            return codecs.lookup(m.group(1)).name
        except LookupError:
            pass
    return "utf-8"


# --------------------------------------------------------------------------- the tool


class _Counter:
    def __init__(self) -> None:
        self.made = 0


@register
class FetchUrl(Tool):
    name = "fetch_url"
    description = (
        "Fetch a web page or file with an HTTP GET request (http/https only, public "
        "internet addresses only). Follows up to 5 redirects. Returns the status, final "
        "URL, content type and the body as text (binary bodies are summarised)."
    )
    effect = "Sends an HTTP GET request to {target}"
    recovery_class = RecoveryClass.EXTERNAL
    Args = FetchUrlArgs

    def target(self, args: FetchUrlArgs) -> str:
        """The URL the request really goes to: the host as sent (IDNA/punycode, lower case, no
        trailing dot) and the port spelled out, so a look-alike host cannot pass as another."""
        try:
            return request_target(parse_url(args.url))
        except ToolError:
            return args.url.strip()

    def describe_effect(self, args: FetchUrlArgs) -> str:
        try:
            url = parse_url(args.url)
        except ToolError:
            return f"Sends an HTTP GET request to {args.url.strip()!r} (an invalid URL)"
        host, port = normalize_host(url), url.port or (443 if url.scheme == "https" else 80)
        effect = (
            f"Sends an HTTP GET request to {request_target(url)} (host {host}, port {port}; "
            f"following up to {MAX_REDIRECTS} redirects)"
        )
        typed = urlsplit_host(args.url)
        if typed and not typed.isascii():
            effect += (
                f". The model wrote the host as {typed!r}, which has non-ASCII characters: "
                f"it may imitate another name, and the request goes to {host}"
            )
        return effect

    def preflight(self, args: FetchUrlArgs, ctx: ToolContext) -> None:
        """Shape checks and IP-literal checks, without DNS or network."""
        url = parse_url(args.url)
        lit = ip_literal(normalize_host(url))
        if lit is not None and not ctx.allow_private_network:
            reason = None if _endpoint_allowed(lit, url, ctx) else address_refusal(lit)
            if reason:
                raise ToolError(
                    "url_address_not_allowed",
                    f"Refused: {normalize_host(url)} is a {reason} address ({lit}); only public "
                    "internet addresses can be fetched.",
                )

    def approval_reason(self, args: FetchUrlArgs, ctx: ToolContext) -> str | None:
        try:
            host = normalize_host(httpx.URL(args.url.strip()))
        except Exception:  # noqa: BLE001 - any unparsable URL: a person must look at it
            return "domain_not_allowed"
        if not host_allowed(host, ctx.allowed_domains):
            return "domain_not_allowed"
        return None

    def run(self, args: FetchUrlArgs, ctx: ToolContext) -> ToolResult:
        counter = _Counter()
        try:
            result = self._run(args, ctx, counter)
        except ToolError as exc:
            exc.network_requests = counter.made
            raise
        result.network_requests = counter.made
        return result

    # -- internals ----------------------------------------------------------------

    def _run(self, args: FetchUrlArgs, ctx: ToolContext, counter: _Counter) -> ToolResult:
        self.preflight(args, ctx)
        deadline = time.monotonic() + ctx.fetch_timeout
        cap = min(args.max_bytes or ctx.max_response_bytes, ctx.max_response_bytes)
        url = parse_url(args.url)
        guard = _Guard(deadline, ctx.cancel_event)
        try:
            return self._hops(args, ctx, counter, url, cap, deadline, guard)
        finally:
            guard.stop()

    def _hops(
        self,
        args: FetchUrlArgs,
        ctx: ToolContext,
        counter: _Counter,
        url: httpx.URL,
        cap: int,
        deadline: float,
        guard: _Guard,
    ) -> ToolResult:
        first_host = normalize_host(url)
        hops: list[dict[str, Any]] = []
        for hop in range(MAX_REDIRECTS + 1):
            ctx.check_cancelled()
            if hop:
                host = normalize_host(url)
                if host != first_host and not host_allowed(host, ctx.allowed_domains):
                    raise ToolError(
                        "url_domain_not_allowed",
                        f"Redirected to {str(url)!r}, whose host {host!r} is not an allowed "
                        "domain for this task; the redirect was not followed.",
                        details={"redirects": hops},
                    )
            if counter.made >= ctx.network_requests_remaining:
                raise ToolError(
                    "network_limit",
                    f"The task's network request budget is used up ({counter.made} request(s) "
                    f"made by this call, {ctx.network_requests_remaining} allowed).",
                    details={"redirects": hops},
                )
            addresses = check_addresses(url, ctx, deadline)
            with self._client(url, addresses, deadline, guard) as client:
                counter.made += 1
                response = self._send(client, url, deadline)
                try:
                    location = response.headers.get("location")
                    if response.status_code in REDIRECT_STATUSES and location:
                        hops.append(
                            {"url": str(url), "status": response.status_code, "location": location}
                        )
                        if hop == MAX_REDIRECTS:
                            raise ToolError(
                                "too_many_redirects",
                                f"Stopped after {MAX_REDIRECTS} redirects (last to {location!r}).",
                                details={"redirects": hops},
                            )
                        try:
                            next_url = url.join(location)
                        except (httpx.InvalidURL, ValueError) as exc:
                            raise ToolError(
                                "url_invalid", f"Invalid redirect location {location!r}: {exc}."
                            ) from None
                        url = parse_url(str(next_url))
                        continue
                    return self._read(response, url, args, ctx, cap, deadline, hops)
                finally:
                    response.close()
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _client(
        url: httpx.URL, addresses: list[str], deadline: float, guard: _Guard
    ) -> httpx.Client:
        remaining = max(0.05, deadline - time.monotonic())
        return httpx.Client(
            transport=PinnedTransport(normalize_host(url), addresses, guard),
            follow_redirects=False,
            trust_env=False,
            timeout=httpx.Timeout(remaining),
            headers={
                "User-Agent": USER_AGENT,
                "Accept": "*/*",
                "Accept-Encoding": "identity",
            },
        )

    @staticmethod
    def _send(client: httpx.Client, url: httpx.URL, deadline: float) -> httpx.Response:
        if time.monotonic() >= deadline:
            raise ToolError("fetch_timeout", f"Timed out before requesting {str(url)!r}.")
        try:
            request = client.build_request("GET", url)
            return client.send(request, stream=True)
        except httpx.TimeoutException:
            raise ToolError("fetch_timeout", f"Timed out requesting {str(url)!r}.") from None
        except httpx.HTTPError as exc:
            raise ToolError("fetch_failed", f"Request to {str(url)!r} failed: {exc}.") from None

    def _read(
        self,
        response: httpx.Response,
        url: httpx.URL,
        args: FetchUrlArgs,
        ctx: ToolContext,
        cap: int,
        deadline: float,
        hops: list[dict[str, Any]],
    ) -> ToolResult:
        content_type = response.headers.get("content-type", "")
        encoding = response.headers.get("content-encoding", "").strip().lower()
        declared = response.headers.get("content-length")
        too_large = ToolError(
            "response_too_large",
            f"The response from {str(url)!r} is larger than the {cap}-byte limit; "
            "it was not read further.",
            details={"status": response.status_code, "content_type": content_type, "limit": cap},
        )
        if declared and declared.strip().isdigit() and not encoding and int(declared) > cap:
            too_large.details["content_length"] = int(declared)
            raise too_large
        decoder = _BoundedDecoder(encoding)
        body = bytearray()
        try:
            # iter_raw() without a size yields data as it arrives (a size would re-buffer
            # to that size, delaying the deadline / cancel checks on slow bodies).
            for chunk in response.iter_raw():
                ctx.check_cancelled()
                if time.monotonic() > deadline:
                    raise ToolError(
                        "fetch_timeout",
                        f"Reading the response from {str(url)!r} took longer than "
                        f"{ctx.fetch_timeout:g} s.",
                    )
                if decoder.supported:
                    body += decoder.feed(chunk, cap - len(body))
                else:
                    body += chunk
                if len(body) > cap:
                    raise too_large
            if decoder.supported:
                body += decoder.flush(cap - len(body))
                if len(body) > cap:
                    raise too_large
        except httpx.TimeoutException:
            raise ToolError(
                "fetch_timeout", f"Timed out reading the response from {str(url)!r}."
            ) from None
        except httpx.HTTPError as exc:
            raise ToolError(
                "fetch_failed", f"Reading the response from {str(url)!r} failed: {exc}."
            ) from None
        return self._result(bytes(body), response, url, args, content_type, encoding, hops)

    @staticmethod
    def _result(
        body: bytes,
        response: httpx.Response,
        url: httpx.URL,
        args: FetchUrlArgs,
        content_type: str,
        encoding: str,
        hops: list[dict[str, Any]],
    ) -> ToolResult:
        mime = content_type.split(";", 1)[0].strip().lower()
        digest = hashlib.sha256(body).hexdigest()
        undecoded = encoding not in ("", "identity", "gzip", "x-gzip", "deflate")
        is_text = not undecoded and (
            _is_text_mime(mime) or (not mime and b"\x00" not in body[:8192])
        )
        if is_text and b"\x00" in body[:8192]:
            is_text = False
        text_body = ""
        if is_text:
            charset = _charset(content_type)
            try:
                text_body = body.decode(charset, "replace")
            except (LookupError, UnicodeError, ValueError, TypeError):
                # base64, hex, rot13, zlib, idna…: codecs Python knows, but not text encodings.
                raise ToolError(
                    "response_charset_invalid",
                    f"The response from {str(url)!r} declares charset {charset!r} "
                    f"(Content-Type: {content_type}), which is not a text encoding; its "
                    f"{len(body)} bytes (sha256 {digest}) were not decoded.",
                    details={"status": response.status_code, "content_type": content_type},
                ) from None
            if mime == "" and text_body.count("\ufffd") > max(16, len(text_body) // 100):
                is_text = False
                text_body = ""
        reason = response.reason_phrase or ""
        lines = [f"HTTP {response.status_code} {reason}".rstrip(), f"URL: {url}"]
        if hops:
            lines.append(
                "Redirects: "
                + " -> ".join(f"{h['url']} ({h['status']})" for h in hops)
                + f" -> {url}"
            )
        lines.append(f"Content-Type: {content_type or '(none)'}")
        lines.append(f"Length: {len(body)} bytes")
        if is_text:
            lines.append("")
            lines.append(text_body)
        else:
            why = f"content encoding {encoding!r} not decoded" if undecoded else "binary content"
            head = body[:BINARY_PREVIEW_BYTES].hex(" ")
            lines.append(
                f"[{why}: {len(body)} bytes, sha256 {digest}; not shown as text. "
                f"First bytes: {head or '(empty)'}]"
            )
        return ToolResult(
            text="\n".join(lines),
            data={
                "url": args.url,
                "final_url": str(url),
                "status": response.status_code,
                "content_type": content_type,
                "bytes": len(body),
                "sha256": digest,
                "is_text": is_text,
                "redirects": hops,
            },
        )
