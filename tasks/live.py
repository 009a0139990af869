"""The live channel, the worker's side: what a model turn is writing, sent to whoever watches the
task, with no row written (issue 52).

A run calls `publish(task_id, run_id, kind, data)` for each piece of a turn as the provider hands
it over. The kinds (`KINDS`), each an append to what a viewer shows:

- `"turn"`, `{}`: a new turn starts (the viewer clears the last one's text);
- `"text"`, `{"text": "…"}`: visible text, appended;
- `"tool_call"`, `{"index": 0, "name": "fetch_url", "arguments": "{\\"url"}`: a tool call as it
  forms; `arguments` is a fragment appended to that call's, `name` may be empty after the first;
- `"end"`, `{"stored": true, "turn": 3}`: the turn is over: stored as the transcript's turn 3
  (the page's refresh shows it) or, `{"stored": false}`, discarded (cut off, truncated, declined:
  the viewer drops what it showed). Publish it after the step's commit, so that a page refreshed
  on it shows the stored turn.

Hidden reasoning is no kind: it is never published. An unknown kind is a programming error
(ValueError), raised before anything else.

**Nothing is sent while nobody watches.** The web process that shows a task to someone announces
it, `NOTIFY acthelm_watch, '<task_id>'` (`WATCH_CHANNEL`), again every few seconds while a viewer
is connected (`tasks.livestream`); the worker's LISTEN connection hands each announcement to
`watch_announced(payload)`, which keeps the task watched for `WATCH_SECONDS`. For a task nobody
watches, `publish` keeps the current turn's text in memory (so that a viewer who arrives mid-turn
is sent it whole) and returns: no NOTIFY, no connection, no row.

For a watched task the deltas are coalesced: at most `FLUSHES_PER_SECOND` NOTIFYs per task per
second on `LIVE_CHANNEL` (more only when one batch is larger than a payload), sent by one thread
of the process (`Publisher`) through the process's Django connection — a pooled one is given back
after each send (`core.dbpool.release_connection`), an unpooled one closed, so no connection is
held between sends. A NOTIFY's payload is below PostgreSQL's 8,000 bytes: a batch larger than
`MAX_PAYLOAD_BYTES` is **chunked**, never cut — a long text or arguments fragment is split into
several appends, in order, each message numbered (`seq`) so that none is folded with an identical
one of the same transaction.

A message on `LIVE_CHANNEL` is JSON: `{"task": 7, "run": 31, "seq": 12, "reset": false,
"deltas": [["text", {"text": "Hel"}], …]}`; `reset` true says that the deltas are the turn so far
(sent to a newly arrived viewer) and replace what a viewer shows.
"""

import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from django.db import DatabaseError, InterfaceError, transaction
from django.db import connection as db

from core.dbpool import is_pooled, release_connection

log = logging.getLogger("acthelm.live")

LIVE_CHANNEL = "acthelm_live"
WATCH_CHANNEL = "acthelm_watch"
KINDS = frozenset({"turn", "text", "tool_call", "end"})

#: How long one announcement keeps a task watched; the web re-announces every third of it.
WATCH_SECONDS = 10.0
ANNOUNCE_SECONDS = 3.0
FLUSHES_PER_SECOND = 4
#: A NOTIFY's payload must stay below 8,000 bytes; the JSON around the deltas fits in the rest.
MAX_PAYLOAD_BYTES = 7600
#: The current turn kept for a viewer who arrives mid-turn, per task; past it, no more is kept
#: for the catch-up (live deltas still flow).
MAX_TURN_BYTES = 256 * 1024
#: A turn no delta touched for this long is forgotten (a run that died without an "end").
TURN_IDLE_SECONDS = 600.0
#: How often at most those turns (and expired watches) are looked for: a scan of every task the
#: process runs, so never once per turn (10,000 agents starting turns made it quadratic).
SWEEP_SECONDS = 10.0

Delta = list[Any]  # [kind, data]: a list, as JSON gives it back


def _merge(deltas: list[Delta], kind: str, data: dict[str, Any]) -> int:
    """Append one delta to `deltas`, joined with the last when both append to the same thing
    (text to text, a call's arguments to the same call's); the bytes it added, roughly."""
    if deltas:
        last_kind, last = deltas[-1]
        if kind == "text" and last_kind == "text":
            text = str(data.get("text", ""))
            deltas[-1] = ["text", {"text": last["text"] + text}]
            return len(text)
        if kind == "tool_call" and last_kind == "tool_call" and last["index"] == data.get("index"):
            arguments = str(data.get("arguments", ""))
            deltas[-1] = [
                "tool_call",
                {
                    "index": last["index"],
                    "name": last["name"] or str(data.get("name", "")),
                    "arguments": last["arguments"] + arguments,
                },
            ]
            return len(arguments)
    if kind == "text":
        value: dict[str, Any] = {"text": str(data.get("text", ""))}
    elif kind == "tool_call":
        value = {
            "index": int(data.get("index", 0)),
            "name": str(data.get("name", "")),
            "arguments": str(data.get("arguments", "")),
        }
    else:
        value = dict(data)
    deltas.append([kind, value])
    return len(json.dumps(value))


