"""The providers' HTTP exchange on the wire: keep-alive and what a server may do to a kept-alive
connection, chunked and compressed bodies, TLS, an environment proxy, a cancel that calls back.
The servers are real sockets on loopback, answering with bytes written here."""

from __future__ import annotations

import asyncio
import datetime
import gzip
import ipaddress
import json
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable

import pytest

from agents.catalogue.providers import Message, ProviderError, _wire, build_provider
from agents.catalogue.providers import _http as provider_http
from agents.catalogue.providers.base import (
    PROVIDER_BAD_RESPONSE,
    PROVIDER_CANCELLED,
    PROVIDER_UNREACHABLE,
    CancelEvent,
)

pytestmark = pytest.mark.timeout(20)


def answer(text: str) -> bytes:
    return json.dumps(
        {
            "id": "x",
            "object": "chat.completion",
            "model": "m",
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        }
    ).encode()


def response(body: bytes, *headers: str) -> bytes:
    head = ["HTTP/1.1 200 OK", "Content-Type: application/json", *headers]
    if not any(h.lower().startswith("transfer-encoding") for h in headers):
        head.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


# What a connection does with each request: (connection number, request number on it,
# request head) -> (bytes to send, close the connection afterwards).
type Script = Callable[[int, int, bytes], tuple[bytes, bool]]


class RawServer:
    """HTTP/1.1 on loopback, one thread per connection, answering as `script` says; counts
    connections and records request heads."""

    def __init__(self, script: Script, tls: ssl.SSLContext | None = None) -> None:
        self.script = script
        self.tls = tls
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.connections = 0
        self.heads: list[bytes] = []
        self.closed_by_client = threading.Event()
        self.closed_by_server = threading.Semaphore(0)  # released as each connection is closed
        self.lock = threading.Lock()
        threading.Thread(target=self.accept, daemon=True).start()

    @property
    def port(self) -> int:
        return self.sock.getsockname()[1]

    def url(self, scheme: str = "http") -> str:
        return f"{scheme}://127.0.0.1:{self.port}/v1"

    def accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.connections += 1
                number = self.connections
            threading.Thread(target=self.serve, args=(conn, number), daemon=True).start()

    def serve(self, conn: socket.socket, number: int) -> None:
        if self.tls is not None:
            try:
                conn = self.tls.wrap_socket(conn, server_side=True)
            except (ssl.SSLError, OSError):
                conn.close()
                return
        buf, count = b"", 0
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        self.closed_by_client.set()
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    key, _, value = line.partition(b":")
                    if key.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    buf += conn.recv(65536)
                buf = buf[length:]
                with self.lock:
                    self.heads.append(head)
                count += 1
                data, close = self.script(number, count, head)
                if data:
                    conn.sendall(data)
                if close:
                    conn.close()
                    self.closed_by_server.release()
                    return

    def close(self) -> None:
        self.sock.close()


def ask(url: str, cancel_event=None, **kwargs) -> str:
    provider = build_provider("openai_compatible", base_url=url, timeout=5, **kwargs)
    completion = provider.complete(
        model="m",
        messages=[Message(role="user", content="hi")],
        tools=[],
        max_tokens=5,
        cancel_event=cancel_event,
    )
    return completion.text


def in_thread[T](fn: Callable[[], T]) -> T:
    """Run `fn` in a thread of its own (its own loop and connections), as a worker runs a task."""
    out: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as exc:  # noqa: BLE001 - raised again in the test's thread
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]
    return out[0]


def test_a_kept_alive_connection_the_server_closed_is_replaced_by_a_fresh_one():
    # Every connection answers one request, keeps the connection as if alive, then closes it.
    server = RawServer(lambda n, i, head: (response(answer(f"conn {n}")), True))
    try:

        def turns() -> list[str]:
            texts = []
            for _ in range(3):
                texts.append(ask(server.url()))
                # The server closed it (its FIN is on loopback before the next request looks at
                # the kept connection: what a slow server thread on a loaded machine raced).
                assert server.closed_by_server.acquire(timeout=5)
            return texts

        assert in_thread(turns) == ["conn 1", "conn 2", "conn 3"]
    finally:
        server.close()


