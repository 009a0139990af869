"""fetch_url: SSRF refusals without any connection, pinning, redirects, budgets, caps.

Only the loopback test server is ever contacted; tests that prove a refusal also make
every socket connect raise, so a bug cannot send traffic to another address.
"""

import ipaddress
import os
import socket
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from urllib.parse import quote

import httpcore
import pytest

from agents.catalogue.tools import ToolContext, ToolError, get_tool, host_allowed
from agents.catalogue.tools import fetch as fetch_mod
from tests.fakes.http_target import HttpTarget

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def server():
    with HttpTarget() as srv:
        yield srv


@pytest.fixture
def no_connect(monkeypatch):
    """Any outgoing connection attempt fails the test (and is recorded)."""
    attempts: list = []

    def refuse(*args, **kwargs):
        attempts.append(args)
        raise AssertionError(f"unexpected connection attempt: {args!r}")

    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def make_ctx(tmp_path, **kw) -> ToolContext:
    kw.setdefault("allowed_domains", ("127.0.0.1",))
    kw.setdefault("fetch_timeout", 10.0)
    return ToolContext(workspace=tmp_path, artifacts_dir=tmp_path / "artifacts", **kw)


def fetch(ctx, url, **extra):
    tool = get_tool("fetch_url")
    return tool.run(tool.parse({"url": url, **extra}), ctx)


def refused(ctx, url, **extra) -> ToolError:
    with pytest.raises(ToolError) as info:
        fetch(ctx, url, **extra)
    return info.value


# --------------------------------------------------------------------------- happy paths


def test_fetch_text(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True)
    r = fetch(ctx, server.url + "/text")
    assert r.network_requests == 1
    assert r.data["status"] == 200 and r.data["is_text"] is True
    assert r.data["final_url"] == server.url + "/text"
    assert r.data["content_type"] == "text/plain; charset=utf-8"
    assert r.text.startswith("HTTP 200 OK\nURL: " + server.url + "/text")
    assert r.text.endswith("\n\nhello from http_target")
    assert server.counts["/text"] == 1
    assert get_tool("fetch_url").recovery_class == "external"


def test_original_host_header_is_sent(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True, allowed_domains=("localhost",))
    r = fetch(ctx, server.url_for("/echo", host="localhost"))
    assert r.data["status"] == 200
    seen = server.requests[-1]
    assert seen.headers["host"] == f"localhost:{server.port}"
    assert seen.headers["accept-encoding"] == "identity"


def test_connection_is_pinned_to_the_checked_address(server, tmp_path, monkeypatch):
    """The name is resolved once, checked, and the socket goes to that address; the
    connection never asks DNS again (a rebinding answer could not take effect)."""
    lookups = []

    def fake_resolve(host, port, timeout):
        lookups.append(host)
        return ["127.0.0.1"]

    real_getaddrinfo = socket.getaddrinfo

    def no_dns(host, *args, **kwargs):
        try:  # connecting to a literal IP goes through getaddrinfo without DNS
            ipaddress.ip_address(host)
        except ValueError:
            raise AssertionError(f"a second DNS lookup happened for {host!r}") from None
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(fetch_mod, "resolve_host", fake_resolve)
    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    ctx = make_ctx(tmp_path, allow_private_network=True, allowed_domains=("pinned.test",))
    r = fetch(ctx, f"http://pinned.test:{server.port}/echo")
    assert r.data["status"] == 200
    assert lookups == ["pinned.test"]
    assert server.requests[-1].headers["host"] == f"pinned.test:{server.port}"


def test_pinned_backend_refuses_other_hosts():
    backend = fetch_mod._PinnedBackend("pinned.test", ["127.0.0.1"])
    with pytest.raises(httpcore.ConnectError):
        backend.connect_tcp("evil.test", 80)
    with pytest.raises(httpcore.ConnectError):
        backend.connect_unix_socket("/var/run/docker.sock")


def test_redirects_are_followed_and_reported(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True)
    r = fetch(ctx, server.url + "/redirect/3")
    assert r.network_requests == 4
    assert r.data["final_url"] == server.url + "/redirect/0"
    assert [h["status"] for h in r.data["redirects"]] == [302, 302, 302]
    assert "redirects done" in r.text and "Redirects: " in r.text