def _split(delta: Delta, room: int) -> tuple[Delta, Delta | None]:
    """The head of an appending delta that fits in `room` bytes of JSON, and the rest (None when
    it fits whole, or cannot be split: a "turn" or an "end")."""
    kind, data = delta
    key = {"text": "text", "tool_call": "arguments"}.get(kind)
    if key is None or not data[key]:
        return delta, None
    text: str = data[key]
    overhead = len(json.dumps([kind, {**data, key: ""}]))
    # JSON escapes may take up to 6 bytes per character (\\uXXXX): cut by measured size.
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if overhead + len(json.dumps(text[:mid])) - 2 <= room:
            lo = mid
        else:
            hi = mid - 1
    if lo >= len(text):
        return delta, None
    lo = max(lo, 1)  # always progress
    head = [kind, {**data, key: text[:lo]}]
    tail_data = {**data, key: text[lo:]}
    if kind == "tool_call":
        tail_data["name"] = ""  # the name went with the head
    return head, [kind, tail_data]


def encode(task_id: int, run_id: int, deltas: list[Delta], *, reset: bool, seq: int) -> list[str]:
    """The payloads for one batch, each below `MAX_PAYLOAD_BYTES` (chunked, in order); `seq`
    numbers the first and counts up."""
    payloads: list[str] = []
    pending = list(deltas)
    first = True
    while pending or first:
        head = {"task": task_id, "run": run_id, "seq": seq, "reset": reset and first, "deltas": []}
        room = MAX_PAYLOAD_BYTES - len(json.dumps(head).encode()) - 8
        batch: list[Delta] = []
        while pending:
            delta = pending[0]
            size = len(json.dumps(delta).encode()) + 2
            if size <= room:
                batch.append(delta)
                room -= size
                pending.pop(0)
                continue
            fits, rest = _split(delta, room - 2)
            if rest is None or (not batch and len(json.dumps(fits).encode()) > room):
                if batch:
                    break
                # a delta that cannot be split and does not fit: never sent (a kind's own data
                # is small; this is a guard, not a path)
                pending.pop(0)
                log.warning("live.delta_too_large", extra={"task_id": task_id})
                continue
            batch.append(fits)
            pending[0] = rest
            break
        head["deltas"] = batch
        payloads.append(json.dumps(head))
        seq += 1
        first = False
    return payloads


@dataclass
class _Turn:
    run_id: int
    deltas: list[Delta] = field(default_factory=list)
    size: int = 0
    touched: float = 0.0


@dataclass
class _Pending:
    run_id: int
    deltas: list[Delta] = field(default_factory=list)
    reset: bool = False


def _send_notifies(payloads: list[str]) -> None:
    """NOTIFY each payload on LIVE_CHANNEL, in order, in one transaction; then the connection is
    given back (pooled) or closed, so none is held until the next send."""
    try:
        with transaction.atomic(), db.cursor() as cursor:
            for payload in payloads:
                cursor.execute("SELECT pg_notify(%s, %s)", [LIVE_CHANNEL, payload])
    finally:
        if is_pooled():
            release_connection()
        else:
            db.close()


