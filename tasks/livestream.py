"""The live channel, the web's side: a task's events as Server-Sent Events, then what its turn is
writing as it is written (`tasks.live`), until the task settles (issue 52).

One `Hub` per web process (`hub()`), started by the first viewer: ONE connection straight to
PostgreSQL (`core.dburl.listen_conninfo`: `ACTHELM_LISTEN_DATABASE_URL`, else the default
database — behind a transaction-mode PgBouncer it must be the direct one, as the worker's), which

- LISTENs on `tasks.live.LIVE_CHANNEL` and hands each message to the viewers of its task;
- announces the watched tasks on `tasks.live.WATCH_CHANNEL` every `ANNOUNCE_SECONDS`, and at once
  with `:join` when a viewer arrives (the worker then sends it the turn so far);
- reads, once a second while anyone watches, the events stored since (one statement for every
  watched task, on the `(task, id)` index) and the watched tasks' statuses, and hands them on:
  a stored event as soon as it is committed, within a second; a settled task ends its streams.

A viewer (`Viewer`) is a bounded queue; it holds no database connection while it waits. At most
`ACTHELM_LIVE_MAX_VIEWERS` viewers per process (`hub().subscribe` returns None past it: the
views answer 503 with `Retry-After`). `sse_events` is the stream both doors send (the API with a
token, the console with a session): the stored events after `Last-Event-ID` (each with `id:` —
only stored events are resumable), then stored events and deltas (no id) as they come.
"""

import json
import logging
import os
import queue
import threading
import time
from collections.abc import Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.conf import settings
from django.db import connection as db
from django.http import HttpRequest, JsonResponse, StreamingHttpResponse
from django.http.response import HttpResponseBase

from core.dburl import listen_conninfo
from core.exceptions import ErrorCode
from tasks.live import ANNOUNCE_SECONDS, LIVE_CHANNEL, WATCH_CHANNEL
from tasks.models import Task, TaskEvent
from tasks.selectors import event_as_dict
from tasks.states import SETTLED

log = logging.getLogger("acthelm.live")

POLL_SECONDS = 1.0
KEEPALIVE_SECONDS = 15.0
QUEUE_SIZE = 2000
REPLAY_PAGE = 500
#: What a client waits before it reconnects (the SSE `retry:` field), in milliseconds.
RETRY_MS = 2000

_EVENT_COLUMNS = (
    "id, task_id, run_id, kind, actor_kind, actor_label, from_status, to_status, data, created_at"
)


@dataclass
class Viewer:
    """One connected stream: the task it watches and what the hub hands it."""

    task_id: int
    after: int | None = None  # the last stored event it was sent; None until replayed
    items: "queue.Queue[tuple[str, Any]]" = field(default_factory=lambda: queue.Queue(QUEUE_SIZE))
    overflowed: bool = False

    def put(self, kind: str, value: Any) -> None:
        try:
            self.items.put_nowait((kind, value))
        except queue.Full:
            self.overflowed = True  # the stream ends; the client resumes with Last-Event-ID


