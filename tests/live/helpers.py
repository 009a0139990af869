"""What the live channel's tests share: the worker's side of the watch channel as the worker's
listener runs it (a real LISTEN connection handing each announcement to `watch_announced`), and a
reader of Server-Sent Events."""

import json
import queue
import threading
import time
from collections.abc import Iterable

import psycopg
from django.db import connection

from core.dburl import libpq_conninfo
from tasks.live import WATCH_CHANNEL, Publisher


def conninfo() -> str:
    return libpq_conninfo(connection.settings_dict, application_name="test-live")


class WorkerSide(threading.Thread):
    """A Publisher fed by a real LISTEN on the watch channel, as the worker's `_listen` feeds the
    process's one (`tasks.live.watch_announced`)."""

    def __init__(self, publisher: Publisher | None = None):
        super().__init__(daemon=True)
        self.publisher = publisher or Publisher()
        self.halt = threading.Event()
        self.listening = threading.Event()

    def run(self) -> None:
        with psycopg.connect(conninfo(), autocommit=True) as conn:
            conn.execute(f"LISTEN {WATCH_CHANNEL}")
            self.listening.set()
            while not self.halt.is_set():
                for note in conn.notifies(timeout=0.2, stop_after=10):
                    self.publisher.watch_announced(note.payload)

    def __enter__(self) -> "WorkerSide":
        self.start()
        assert self.listening.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join(5)

    def wait_watched(self, task_id: int, seconds: float = 5) -> None:
        deadline = time.monotonic() + seconds
        while not self.publisher.watched(task_id):
            assert time.monotonic() < deadline, f"task {task_id} was never announced"
            time.sleep(0.02)


def parse_sse(chunks: Iterable[bytes]) -> list[dict]:
    """Each message of a stream: {"event", "data", "id"} (comments and `retry:` left out)."""
    text = b"".join(chunks).decode()
    return [m for block in text.split("\n\n") if (m := parse_message(block))]


def parse_message(block: str) -> dict | None:
    message: dict = {}
    for line in block.splitlines():
        name, _, value = line.partition(": ")
        if name in ("event", "id"):
            message[name] = value
        elif name == "data":
            message["data"] = json.loads(value)
    return message if "event" in message else None


class StreamReader(threading.Thread):
    """Reads a streaming response in a thread of its own (as a server's thread would), each
    message into `messages` with the time it came."""

    def __init__(self, response):
        super().__init__(daemon=True)
        self.response = response
        self.messages: queue.Queue[tuple[float, dict]] = queue.Queue()
        self.done = threading.Event()

    def run(self) -> None:
        try:
            for chunk in self.response.streaming_content:
                for block in chunk.decode().split("\n\n"):
                    if message := parse_message(block):
                        self.messages.put((time.monotonic(), message))
        finally:
            self.response.close()
            connection.close()
            self.done.set()

    def next(self, event: str, seconds: float = 5) -> tuple[float, dict]:
        deadline = time.monotonic() + seconds
        while True:
            at, message = self.messages.get(timeout=max(0.01, deadline - time.monotonic()))
            if message["event"] == event:
                return at, message