def test_turns_share_one_connection_while_the_server_keeps_it():
    server = RawServer(lambda n, i, head: (response(answer(f"conn {n} request {i}")), False))
    try:
        texts = in_thread(lambda: [ask(server.url()) for _ in range(3)])
        assert texts == ["conn 1 request 1", "conn 1 request 2", "conn 1 request 3"]
        head = server.heads[0].decode().lower()
        assert head.startswith("post /v1/chat/completions http/1.1")
        for line in (
            f"host: 127.0.0.1:{server.port}",
            "content-type: application/json",
            "accept-encoding: gzip",
            "connection: keep-alive",
        ):
            assert line in head
    finally:
        server.close()


def test_a_new_connection_goes_to_the_address_the_last_one_reached():
    server = RawServer(
        lambda n, i, head: (response(answer(f"conn {n}"), "Connection: close"), True)
    )
    _wire._reached.pop(("localhost", server.port), None)
    try:
        url = f"http://localhost:{server.port}/v1"  # ::1 (nobody there) and 127.0.0.1 maybe
        assert in_thread(lambda: [ask(url) for _ in range(3)]) == ["conn 1", "conn 2", "conn 3"]
        _, family, address = _wire._reached[("localhost", server.port)]
        assert (family, address[:2]) == (socket.AF_INET, ("127.0.0.1", server.port))
    finally:
        server.close()


def test_a_remembered_address_that_refuses_is_forgotten_and_the_host_resolved_again():
    server = RawServer(lambda n, i, head: (response(answer("here"), "Connection: close"), True))
    gone = socket.socket()
    gone.bind(("127.0.0.1", 0))
    dead_port = gone.getsockname()[1]
    gone.close()  # nobody listens there: a connect is refused
    key = ("127.0.0.1", server.port)
    _wire._reached[key] = (time.monotonic() + 30, socket.AF_INET, ("127.0.0.1", dead_port))
    try:
        assert in_thread(lambda: ask(server.url())) == "here"
        assert _wire._reached[key][2][:2] == ("127.0.0.1", server.port)
        assert server.connections == 1
    finally:
        server.close()


def test_a_request_made_where_a_loop_runs_never_reuses_a_connection_of_a_gone_loop():
    """From a thread where an event loop runs (Playwright's sync API, async code calling a sync
    API), a request runs on a private loop that is gone once it is answered: its kept-alive
    connection is not reused by the next request, which would wait on it for ever."""
    server = RawServer(lambda n, i, head: (response(answer(f"conn {n} request {i}")), False))

    async def twice_from_a_running_loop() -> list[str]:
        return [ask(server.url()) for _ in range(2)]

    try:
        texts = in_thread(lambda: asyncio.run(twice_from_a_running_loop()))
        assert texts == ["conn 1 request 1", "conn 2 request 1"]
        # and the process's own loop still keeps its connections
        assert in_thread(lambda: [ask(server.url()) for _ in range(2)]) == [
            "conn 3 request 1",
            "conn 3 request 2",
        ]
    finally:
        server.close()


def test_a_chunked_body_is_read_whole():
    body = answer("chunked " * 2000)
    chunks = b"".join(
        f"{len(part):x}\r\n".encode() + part + b"\r\n"
        for part in (body[i : i + 1000] for i in range(0, len(body), 1000))
    )
    reply = response(chunks + b"0\r\n\r\n", "Transfer-Encoding: chunked")
    server = RawServer(lambda n, i, head: (reply, False))
    try:
        texts = in_thread(lambda: [ask(server.url()), ask(server.url())])
        assert texts == ["chunked " * 2000] * 2
        assert server.connections == 1
    finally:
        server.close()


def test_a_gzip_body_is_decoded_and_the_cap_counts_decoded_bytes():
    packed = gzip.compress(answer("small"))
    server = RawServer(lambda n, i, head: (response(packed, "Content-Encoding: gzip"), False))
    bomb = gzip.compress(b" " * 5_000_000)  # ~5 KB on the wire
    bomber = RawServer(lambda n, i, head: (response(bomb, "Content-Encoding: gzip"), False))
    try:
        assert in_thread(lambda: ask(server.url())) == "small"
        with pytest.raises(ProviderError) as info:
            in_thread(lambda: ask(bomber.url(), max_response_bytes=1_000_000))
        assert info.value.code == PROVIDER_BAD_RESPONSE
        assert "exceeds the limit" in info.value.message
    finally:
        server.close()
        bomber.close()


