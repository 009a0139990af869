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
import time
import unicodedata
import zlib
from typing import Any

import httpx
from pydantic import Field

from core import egress
from core.egress import (
    Guard,
    IPAddress,
    PinnedTransport,
    ResolveError,
    address_refusal,
    ip_literal,
)
from core.egress import PinnedBackend as _PinnedBackend  # noqa: F401 - tests pin with it

from .base import Tool, ToolArgs, ToolContext, ToolError, ToolResult
from .recovery_class import RecoveryClass
from .registry import register

MAX_URL_CHARS = 2000
MAX_REDIRECTS = 5
USER_AGENT = "Acthelm-agent/1.0 (+fetch_url)"
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
BINARY_PREVIEW_BYTES = 32

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
    """The shared resolver (core.egress), its errors in the tool's codes."""
    try:
        return egress.resolve_host(host, port, timeout)
    except ResolveError as exc:
        code = "fetch_timeout" if exc.code == "timeout" else "fetch_failed"
        raise ToolError(code, exc.message) from None


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


class _Guard(Guard):
    """The shared guard (core.egress); a cancel is the tool's `cancelled`."""

    def cancelled(self) -> Exception:
        return ToolError("cancelled", "The task was cancelled while this tool was running.")


# --------------------------------------------------------------------------- body decoding


class _BoundedDecoder:
    """Content-Encoding decoder that never produces more than the caller allows."""

    def __init__(self, encoding: str) -> None:
        self.encoding = encoding
        self.supported = encoding in ("", "identity", "gzip", "x-gzip", "deflate")
        self._z: zlib._Decompress | None = None  # typeshed's name for decompressobj()'s type
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
class FetchUrl(Tool[FetchUrlArgs]):
    name = "fetch_url"
    waits_on_network = True
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
