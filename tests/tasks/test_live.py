"""The live channel's worker side (tasks/live.py) on real PostgreSQL: nothing is sent for a task
nobody watches; a watched task's deltas reach a LISTEN connection within a second, coalesced and
chunked below PostgreSQL's payload limit; a viewer who arrives mid-turn gets the turn so far."""

import json
import threading
import time

import psycopg
import pytest
from django.db import connection

from core.dburl import libpq_conninfo
from tasks import live
from tasks.live import LIVE_CHANNEL, WATCH_CHANNEL, Publisher, encode

pytestmark = pytest.mark.django_db(transaction=True)


def conninfo() -> str:
    return libpq_conninfo(connection.settings_dict, application_name="test-live")


class Listener:
    """A real LISTEN connection on `channel`, collecting what arrives (with when)."""

    def __init__(self, channel: str):
        self.conn = psycopg.connect(conninfo(), autocommit=True)
        self.conn.execute(f"LISTEN {channel}")
        self.got: list[tuple[float, str]] = []

    def collect(self, seconds: float) -> list[tuple[float, str]]:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            for note in self.conn.notifies(timeout=left, stop_after=1):
                self.got.append((time.monotonic(), note.payload))
        return self.got

    def close(self) -> None:
        self.conn.close()


class WorkerListener(threading.Thread):
    """What the worker's `_listen` does with the watch channel: each NOTIFY on it handed to
    `watch_announced` (the lead wires the same call into agents/engine/runtime/worker.py)."""

    def __init__(self, publisher: Publisher):
        super().__init__(daemon=True)
        self.publisher = publisher
        self.stop = threading.Event()
        self.listening = threading.Event()

    def run(self) -> None:
        with psycopg.connect(conninfo(), autocommit=True) as conn:
            conn.execute(f"LISTEN {WATCH_CHANNEL}")
            self.listening.set()
            while not self.stop.is_set():
                for note in conn.notifies(timeout=0.2, stop_after=10):
                    self.publisher.watch_announced(note.payload)


def announce(payload: str) -> None:
    with psycopg.connect(conninfo(), autocommit=True) as conn:
        conn.execute("SELECT pg_notify(%s, %s)", [WATCH_CHANNEL, payload])


@pytest.fixture
def listener():
    one = Listener(LIVE_CHANNEL)
    yield one
    one.close()


@pytest.fixture
def worker_side():
    publisher = Publisher()
    thread = WorkerListener(publisher)
    thread.start()
    assert thread.listening.wait(5)
    yield publisher
    thread.stop.set()
    thread.join(5)


def texts(payloads: list[str]) -> str:
    out = ""
    for payload in payloads:
        for kind, data in json.loads(payload)["deltas"]:
            if kind == "text":
                out += data["text"]
    return out


def test_with_nobody_watching_publish_sends_nothing(listener, worker_side):
    publisher = worker_side
    for n in range(200):
        publisher.publish(7, 1, "text", {"text": f"word{n} "})
    publisher.publish(7, 1, "tool_call", {"index": 0, "name": "fetch_url", "arguments": "{}"})
    publisher.publish(7, 1, "end", {"stored": True})
    assert listener.collect(1.5) == []  # no NOTIFY reached a listener
    assert publisher.sent == 0
    assert publisher._thread is None  # not even the sending thread was started


