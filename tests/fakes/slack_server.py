"""A scripted Slack on 127.0.0.1: the Web API's `chat.postMessage` and the `response_url`s of
the messages it posted.

`POST /api/chat.postMessage` checks the `Authorization: Bearer <token>` header as Slack does
(a wrong or missing token answers HTTP 200 with `{"ok": false, "error": "invalid_auth"}`),
records the JSON body (channel, text, blocks) and answers `{"ok": true, "ts": …}`. Each posted
message gets a response URL, `<url>/respond/<n>`; a POST there is recorded in `responses`.
`mode="error"` answers every API call `{"ok": false, "error": "channel_not_found"}`.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlencode


@dataclass
class Posted:
    headers: dict[str, str]
    body: dict[str, Any]
    response_url: str

    @property
    def blocks(self) -> list[dict[str, Any]]:
        return self.body.get("blocks", [])

    def buttons(self) -> dict[str, dict[str, Any]]:
        """The message's buttons by action_id."""
        return {
            element["action_id"]: element
            for block in self.blocks
            if block.get("type") == "actions"
            for element in block["elements"]
        }


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib name
        pass

    def do_POST(self) -> None:  # noqa: N802 - stdlib name
        slack = self.server.slack
        raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        headers = {k.lower(): v for k, v in self.headers.items()}
        try:
            body = json.loads(raw)
        except ValueError:
            self._answer(400, {"ok": False, "error": "invalid_json"})
            return
        if self.path.startswith("/respond/"):
            with slack.lock:
                slack.responses.append((self.path, body))
            self._answer(200, None)
            return
        if self.path != "/api/chat.postMessage":
            self._answer(404, {"ok": False, "error": "unknown_method"})
            return
        if headers.get("authorization") != f"Bearer {slack.token}":
            self._answer(200, {"ok": False, "error": "invalid_auth"})
            return
        if slack.mode == "error":
            self._answer(200, {"ok": False, "error": "channel_not_found"})
            return
        with slack.lock:
            number = len(slack.posted) + 1
            slack.posted.append(Posted(headers, body, f"{slack.base}/respond/{number}"))
        answer = {"ok": True, "channel": body.get("channel"), "ts": f"1700000000.{number:06d}"}
        answer["message"] = {"text": body.get("text"), "blocks": body.get("blocks")}
        self._answer(200, answer)

    def _answer(self, status: int, body: dict[str, Any] | None) -> None:
        data = b"ok" if body is None else json.dumps(body).encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except (BrokenPipeError, ConnectionResetError):
            pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    slack: ScriptedSlack


class ScriptedSlack:
    def __init__(self, *, token: str, mode: str = "ok"):
        self.token = token
        self.mode = mode
        self.posted: list[Posted] = []
        self.responses: list[tuple[str, dict[str, Any]]] = []
        self.lock = threading.Lock()
        self.httpd = _Server(("127.0.0.1", 0), _Handler)
        self.httpd.slack = self
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    @property
    def api_url(self) -> str:
        return f"{self.base}/api"

    def start(self) -> ScriptedSlack:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()

    def __enter__(self) -> ScriptedSlack:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def interaction(
    secret: str,
    *,
    user: str,
    action_id: str,
    value: str = "",
    response_url: str,
    timestamp: int | None = None,
) -> tuple[bytes, dict[str, str]]:
    """A `block_actions` request as Slack sends it: the body form-encoded as `payload=<JSON>`,
    signed as Slack documents ("Verifying requests from Slack"): `v0=` + hex HMAC-SHA256 of
    `v0:<X-Slack-Request-Timestamp>:<body>` under the app's signing secret. Returns the body
    and the headers."""
    action: dict[str, Any] = {
        "type": "button",
        "action_id": action_id,
        "block_id": "approval",
        "text": {"type": "plain_text", "text": action_id},
        "action_ts": f"{time.time():.6f}",
    }
    if value:
        action["value"] = value
    payload = {
        "type": "block_actions",
        "user": {"id": user, "username": "someone", "name": "someone", "team_id": "T0TEAM"},
        "api_app_id": "A0APP",
        "team": {"id": "T0TEAM", "domain": "acme"},
        "container": {"type": "message", "message_ts": "1700000000.000001"},
        "channel": {"id": "C0APPROVALS", "name": "approvals"},
        "response_url": response_url,
        "trigger_id": "1.2.3",
        "actions": [action],
    }
    body = urlencode({"payload": json.dumps(payload)}).encode()
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    base = b"v0:" + stamp.encode() + b":" + body
    signature = "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()
    return body, {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": signature}