class Publisher:
    """The process's side of the channel: the watched tasks, each task's current turn, and the
    one thread that sends. Module-level functions use one instance per process (`publisher`)."""

    def __init__(
        self,
        *,
        send: Callable[[list[str]], None] = _send_notifies,
        flushes_per_second: float = FLUSHES_PER_SECOND,
        watch_seconds: float = WATCH_SECONDS,
        turn_idle_seconds: float = TURN_IDLE_SECONDS,
        sweep_seconds: float = SWEEP_SECONDS,
    ) -> None:
        self._send = send
        self.interval = 1.0 / flushes_per_second
        self.watch_seconds = watch_seconds
        self.turn_idle_seconds = turn_idle_seconds
        self.sweep_seconds = sweep_seconds
        self._next_sweep = 0.0
        self._cond = threading.Condition()
        self._watched: dict[int, float] = {}  # task id -> monotonic expiry
        self._turns: dict[int, _Turn] = {}
        self._pending: dict[int, _Pending] = {}
        self._last_sent: dict[int, float] = {}
        self._seq = 0
        self._thread: threading.Thread | None = None
        self.sent = 0  # NOTIFYs sent (for tests and measurements)

    # --- what the worker's listener calls --------------------------------------------------

    def watch_announced(self, payload: str) -> None:
        """A web process shows these tasks to someone: `"7"`, `"7,9"`, `"7:join"` (a viewer just
        arrived: it is sent the turn so far). Never raises; a malformed item is ignored."""
        now = time.monotonic()
        with self._cond:
            for item in payload.split(","):
                task, _, flag = item.strip().partition(":")
                if not task.isdigit():
                    continue
                task_id = int(task)
                was_watched = self._watched.get(task_id, 0.0) > now
                self._watched[task_id] = now + self.watch_seconds
                turn = self._turns.get(task_id)
                if turn is not None and turn.deltas and (flag == "join" or not was_watched):
                    self._pending[task_id] = _Pending(turn.run_id, list(turn.deltas), reset=True)
                    self._start()
                    self._cond.notify()

    def watched(self, task_id: int) -> bool:
        with self._cond:
            return self._watched.get(task_id, 0.0) > time.monotonic()

    # --- what a run calls ------------------------------------------------------------------

    def publish(self, task_id: int, run_id: int, kind: str, data: dict[str, Any]) -> None:
        """One piece of a turn (see the module's doc for the kinds). Cheap and never blocks on
        the database: with nobody watching it only keeps the turn in memory."""
        if kind not in KINDS:
            raise ValueError(f"live: unknown kind {kind!r}; one of {sorted(KINDS)}")
        now = time.monotonic()
        with self._cond:
            turn = self._turns.get(task_id)
            if kind == "turn" or turn is None or turn.run_id != run_id:
                if turn is None and now >= self._next_sweep:
                    self._forget_idle(now)
                turn = self._turns[task_id] = _Turn(run_id)
            if kind == "end":
                del self._turns[task_id]
            elif kind != "turn" and turn.size < MAX_TURN_BYTES:
                turn.size += _merge(turn.deltas, kind, data)
            turn.touched = now
            if self._watched.get(task_id, 0.0) <= now:
                return
            pending = self._pending.get(task_id)
            if pending is None or pending.run_id != run_id:
                pending = self._pending[task_id] = _Pending(run_id)
            _merge(pending.deltas, kind, data)
            self._start()
            self._cond.notify()

    def _forget_idle(self, now: float) -> None:
        self._next_sweep = now + self.sweep_seconds
        idle = [t for t, turn in self._turns.items() if now - turn.touched > self.turn_idle_seconds]
        for task_id in idle:
            del self._turns[task_id]
        for task_id in [t for t, until in self._watched.items() if until <= now]:
            del self._watched[task_id]
            self._last_sent.pop(task_id, None)

    # --- the sending thread ----------------------------------------------------------------

    def _start(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._run, name="live-publisher", daemon=True)
            self._thread.start()

    def _due(self, now: float) -> tuple[list[tuple[int, _Pending]], float | None]:
        """The batches whose task may be sent now, and how long until the next one may."""
        due: list[tuple[int, _Pending]] = []
        wait: float | None = None
        for task_id, pending in list(self._pending.items()):
            ready_at = self._last_sent.get(task_id, 0.0) + self.interval
            if ready_at <= now:
                due.append((task_id, pending))
                del self._pending[task_id]
                self._last_sent[task_id] = now
            else:
                wait = min(wait or 1.0, ready_at - now)
        return due, wait

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._pending:
                    if not self._cond.wait(timeout=60.0):
                        self._thread = None  # idle a minute: the next publish starts another
                        return
                due, wait = self._due(time.monotonic())
                if not due:
                    self._cond.wait(timeout=wait)
                    continue
                payloads: list[str] = []
                for task_id, pending in due:
                    batch = encode(
                        task_id, pending.run_id, pending.deltas, reset=pending.reset, seq=self._seq
                    )
                    self._seq += len(batch)
                    payloads += batch
            try:
                self._send(payloads)
                self.sent += len(payloads)
            except (DatabaseError, InterfaceError):
                log.warning("live.send_failed", exc_info=True)
            except Exception:
                log.exception("live.send_error")


publisher = Publisher()


def publish(task_id: int, run_id: int, kind: str, data: dict[str, Any]) -> None:
    """What a run calls for each piece of a turn: `Publisher.publish` of the process's one."""
    publisher.publish(task_id, run_id, kind, data)


def watch_announced(payload: str) -> None:
    """What the worker's LISTEN connection calls for a NOTIFY on `WATCH_CHANNEL`."""
    publisher.watch_announced(payload)