def test_error_statuses_are_results_not_errors(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True)
    r = fetch(ctx, server.url + "/status/404")
    assert r.data["status"] == 404 and "status 404" in r.text


def test_binary_body_is_summarised(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True)
    r = fetch(ctx, server.url + "/binary")
    assert r.data["is_text"] is False and r.data["bytes"] == 1024
    assert "binary content: 1024 bytes" in r.text
    assert "\x00" not in r.text


def test_declared_charset_is_used(server, tmp_path):
    server.route(
        "/latin", body="café".encode("latin-1"), content_type="text/plain; charset=latin-1"
    )
    ctx = make_ctx(tmp_path, allow_private_network=True)
    assert fetch(ctx, server.url + "/latin").text.endswith("café")


def test_connection_refused_is_fetch_failed(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = make_ctx(tmp_path, allow_private_network=True)
    err = refused(ctx, f"http://127.0.0.1:{port}/")
    assert err.code == "fetch_failed" and err.network_requests == 1


# --------------------------------------------------------------------------- URL refusals


@pytest.mark.parametrize(
    "url",
    [
        "file:///etc/passwd",
        "FILE:///etc/passwd",
        "ftp://example.com/x",
        "gopher://example.com:70/_x",
        "data:text/plain,hello",
        "javascript:alert(1)",
        "dict://127.0.0.1:11211/stat",
        "example.com/no-scheme",
        "//example.com/x",
    ],
)
def test_non_http_schemes_are_refused(tmp_path, no_connect, url):
    err = refused(make_ctx(tmp_path), url)
    assert err.code == "url_scheme_not_allowed"
    assert err.network_requests == 0 and no_connect == []


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("http://user:pass@example.com/", "url_credentials_not_allowed"),
        ("http://user@example.com/", "url_credentials_not_allowed"),
        ("http://exa mple.com/", "url_invalid"),
        ("http://%31%32%37.0.0.1/", "url_invalid"),
        ("http:///path-only", "url_invalid"),
        ("http://[::1/", "url_invalid"),
        ("http://a\nb.com/", "url_invalid"),
    ],
)
def test_malformed_urls_are_refused(tmp_path, no_connect, url, code):
    assert refused(make_ctx(tmp_path), url).code == code
    assert no_connect == []


def test_overlong_url_is_invalid_arguments():
    with pytest.raises(ToolError) as info:
        get_tool("fetch_url").parse({"url": "http://example.com/" + "a" * 2000})
    assert info.value.code == "invalid_arguments"


BLOCKED = [
    "http://127.0.0.1:{port}/text",
    "http://127.0.0.2:{port}/text",
    "http://localhost:{port}/text",
    "http://LOCALHOST.:{port}/text",
    "http://127.1:{port}/text",
    "http://0x7f.1:{port}/text",
    "http://0x7f000001:{port}/text",
    "http://2130706433:{port}/text",
    "http://017700000001:{port}/text",
    "http://0.0.0.0:{port}/text",
    "http://0:{port}/text",
    "http://[::1]:{port}/text",
    "http://[::]:{port}/text",
    "http://[::ffff:127.0.0.1]:{port}/text",
    "http://[::ffff:7f00:1]:{port}/text",
    "http://[64:ff9b::7f00:1]/",
    "http://[64:ff9b::a9fe:a9fe]/",
    "http://[2002:7f00:1::]/",
    "http://10.0.0.1/",
    "http://10.255.255.255/",
    "http://172.16.0.1/",
    "http://172.31.255.1/",
    "http://192.168.1.1/",
    "http://169.254.169.254/latest/meta-data/",
    "http://[fe80::1]/",
    "http://[fc00::1]/",
    "http://[fd12:3456::1]/",
    "http://100.64.0.1/",
    "http://224.0.0.1/",
    "http://[ff02::1]/",
    "http://240.0.0.1/",
    "http://255.255.255.255/",
    "https://127.0.0.1:{port}/",
]


@pytest.mark.parametrize("template", BLOCKED)
def test_private_addresses_are_refused_without_any_connection(
    server, tmp_path, no_connect, template
):
    url = template.format(port=server.port)
    ctx = make_ctx(tmp_path, allowed_domains=("127.0.0.1", "localhost"))
    err = refused(ctx, url)
    assert err.code == "url_address_not_allowed", err
    assert err.network_requests == 0
    assert no_connect == []
    assert server.total == 0