class Hub:
    """The process's one LISTEN connection and its viewers (see the module's doc)."""

    def __init__(self, *, max_viewers: int, poll_seconds: float = POLL_SECONDS) -> None:
        self.max_viewers = max_viewers
        self.poll_seconds = poll_seconds
        self._lock = threading.Lock()
        self._viewers: dict[int, list[Viewer]] = {}
        self._cursor: dict[int, int] = {}  # task id -> the last stored event read for it
        self._joined: set[int] = set()
        self._thread: threading.Thread | None = None
        self.conninfo = ""
        self.polls = 0  # statements run (for tests and measurements)

    # --- viewers ---------------------------------------------------------------------------

    def viewer_count(self) -> int:
        with self._lock:
            return sum(len(v) for v in self._viewers.values())

    def subscribe(self, task_id: int) -> Viewer | None:
        """A new viewer of `task_id`, or None when this process holds its maximum already."""
        with self._lock:
            if sum(len(v) for v in self._viewers.values()) >= self.max_viewers:
                return None
            viewer = Viewer(task_id)
            self._viewers.setdefault(task_id, []).append(viewer)
            if not self.conninfo:
                self.conninfo = listen_conninfo(
                    settings.ACTHELM_LISTEN_DATABASE_URL,
                    db.settings_dict,
                    application_name=f"acthelm-live web {os.getpid()}",
                )
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="live-hub", daemon=True)
                self._thread.start()
        return viewer

    def ready(self, viewer: Viewer, after: int) -> None:
        """The viewer was sent the stored events up to `after`: the hub reads from there on (or
        from earlier, for another viewer of the task) and announces the arrival."""
        with self._lock:
            viewer.after = after
            self._cursor[viewer.task_id] = min(self._cursor.get(viewer.task_id, after), after)
            self._joined.add(viewer.task_id)

    def unsubscribe(self, viewer: Viewer) -> None:
        with self._lock:
            viewers = self._viewers.get(viewer.task_id, [])
            if viewer in viewers:
                viewers.remove(viewer)
            if not viewers:
                self._viewers.pop(viewer.task_id, None)
                self._cursor.pop(viewer.task_id, None)

    def _fan_out(self, task_id: int, kind: str, value: Any) -> None:
        with self._lock:
            viewers = list(self._viewers.get(task_id, ()))
        for viewer in viewers:
            viewer.put(kind, value)

    # --- the connection's thread -----------------------------------------------------------

    def _run(self) -> None:
        while True:
            with self._lock:
                if not self._viewers:
                    self._thread = None
                    return
            try:
                with psycopg.connect(self.conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {LIVE_CHANNEL}")
                    self._serve(conn)
                    return
            except psycopg.Error:
                log.warning("live.hub_reconnect", exc_info=True)
                time.sleep(1.0)

    def _serve(self, conn: psycopg.Connection[Any]) -> None:
        announced = polled = 0.0
        while True:
            now = time.monotonic()
            with self._lock:
                if not self._viewers:
                    self._thread = None
                    return
                # announced once a viewer was sent the stored events (`ready`): its first
                # announcement is its arrival, and brings the turn so far
                tasks = sorted(
                    t
                    for t, viewers in self._viewers.items()
                    if any(v.after is not None for v in viewers)
                )
                joined, self._joined = self._joined, set()
            if tasks and (joined or now - announced >= ANNOUNCE_SECONDS):
                self._announce(conn, tasks, joined)
                announced = now
            if joined or now - polled >= self.poll_seconds:
                self._poll(conn)
                polled = time.monotonic()
            wait = max(0.05, min(self.poll_seconds - (time.monotonic() - polled), 0.25))
            for note in conn.notifies(timeout=wait, stop_after=200):
                self._deliver(note.payload)

    def _announce(self, conn: psycopg.Connection[Any], tasks: list[int], joined: set[int]) -> None:
        items = [f"{t}:join" if t in joined else str(t) for t in tasks]
        payload = ""
        for item in items:  # a payload below 8,000 bytes: several NOTIFYs for many tasks
            if len(payload) + len(item) > 7000:
                conn.execute("SELECT pg_notify(%s, %s)", [WATCH_CHANNEL, payload])
                payload = ""
            payload = f"{payload},{item}" if payload else item
        if payload:
            conn.execute("SELECT pg_notify(%s, %s)", [WATCH_CHANNEL, payload])

    def _deliver(self, payload: str) -> None:
        try:
            message = json.loads(payload)
            task_id = int(message["task"])
        except (ValueError, KeyError, TypeError):
            return
        self._fan_out(task_id, "delta", message)

    def _poll(self, conn: psycopg.Connection[Any]) -> None:
        """The watched tasks' statuses, then the events stored since each one's cursor: read in
        that order, a settled task's last events are read before its streams end."""
        with self._lock:
            cursors = dict(self._cursor)
        if not cursors:
            return
        ids = sorted(cursors)
        statuses = dict(
            conn.execute(
                f"SELECT id, status FROM {Task._meta.db_table} WHERE id = ANY(%s)", [ids]
            ).fetchall()
        )
        rows = conn.execute(
            f"SELECT {_EVENT_COLUMNS} FROM {TaskEvent._meta.db_table} e"
            " JOIN unnest(%s::bigint[], %s::bigint[]) AS c(task, after)"
            " ON e.task_id = c.task AND e.id > c.after ORDER BY e.id LIMIT 2000",
            [ids, [cursors[t] for t in ids]],
        ).fetchall()
        self.polls += 2
        for row in rows:
            event = TaskEvent(
                id=row[0],
                task_id=row[1],
                run_id=row[2],
                kind=row[3],
                actor_kind=row[4],
                actor_label=row[5],
                from_status=row[6],
                to_status=row[7],
                data=row[8],
                created_at=row[9],
            )
            with self._lock:
                if event.task_id in self._cursor:
                    self._cursor[event.task_id] = max(self._cursor[event.task_id], row[0])
            self._fan_out(event.task_id, "event", event_as_dict(event))
        if len(rows) < 2000:
            for task_id, status in statuses.items():
                if status in SETTLED:
                    self._fan_out(task_id, "end", status)
        for task_id in set(ids) - set(statuses):
            self._fan_out(task_id, "end", "deleted")


_hub: Hub | None = None
_hub_lock = threading.Lock()


def hub() -> Hub:
    """This process's hub (created on first use: after gunicorn's fork, never before)."""
    global _hub
    with _hub_lock:
        if _hub is None:
            _hub = Hub(max_viewers=settings.ACTHELM_LIVE_MAX_VIEWERS)
        return _hub


def _sse(kind: str, data: Any, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, separators=(',', ':'))}\n\n".encode()


def last_event_id(header: str | None, query: str | None = None) -> int:
    """Where a stream resumes: `Last-Event-ID` (or `?last_event_id=`), 0 when absent or not a
    stored event's id."""
    for value in (header, query):
        if value and value.strip().isdigit():
            return int(value.strip())
    return 0


