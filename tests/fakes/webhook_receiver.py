"""A real HTTP receiver on 127.0.0.1 for webhook notifications; it checks the signature.

Each POST is recorded with its headers, body and whether `X-Acthelm-Signature` is the HMAC-SHA256
of `<X-Acthelm-Timestamp>.<body>` under `secret` with a timestamp within the documented tolerance
(a wrong or missing signature, or a stale timestamp, is answered 401, as a careful receiver
would). `mode` decides the answer: "ok" (204), "error" (500), "slow" (sleeps `delay`
seconds before answering 200).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

TOLERANCE_SECONDS = 300  # docs/operations.md: what a receiver should accept


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    signature_ok: bool

    @property
    def json(self) -> dict:
        return json.loads(self.body)


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        receiver = self.server.receiver
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        stamp = self.headers.get("X-Acthelm-Timestamp", "")
        signed = stamp.encode() + b"." + body
        digest = hmac.new(receiver.secret.encode(), signed, hashlib.sha256).hexdigest()
        expected = "sha256=" + digest
        given = self.headers.get("X-Acthelm-Signature", "")
        fresh = stamp.isdigit() and abs(time.time() - int(stamp)) <= TOLERANCE_SECONDS
        ok = bool(receiver.secret) and fresh and hmac.compare_digest(given, expected)
        with receiver.lock:
            receiver.received.append(
                Received(self.path, {k.lower(): v for k, v in self.headers.items()}, body, ok)
            )
        if receiver.mode == "trickle":
            self._trickle(receiver.delay)
            return
        if receiver.mode == "leak":
            self._answer(500, receiver.answer_body)
            return
        if receiver.secret and not ok:
            status = 401
        elif receiver.mode == "error":
            status = 500
        elif receiver.mode == "slow":
            time.sleep(receiver.delay)
            status = 200
        else:
            status = 204
        self._answer(status, b"")

    def _answer(self, status: int, body: bytes) -> None:
        try:
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the sender gave up waiting

    def _trickle(self, seconds: float) -> None:
        try:
            self.send_response(200)
            self.send_header("Content-Length", "100000")
            self.end_headers()
            until = time.monotonic() + seconds
            while time.monotonic() < until:
                self.wfile.write(b".")
                self.wfile.flush()
                time.sleep(0.2)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the sender gave up, as it should


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    receiver: WebhookReceiver


class WebhookReceiver:
    def __init__(
        self, *, secret: str = "", mode: str = "ok", delay: float = 2.0, answer_body: bytes = b""
    ):
        self.secret = secret
        self.answer_body = answer_body
        self.mode = mode
        self.delay = delay
        self.received: list[Received] = []
        self.lock = threading.Lock()
        self.httpd = _Server(("127.0.0.1", 0), _Handler)
        self.httpd.receiver = self
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/hook"

    def start(self) -> WebhookReceiver:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> WebhookReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