@pytest.mark.parametrize("template", [t for t in BLOCKED if "localhost" not in t.lower()])
def test_preflight_refuses_ip_literals_without_dns(tmp_path, monkeypatch, template):
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: pytest.fail("DNS used"))
    tool = get_tool("fetch_url")
    with pytest.raises(ToolError) as info:
        tool.preflight(tool.parse({"url": template.format(port=8080)}), make_ctx(tmp_path))
    assert info.value.code == "url_address_not_allowed"


@pytest.mark.parametrize(
    "addresses",
    [
        ["10.1.2.3"],
        ["93.184.216.34", "127.0.0.1"],  # ANY bad address refuses the host
        ["2606:4700:4700::1111", "fd00::1"],
        ["169.254.169.254"],
        ["::ffff:192.168.0.1"],
    ],
)
def test_names_resolving_to_private_addresses_are_refused(
    tmp_path, no_connect, monkeypatch, addresses
):
    monkeypatch.setattr(fetch_mod, "resolve_host", lambda host, port, timeout: addresses)
    ctx = make_ctx(tmp_path, allowed_domains=("intranet.test",))
    err = refused(ctx, "http://www.intranet.test/")
    assert err.code == "url_address_not_allowed"
    assert no_connect == []


@pytest.mark.parametrize(
    ("ip", "reason"),
    [
        ("93.184.216.34", None),
        ("8.8.8.8", None),
        ("2606:4700:4700::1111", None),
        ("127.0.0.1", "loopback"),
        ("169.254.169.254", "link-local"),
        ("10.0.0.1", "private"),
        ("100.64.0.1", "non-public"),
        ("0.0.0.0", "unspecified"),
        ("::ffff:10.0.0.1", "private (embedded in IPv6)"),
        ("64:ff9b::808:808", "reserved"),  # NAT64 is refused outright
        ("64:ff9b::a00:1", "private (embedded in IPv6)"),
    ],
)
def test_address_classification(ip, reason):
    assert fetch_mod.address_refusal(ipaddress.ip_address(ip)) == reason


# --------------------------------------------------------------------------- redirects


def test_redirect_from_allowed_to_unallowed_domain_is_refused(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True, allowed_domains=("127.0.0.1",))
    target = server.url_for("/text", host="localhost")
    err = refused(ctx, server.url + "/redirect-to?url=" + quote(target, safe=""))
    assert err.code == "url_domain_not_allowed"
    assert "localhost" in err.message
    assert err.network_requests == 1
    assert server.counts["/text"] == 0 and server.total == 1


def test_redirect_with_no_allow_list_stays_on_the_first_host(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True, allowed_domains=())
    target = server.url_for("/text", host="localhost")
    err = refused(ctx, server.url + "/redirect-to?url=" + quote(target, safe=""))
    assert err.code == "url_domain_not_allowed"
    assert server.counts["/text"] == 0
    ok = fetch(ctx, server.url + "/redirect/2")  # same host: followed
    assert ok.data["status"] == 200 and ok.network_requests == 3


def test_redirect_to_another_allowed_domain_is_followed(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True, allowed_domains=("127.0.0.1", "localhost"))
    target = server.url_for("/text", host="localhost")
    r = fetch(ctx, server.url + "/redirect-to?url=" + quote(target, safe="") + "&status=307")
    assert r.data["final_url"] == target and r.network_requests == 2
    assert r.data["redirects"][0]["status"] == 307


_REAL_CREATE_CONNECTION = socket.create_connection


@pytest.mark.parametrize(
    "location",
    ["http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/", "http://[::1]:1/"],
)
def test_each_redirect_hop_is_address_checked(server, tmp_path, monkeypatch, location):
    """The first hop is treated as public (the loopback server stands in for the
    internet); a redirect to an internal address is refused before connecting."""
    real_refusal = fetch_mod.address_refusal
    monkeypatch.setattr(
        fetch_mod,
        "address_refusal",
        lambda ip: None if str(ip) == "127.0.0.1" else real_refusal(ip),
    )
    attempts = []

    def loopback_only(address, *args, **kwargs):
        attempts.append(address)
        if address[0] != "127.0.0.1":
            raise AssertionError(f"unexpected connection to {address!r}")
        return _REAL_CREATE_CONNECTION(address, *args, **kwargs)

    monkeypatch.setattr(socket, "create_connection", loopback_only)
    ctx = make_ctx(tmp_path, allowed_domains=("127.0.0.1", "169.254.169.254", "10.0.0.1", "::1"))
    err = refused(ctx, server.url + "/redirect-to?url=" + quote(location, safe=""))
    assert err.code == "url_address_not_allowed"
    assert err.network_requests == 1 and server.total == 1
    assert attempts == [("127.0.0.1", server.port)]