def sse_events(
    hub: Hub, viewer: Viewer, *, after: int, max_seconds: float | None = None
) -> Generator[bytes]:
    """The stream: the task's stored events after `after` (`task_event`, with `id:`), then the
    live ones — `delta` (a `tasks.live` message, no id), `task_event` as each commits — and
    `end` (`{"status": …}`) when the task settles. A comment every `KEEPALIVE_SECONDS` finds a
    gone client. Past `max_seconds` (a server that must not hold a request long) it ends with
    `retry:`, and the client resumes with Last-Event-ID. It unsubscribes however it ends."""
    started = time.monotonic()
    try:
        yield f"retry: {RETRY_MS}\n\n".encode()
        last = after
        while True:
            page = list(
                TaskEvent.objects.filter(task_id=viewer.task_id, id__gt=last).order_by("id")[
                    :REPLAY_PAGE
                ]
            )
            for event in page:
                yield _sse("task_event", event_as_dict(event), event.pk)
                last = event.pk
            if len(page) < REPLAY_PAGE:
                break
        status = Task.objects.filter(pk=viewer.task_id).values_list("status", flat=True).first()
        db.close()  # the request holds no connection while it streams
        if status is None or status in SETTLED:
            yield _sse("end", {"status": status or "deleted"})
            return
        hub.ready(viewer, last)
        while True:
            if viewer.overflowed:
                yield _sse("end", {"status": None, "reason": "too slow: resume"})
                return
            if max_seconds is not None and time.monotonic() - started > max_seconds:
                return
            try:
                kind, value = viewer.items.get(timeout=KEEPALIVE_SECONDS)
            except queue.Empty:
                yield b": keepalive\n\n"
                continue
            if kind == "delta":
                yield _sse("delta", value)
            elif kind == "event":
                if value["id"] > last:
                    last = value["id"]
                    yield _sse("task_event", value, last)
            elif kind == "end":
                yield _sse("end", {"status": value})
                return
    finally:
        hub.unsubscribe(viewer)


class _Stream:
    """The stream's iterator, with the `close` Django calls when the response ends: the viewer
    is let go even when the stream never started (a client gone before the first byte)."""

    def __init__(self, the_hub: Hub, viewer: Viewer, events: Generator[bytes]) -> None:
        self.hub, self.viewer, self.events = the_hub, viewer, events

    def __iter__(self) -> Iterator[bytes]:
        return self.events

    def close(self) -> None:
        self.events.close()
        self.hub.unsubscribe(self.viewer)


def _refused(code: ErrorCode, message: str, retry_after: int | None) -> JsonResponse:
    refused = JsonResponse(
        {"code": str(code), "message": message, "field": None}, status=code.http_status
    )
    if retry_after is not None:
        refused["Retry-After"] = str(retry_after)
    return refused


def one_request_at_a_time(request: HttpRequest) -> bool:
    """Whether this process serves one request at a time and kills a long one: gunicorn's sync
    worker (`wsgi.multithread` false), its default. A stream there would hold the process's
    only slot — every other page waits — until the worker timeout kills it (30 s)."""
    return request.META.get("wsgi.multithread") is False and str(
        request.META.get("SERVER_SOFTWARE", "")
    ).startswith("gunicorn")


def stream_response(
    task_id: int, request: HttpRequest, *, from_now: bool = False
) -> HttpResponseBase:
    """The response both doors send, once they checked who asks: the stream resumed after
    `Last-Event-ID` (or `?last_event_id=`) — without either, from the first stored event, or
    with `from_now` (the console's page, which shows the stored ones) from the newest. Or 503:
    with `Retry-After` when this process holds `ACTHELM_LIVE_MAX_VIEWERS` streams already,
    without it under a server that runs one request at a time (`one_request_at_a_time`)."""
    if one_request_at_a_time(request):
        return _refused(
            ErrorCode.LIVE_UNAVAILABLE,
            "this server runs one request at a time (gunicorn's sync worker): a stream would "
            "hold it; run gunicorn with --threads (make serve does)",
            None,
        )
    the_hub = hub()
    viewer = the_hub.subscribe(task_id)
    if viewer is None:
        return _refused(
            ErrorCode.TOO_MANY_VIEWERS,
            f"this server process streams to {the_hub.max_viewers} viewers already; try again "
            "shortly",
            5,
        )
    header, query = request.headers.get("Last-Event-ID"), request.GET.get("last_event_id")
    after = last_event_id(header, query)
    if from_now and not after:
        newest = TaskEvent.objects.filter(task_id=task_id).order_by("-id").values_list("id")[:1]
        after = newest[0][0] if newest else 0
    response = StreamingHttpResponse(
        _Stream(the_hub, viewer, sse_events(the_hub, viewer, after=after)),
        content_type="text/event-stream",
    )
    response["Cache-Control"] = "no-cache"
    response["X-Accel-Buffering"] = "no"  # nginx: pass each event on as it comes
    return response