def test_a_cancel_event_aborts_the_request_and_the_next_request_gets_a_new_connection():
    held = threading.Event()

    def script(n: int, i: int, head: bytes) -> tuple[bytes, bool]:
        if n == 1:
            held.set()
            return b"", False  # never answers; waits for the client to go away
        return response(answer("after")), False

    server = RawServer(script)
    cancel = CancelEvent()
    try:

        def turns() -> tuple[str, float, str]:
            threading.Timer(0.3, cancel.set).start()
            started = time.monotonic()
            with pytest.raises(ProviderError) as info:
                ask(server.url(), cancel_event=cancel)
            return info.value.code, time.monotonic() - started, ask(server.url())

        code, elapsed, after = in_thread(turns)
        assert code == PROVIDER_CANCELLED
        assert elapsed < 1.0  # called back, not the deadline
        assert server.closed_by_client.wait(2), "the cancelled request's connection is closed"
        assert after == "after" and server.connections == 2
        assert held.is_set()
    finally:
        server.close()


def test_a_cancel_after_the_answer_changes_nothing():
    server = RawServer(lambda n, i, head: (response(answer("ok")), False))
    cancel = CancelEvent()
    try:

        def turns() -> list[str]:
            texts = [ask(server.url(), cancel_event=cancel)]
            cancel.set()  # the run ends after its last answer: the callback was removed
            texts.append(ask(server.url()))
            return texts

        assert in_thread(turns) == ["ok", "ok"]
        assert server.connections == 1
    finally:
        server.close()


def _certificate() -> tuple[bytes, bytes]:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@pytest.fixture
def tls_server(tmp_path):
    cert_pem, key_pem = _certificate()
    (tmp_path / "cert.pem").write_bytes(cert_pem)
    (tmp_path / "key.pem").write_bytes(key_pem)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server = RawServer(lambda n, i, head: (response(answer(f"tls {n}.{i}")), False), tls=context)
    yield server, cert_pem.decode()
    server.close()


def test_tls_with_a_trusted_certificate_keeps_its_connection(tls_server, monkeypatch):
    server, cert_pem = tls_server
    trusting = ssl.create_default_context(cadata=cert_pem)
    monkeypatch.setattr(provider_http, "_ssl_context", lambda: trusting)
    texts = in_thread(lambda: [ask(server.url("https")) for _ in range(2)])
    assert texts == ["tls 1.1", "tls 1.2"]


def test_tls_with_an_unknown_certificate_is_unreachable(tls_server):
    server, _ = tls_server
    with pytest.raises(ProviderError) as info:
        in_thread(lambda: ask(server.url("https")))
    assert info.value.code == PROVIDER_UNREACHABLE
    assert "certificate" in info.value.message.lower()