def test_redirect_to_another_scheme_is_refused(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True)
    err = refused(ctx, server.url + "/redirect-to?url=" + quote("file:///etc/passwd", safe=""))
    assert err.code == "url_scheme_not_allowed" and err.network_requests == 1


def test_redirect_limit(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True, network_requests_remaining=20)
    ok = fetch(ctx, server.url + "/redirect/5")
    assert ok.network_requests == 6 and ok.data["status"] == 200
    server.reset()
    err = refused(ctx, server.url + "/redirect/6")
    assert err.code == "too_many_redirects"
    assert err.network_requests == 6 and server.total == 6
    assert server.counts["/redirect/0"] == 0


def test_network_budget_counts_every_hop(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True, network_requests_remaining=3)
    err = refused(ctx, server.url + "/redirect/5")
    assert err.code == "network_limit"
    assert err.network_requests == 3 and server.total == 3
    server.reset()
    none_left = make_ctx(tmp_path, allow_private_network=True, network_requests_remaining=0)
    err = refused(none_left, server.url + "/text")
    assert err.code == "network_limit" and err.network_requests == 0
    assert server.total == 0
    exact = make_ctx(tmp_path, allow_private_network=True, network_requests_remaining=3)
    assert fetch(exact, server.url + "/redirect/2").network_requests == 3


# --------------------------------------------------------------------------- size and time


def _bounded(fn):
    tracemalloc.start()
    try:
        start = time.monotonic()
        with pytest.raises(ToolError) as info:
            fn()
        elapsed = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return info.value, peak, elapsed


FIFTY_MB = 50 * 1024 * 1024


@pytest.mark.parametrize("query", ["", "?chunked=1", "?gzip=1"])
def test_50mb_response_is_capped_quickly_in_bounded_memory(server, tmp_path, query):
    ctx = make_ctx(tmp_path, allow_private_network=True)
    err, peak, elapsed = _bounded(lambda: fetch(ctx, f"{server.url}/big/{FIFTY_MB}{query}"))
    assert err.code == "response_too_large"
    assert err.network_requests == 1
    assert err.details["limit"] == 2_000_000
    assert peak < 12 * 1024 * 1024, f"peak {peak}"
    assert elapsed < 5


def test_max_bytes_argument_lowers_the_cap(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True)
    assert refused(ctx, server.url + "/big/5000", max_bytes=4000).code == "response_too_large"
    assert fetch(ctx, server.url + "/big/5000", max_bytes=5000).data["bytes"] == 5000
    small_ctx = make_ctx(tmp_path, allow_private_network=True, max_response_bytes=1000)
    err = refused(small_ctx, server.url + "/big/5000?chunked=1", max_bytes=100_000)
    assert err.code == "response_too_large"


def test_slow_body_hits_the_overall_timeout(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True, fetch_timeout=1.0)
    start = time.monotonic()
    err = refused(ctx, server.url + "/slow?chunks=100&delay=0.1")
    assert err.code == "fetch_timeout" and err.network_requests == 1
    assert time.monotonic() - start < 3


def test_stalled_body_times_out(server, tmp_path):
    ctx = make_ctx(tmp_path, allow_private_network=True, fetch_timeout=0.5)
    start = time.monotonic()
    assert refused(ctx, server.url + "/stall?seconds=5").code == "fetch_timeout"
    assert time.monotonic() - start < 3


def test_cancel_event_stops_the_download(server, tmp_path):
    cancel = threading.Event()
    ctx = make_ctx(tmp_path, allow_private_network=True, cancel_event=cancel)
    timer = threading.Timer(0.3, cancel.set)
    timer.start()
    try:
        start = time.monotonic()
        err = refused(ctx, server.url + "/slow?chunks=100&delay=0.05")
    finally:
        timer.cancel()
    assert err.code == "cancelled" and err.network_requests == 1
    assert time.monotonic() - start < 2
    server.reset()
    assert refused(ctx, server.url + "/text").code == "cancelled"
    assert server.total == 0


