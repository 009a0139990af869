"""A real SMTP server on 127.0.0.1 (aiosmtpd) that keeps every message it accepts.

with SmtpServer() as smtp:
    settings.EMAIL_HOST, settings.EMAIL_PORT = smtp.host, smtp.port
    ...
    [message] = smtp.messages  # email.message.EmailMessage
"""

from __future__ import annotations

import socket
import threading
from email import message_from_bytes, policy

from aiosmtpd.controller import Controller


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _Handler:
    def __init__(self, server: SmtpServer):
        self.server = server

    async def handle_DATA(self, server, session, envelope):  # noqa: N802 - aiosmtpd's name
        message = message_from_bytes(envelope.original_content, policy=policy.default)
        with self.server.lock:
            self.server.messages.append(message)
            self.server.envelopes.append((envelope.mail_from, list(envelope.rcpt_tos)))
        return "250 Message accepted for delivery"


class SmtpServer:
    def __init__(self) -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        self.messages: list = []
        self.envelopes: list[tuple[str, list[str]]] = []
        self.lock = threading.Lock()
        self.controller = Controller(_Handler(self), hostname=self.host, port=self.port)

    def start(self) -> SmtpServer:
        self.controller.start()
        return self

    def stop(self) -> None:
        self.controller.stop()

    def __enter__(self) -> SmtpServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