@pytest.fixture
def environment_proxy(monkeypatch):
    """HTTP_PROXY names a proxy (a server that answers in the target's place)."""
    proxy = RawServer(lambda n, i, head: (response(answer("via the proxy")), False))
    for name in ("NO_PROXY", "no_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
    provider_http.reset_clients()
    yield proxy
    provider_http.reset_clients()
    proxy.close()


def test_an_environment_proxy_is_used(environment_proxy):
    with socket.socket() as sock:  # a target nobody listens on: only the proxy can answer
        sock.bind(("127.0.0.1", 0))
        target = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
    assert in_thread(lambda: ask(target)) == "via the proxy"
    assert environment_proxy.heads[0].startswith(f"POST {target}/chat/completions ".encode())


def test_cancel_events_share_one_lock_but_never_each_others_callbacks():
    """Every CancelEvent guards its callbacks with one lock of the process (a run holds its
    event for its whole life): setting one calls its own callbacks, once, and no other's."""
    calls: list[str] = []
    first, second = CancelEvent(), CancelEvent()
    first.add_callback(lambda: calls.append("first"))
    second.add_callback(lambda: calls.append("second"))
    removed = lambda: calls.append("removed")  # noqa: E731
    first.add_callback(removed)
    first.remove_callback(removed)
    first.set()
    assert calls == ["first"] and not second.is_set()
    first.set()  # again: nothing more
    assert calls == ["first"]
    first.add_callback(lambda: calls.append("late"))  # already set: called at once
    assert calls == ["first", "late"]
    setter = threading.Thread(target=second.set)  # set in another thread: called back there
    setter.start()
    setter.join(5)
    assert calls == ["first", "late", "second"]


def test_a_request_in_flight_keeps_nothing_of_the_bytes_it_sent():
    """A model request's body is the whole conversation: once written, neither the caller's
    frames nor the request's coroutines hold it while the answer is awaited (thousands of runs
    wait at once)."""
    from agents.catalogue.providers._wire import Outgoing
    from core import fibers

    held, release = threading.Event(), threading.Event()

    def script(n: int, i: int, head: bytes) -> tuple[bytes, bool]:
        held.set()
        release.wait(10)
        return response(answer("ok")), False

    server = RawServer(script)
    big = "x" * 300_000
    texts: list[str] = []

    def call() -> None:
        provider = build_provider("openai_compatible", base_url=server.url(), timeout=5)
        completion = provider.complete(
            model="m", messages=[Message(role="user", content=big)], tools=[], max_tokens=5
        )
        texts.append(completion.text)

    caller = threading.Thread(target=call)
    try:
        caller.start()
        assert held.wait(10)
        frames = []
        frame = sys._current_frames()[caller.ident]
        while frame is not None:
            frames.append(frame)
            frame = frame.f_back

        async def in_flight() -> list:
            return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

        for task in fibers.wait(in_flight()):
            coro = task.get_coro()
            while getattr(coro, "cr_frame", None) is not None:
                frames.append(coro.cr_frame)
                coro = coro.cr_await
        names = {f.f_code.co_name for f in frames}
        assert {"request", "_request", "send", "exchange"} <= names
        for f in frames:
            for name, value in f.f_locals.items():
                if isinstance(value, Outgoing):
                    value = value.data
                if isinstance(value, bytes | bytearray):
                    assert len(value) < 10_000, f"{f.f_code.co_name} keeps {name}"
    finally:
        release.set()
        caller.join(10)
        server.close()
    assert texts == ["ok"]


def test_a_url_is_parsed_once_for_all_its_requests_and_only_its_own():
    """The direct exchange's view of a URL is cached by the URL (the runs of a connection
    share one): immutable, and a different URL never gets another's."""
    first = provider_http._target("http://127.0.0.1:8080/v1/chat/completions?x=1")
    assert first is provider_http._target("http://127.0.0.1:8080/v1/chat/completions?x=1")
    assert (first.scheme, first.raw_host, first.port, first.path, first.netloc) == (
        "http",
        "127.0.0.1",
        8080,
        "/v1/chat/completions?x=1",
        "127.0.0.1:8080",
    )
    other = provider_http._target("https://bücher.example/v1/chat/completions")
    assert (other.host, other.raw_host, other.port, other.path) == (
        "bücher.example",
        "xn--bcher-kva.example",
        443,
        "/v1/chat/completions",
    )
    with pytest.raises(AttributeError):
        first.port = 1  # type: ignore[misc]


def test_a_kept_alive_connection_holds_nothing_of_the_request_that_used_it_last():
    """What a streamed request handed the exchange (its `on_body`: the run's parser, the run
    itself behind it) is let go when the answer is complete, though the connection stays in the
    pool for the next request."""
    import gc
    import weakref

    server = RawServer(lambda n, i, head: (response(answer("ok")), False))

    class Pieces:
        def __init__(self) -> None:
            self.seen = 0

        def __call__(self, status: int, headers: object, piece: bytes) -> None:
            self.seen += len(piece)

    def call() -> weakref.ref:
        provider = build_provider("openai_compatible", base_url=server.url(), timeout=5)
        pieces = Pieces()
        resp = provider_http.request(
            provider,
            "POST",
            f"{server.url()}/chat/completions",
            headers={},
            json_body={},
            on_body=pieces,
        )
        assert resp.status == 200 and pieces.seen == len(resp.body)
        return weakref.ref(pieces)

    try:
        gone = in_thread(call)
        gc.collect()
        assert gone() is None
        assert in_thread(lambda: ask(server.url())) == "ok"
        assert server.connections == 1  # the same connection, kept alive meanwhile
    finally:
        server.close()