def test_a_watched_tasks_deltas_arrive_within_a_second_coalesced(listener, worker_side):
    publisher = worker_side
    announce("7")
    deadline = time.monotonic() + 5
    while not publisher.watched(7):
        assert time.monotonic() < deadline, "the announcement did not arrive"
        time.sleep(0.02)
    publisher.publish(8, 2, "text", {"text": "not watched"})  # another task: nothing sent
    started = time.monotonic()
    publisher.publish(7, 1, "turn", {})
    publisher.publish(7, 1, "text", {"text": "Hel"})
    got = listener.collect(1.0)
    assert got, "no delta within 1 s"
    assert got[0][0] - started < 1.0
    # 2 s of deltas, 50 a second: coalesced to at most 4 NOTIFYs a second (and one at once)
    words = [f"w{n} " for n in range(100)]
    words_started = time.monotonic()
    for word in words:
        publisher.publish(7, 1, "text", {"text": word})
        time.sleep(0.02)
    publisher.publish(7, 1, "tool_call", {"index": 0, "name": "fetch_url", "arguments": '{"u'})
    publisher.publish(7, 1, "tool_call", {"index": 0, "name": "", "arguments": 'rl": "x"}'})
    publisher.publish(7, 1, "end", {"stored": True})
    spent = time.monotonic() - words_started  # ~2.3 s; longer on a loaded machine
    payloads = [payload for _, payload in listener.collect(1.5)]
    messages = [json.loads(p) for p in payloads]
    assert {m["task"] for m in messages} == {7}
    assert texts(payloads) == "Hel" + "".join(words)
    # At most 4 a second while the deltas came (104 of them), plus the first and the last.
    assert len(payloads) <= int(spent * 4) + 3, (len(payloads), spent)
    calls = [d for m in messages for k, d in m["deltas"] if k == "tool_call"]
    assert "".join(c["arguments"] for c in calls) == '{"url": "x"}'
    assert calls[0]["name"] == "fetch_url"
    assert messages[-1]["deltas"][-1] == ["end", {"stored": True}]
    seqs = [m["seq"] for m in messages]
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)


def test_a_viewer_arriving_mid_turn_is_sent_the_turn_so_far(listener, worker_side):
    publisher = worker_side
    publisher.publish(7, 1, "turn", {})
    publisher.publish(7, 1, "text", {"text": "So far, "})
    publisher.publish(7, 1, "text", {"text": "so good."})
    assert listener.collect(0.5) == []
    announce("7:join")
    got = listener.collect(1.5)
    assert len(got) == 1
    message = json.loads(got[0][1])
    assert message["reset"] is True
    assert message["deltas"] == [["text", {"text": "So far, so good."}]]


def test_the_watch_expires_without_announcements(listener):
    publisher = Publisher(watch_seconds=0.5)
    publisher.watch_announced("7")
    publisher.publish(7, 1, "text", {"text": "seen"})
    assert texts([p for _, p in listener.collect(0.6)]) == "seen"
    publisher.publish(7, 1, "text", {"text": "unseen"})
    assert listener.collect(1.0)[1:] == []


def test_a_large_delta_is_chunked_below_the_payload_limit_and_arrives_whole(listener):
    text = ('naïve "quoted" \\ line\n' * 900) + "😀" * 2000  # escapes and 4-byte characters
    payloads = encode(7, 1, [["text", {"text": text}]], reset=False, seq=0)
    assert len(payloads) > 3
    assert all(len(p.encode()) < 8000 for p in payloads)
    assert texts(payloads) == text
    publisher = Publisher()
    publisher.watch_announced("7")
    publisher.publish(7, 1, "text", {"text": text})
    publisher.publish(7, 1, "tool_call", {"index": 1, "name": "w", "arguments": "x" * 20000})
    got = [p for _, p in listener.collect(1.5)]
    assert texts(got) == text
    arguments = "".join(
        d["arguments"] for p in got for k, d in json.loads(p)["deltas"] if k == "tool_call"
    )
    assert arguments == "x" * 20000


def test_hidden_reasoning_is_no_kind():
    with pytest.raises(ValueError, match="reasoning"):
        live.publish(7, 1, "reasoning", {"text": "secret"})


def test_a_malformed_announcement_is_ignored():
    publisher = Publisher()
    publisher.watch_announced("x,7:join, 9 ,;DROP")
    assert publisher.watched(7) and publisher.watched(9) and not publisher.watched(0)


def test_a_turn_left_without_its_end_is_forgotten_by_a_sweep_not_by_every_new_turn():
    publisher = Publisher(turn_idle_seconds=0.05, sweep_seconds=1.5)
    publisher.publish(7, 1, "turn", {})  # the run died: no "end" ever comes
    publisher.publish(7, 1, "text", {"text": "lost"})
    time.sleep(0.1)
    publisher.publish(8, 2, "turn", {})  # 7 is idle, but the next sweep is not due
    assert set(publisher._turns) == {7, 8}
    time.sleep(1.5)
    publisher.publish(9, 3, "turn", {})
    assert set(publisher._turns) == {9}