# --------------------------------------------------------------------------- approval


@pytest.mark.parametrize(
    ("url", "allowed", "reason"),
    [
        ("https://example.com/", ("example.com",), None),
        ("https://EXAMPLE.com./a", ("example.com",), None),
        ("https://api.example.com/v1", ("example.com",), None),
        ("https://a.b.example.com/", ("Example.COM",), None),
        ("https://example.com:8443/", ("example.com",), None),
        ("https://evilexample.com/", ("example.com",), "domain_not_allowed"),
        ("https://example.com.evil.net/", ("example.com",), "domain_not_allowed"),
        ("https://example.co/", ("example.com",), "domain_not_allowed"),
        ("https://com/", ("example.com",), "domain_not_allowed"),
        ("https://example.com/", (), "domain_not_allowed"),
        ("https://api.example.com/", ("api.example.com", "other.org"), None),
        ("https://example.com/", ("api.example.com",), "domain_not_allowed"),
        ("http://127.0.0.1/", ("127.0.0.1",), None),
        ("http://127.1/", ("0.1",), "domain_not_allowed"),
        ("http://10.0.0.1/", ("0.0.1",), "domain_not_allowed"),
        ("https://bücher.de/", ("xn--bcher-kva.de",), None),
        ("https://shop.bücher.de/", ("bücher.de",), None),
        ("not a url at all", ("example.com",), "domain_not_allowed"),
    ],
)
def test_approval_reason(tmp_path, url, allowed, reason):
    tool = get_tool("fetch_url")
    ctx = make_ctx(tmp_path, allowed_domains=allowed)
    assert tool.approval_reason(tool.parse({"url": url}), ctx) == reason


def test_host_allowed_helper():
    assert host_allowed("a.example.com", ["example.com"])
    assert not host_allowed("aexample.com", ["example.com"])
    assert host_allowed("example.com", ["*.example.com"])
    assert not host_allowed("", ["example.com"])
    assert host_allowed("::1", ["[::1]"])


# --------------------------------------------------------------------------- standalone server


@pytest.mark.timeout(20)
def test_http_target_runs_standalone_and_counts_to_a_file(tmp_path):
    ready = tmp_path / "ready.txt"
    counts = tmp_path / "counts.txt"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fakes.http_target",
            "--port",
            "0",
            "--ready-file",
            str(ready),
            "--count-file",
            str(counts),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 10
        while not ready.exists():
            assert proc.poll() is None, "http_target exited early"
            assert time.monotonic() < deadline, "http_target did not get ready"
            time.sleep(0.05)
        base = ready.read_text().strip()
        assert base.startswith("http://127.0.0.1:")
        ctx = make_ctx(tmp_path, allow_private_network=True)
        assert fetch(ctx, base + "/text").data["status"] == 200
        assert fetch(ctx, base + "/redirect/1").network_requests == 2
        assert counts.read_text().splitlines() == [
            "GET /text",
            "GET /redirect/1",
            "GET /redirect/0",
        ]
    finally:
        proc.terminate()
        proc.wait(10)
    assert proc.returncode == 0


# --------------------------------------------------------------------------- allowed endpoints


def test_an_allowed_endpoint_is_reached_and_nothing_else_that_is_private(server, tmp_path):
    """ACTHELM_FETCH_ALLOW_ENDPOINTS (acthelm_eval's page server): that address and port only."""
    ctx = make_ctx(tmp_path, allowed_endpoints=(f"127.0.0.1:{server.port}",))
    assert fetch(ctx, server.url + "/text").data["status"] == 200
    other_port = make_ctx(tmp_path, allowed_endpoints=(f"127.0.0.1:{server.port + 1}",))
    assert refused(other_port, server.url + "/text").code == "url_address_not_allowed"
    localhost = make_ctx(
        tmp_path, allowed_domains=("localhost",), allowed_endpoints=(f"127.0.0.2:{server.port}",)
    )
    assert (
        refused(localhost, f"http://localhost:{server.port}/text").code == "url_address_not_allowed"
    )
    assert server.counts["/text"] == 1
