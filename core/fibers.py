"""Many runs on a few threads: a run that waits for the network holds no thread.

A worker process has one event loop (`io_loop`, in a daemon thread of its own) that owns every
request in flight, and a few step threads (`Fibers`) that run the runs as greenlets. A run that
must wait calls `wait(coroutine)`: the coroutine goes to the loop, the run gives its database
connection back to the pool, and its greenlet switches back to its step thread, which runs the
next run that is ready. When the coroutine ends, the run is ready again and its thread switches
back into it. A waiting run is its greenlet's saved frames and its request's coroutine: no OS
thread, no database connection.

Greenlets take turns: a run is switched out only inside `wait` (and `sleep`, `wait_event`,
`blocking`), never inside a transaction, so the runs of one step thread share its database
connection one after another. Outside a fiber (the web process, a command, a test, the
benchmarks' measuring thread) the same calls block the calling thread, as a plain call would.

A run's signals (cancel, stop, pause) are `Event`s: a `threading.Event` whose lock and waiter
queue are made only when a thread first blocks on it — a run only looks at its signals, and
thousands wait at once.

What the worker reads to take only what it can carry (`Fibers.lag`, `loop_lag`): how long the
oldest ready run has waited for its step thread, and how late the loop runs its callbacks.
What a run reads to leave that queueing out of its runtime: `queued_seconds`.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextvars
import functools
import logging
import threading
import time
from collections.abc import Callable, Coroutine
from typing import Any

import greenlet
from django.db import connection

from core.dbpool import release_connection

log = logging.getLogger("acthelm.fibers")

#: Threads that run blocking calls handed over by `blocking` (a tool's file or CSV work, a
#: fetch); a run waiting for one holds no step thread.
BLOCKING_THREADS = 16
#: How often the loop measures its own lateness (`loop_lag`).
_LAG_PROBE_SECONDS = 0.02
#: While the loop runs later than this, a step thread lets it run before the next fiber (at
#: most `_YIELD_MAX_SECONDS` at a time): the requests in flight come first, a step's CPU second.
_LOOP_FIRST_SECONDS = 0.01
_YIELD_MAX_SECONDS = 0.05

_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()
_blocking_pool: concurrent.futures.ThreadPoolExecutor | None = None
_lag = 0.0
_probed_at = 0.0  # when the last probe ran (time.monotonic)


# -- the process's event loop ------------------------------------------------------------------


def io_loop() -> asyncio.AbstractEventLoop:
    """The process's event loop, started on first use in a daemon thread of its own."""
    global _loop, _blocking_pool
    loop = _loop
    if loop is not None:
        return loop
    with _loop_lock:
        if _loop is None:
            started = threading.Event()
            new = asyncio.new_event_loop()
            _blocking_pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=BLOCKING_THREADS, thread_name_prefix="acthelm-blocking"
            )

            def main() -> None:
                asyncio.set_event_loop(new)
                new.call_soon(started.set)
                new.call_soon(_probe_lag, new, time.monotonic())
                new.run_forever()

            threading.Thread(target=main, name="acthelm-io", daemon=True).start()
            started.wait()
            _loop = new
        return _loop


def _probe_lag(loop: asyncio.AbstractEventLoop, due: float) -> None:
    """How late this callback runs against when it was due: the loop's lag (kept as the larger
    of the last reading and a decaying memory of the earlier ones, so that one quiet probe does
    not hide a busy second)."""
    global _lag, _probed_at
    now = time.monotonic()
    _lag = max(now - due, _lag * 0.95)
    _probed_at = now
    loop.call_later(_LAG_PROBE_SECONDS, _probe_lag, loop, now + _LAG_PROBE_SECONDS)


def loop_lag() -> float:
    """Seconds the process's event loop runs late (0 before it started): the larger of what
    its probes measured lately and how overdue the next probe is."""
    if _loop is None:
        return 0.0
    return max(_lag, time.monotonic() - _probed_at - _LAG_PROBE_SECONDS)


def _loop_first() -> None:
    """Let the loop run while it is late (a step thread, before its next fiber): sleeping gives
    it the GIL."""
    if _loop is None:
        return
    end = time.monotonic() + _YIELD_MAX_SECONDS
    while time.monotonic() - _probed_at - _LAG_PROBE_SECONDS > _LOOP_FIRST_SECONDS:
        if time.monotonic() >= end:
            return
        time.sleep(0.001)


def submit[R](coro: Coroutine[Any, Any, R]) -> concurrent.futures.Future[R]:
    """Run `coro` as a task on the process's loop, in the caller's context (its telemetry span,
    …); the future is its outcome. Cancelling the future cancels the task."""
    loop = io_loop()
    ctx = contextvars.copy_context()
    future: concurrent.futures.Future[R] = concurrent.futures.Future()

    def start() -> None:
        if not future.set_running_or_notify_cancel():
            coro.close()
            return
        task = loop.create_task(coro, context=ctx)
        task.add_done_callback(functools.partial(_settle, future))
        future.add_done_callback(lambda f: f.cancelled() and loop.call_soon_threadsafe(task.cancel))

    loop.call_soon_threadsafe(start)
    return future


def _settle[R](future: concurrent.futures.Future[R], task: asyncio.Task[R]) -> None:
    if future.done():
        return
    if task.cancelled():
        future.set_exception(asyncio.CancelledError())
    elif (exc := task.exception()) is not None:
        future.set_exception(exc)
    else:
        future.set_result(task.result())


# -- events ------------------------------------------------------------------------------------

_EVENT_LOCK = threading.Lock()  # makes an Event's Condition once


class Event(threading.Event):
    """A `threading.Event` that makes its Condition (a lock and a queue of waiters, ~1 KB) only
    when a thread first blocks in `wait`: a run holds a few events for its whole life and looks
    at them (`is_set`, `fibers.wait_event`) far more often than a thread waits on one.

    `set` writes the flag before it looks for a Condition, and `wait` makes the Condition before
    it reads the flag under it: a waiter either sees the flag or is woken by `notify_all`."""

    def __init__(self) -> None:  # no super().__init__(): that makes the Condition
        self._flag = False
        self._cond: threading.Condition | None = None

    def _condition(self) -> threading.Condition:
        cond = self._cond
        if cond is None:
            with _EVENT_LOCK:
                cond = self._cond
                if cond is None:
                    cond = self._cond = threading.Condition(threading.Lock())
        return cond

    def _at_fork_reinit(self) -> None:
        if self._cond is not None:
            self._cond._at_fork_reinit()  # type: ignore[attr-defined]  # private, as the base's

    def is_set(self) -> bool:
        return self._flag

    def set(self) -> None:
        self._flag = True
        cond = self._cond
        if cond is not None:
            with cond:
                cond.notify_all()

    def clear(self) -> None:
        cond = self._cond
        if cond is None:
            self._flag = False
            return
        with cond:
            self._flag = False

    def wait(self, timeout: float | None = None) -> bool:
        if self._flag:
            return True
        cond = self._condition()
        with cond:
            signaled: bool = self._flag
            if not signaled:
                signaled = cond.wait(timeout)
            return signaled


# -- waiting -----------------------------------------------------------------------------------


def wait[R](coro: Coroutine[Any, Any, R]) -> R:
    """The coroutine's result, computed on the process's loop. In a fiber, the fiber gives its
    connection back and steps aside until then; elsewhere the calling thread blocks."""
    if _running_loop() is not None:
        # Called by async code through a sync API: a private loop in a helper thread, so that
        # this never blocks the loop it was called from.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(asyncio.run, coro).result()
    fiber = current()
    if fiber is None or connection.in_atomic_block:
        # Never step aside inside a transaction: the thread's other runs share its connection.
        return submit(coro).result()
    # Step aside until the task ends: it makes the fiber ready itself (`Fiber.start`), no future
    # of another kind in between. Done here, not in a helper: while a fiber waits, each of its
    # frames is kept as a frame object (greenlet exposes them), one more per helper.
    loop = io_loop()
    release_connection()
    loop.call_soon_threadsafe(fiber.start, loop, coro, contextvars.copy_context())
    fiber.thread.hub.switch()
    task, fiber.task = fiber.task, None
    assert task is not None and task.done()  # only its end makes the fiber ready
    result: R = task.result()
    return result


def sleep(seconds: float) -> None:
    """`time.sleep`, holding no thread in a fiber."""
    if current() is None:
        time.sleep(seconds)
    else:
        wait(asyncio.sleep(seconds))


def wait_event(event: threading.Event, timeout: float) -> bool:
    """`event.wait(timeout)`, holding no thread in a fiber (it looks at the event at growing
    intervals, from 2 ms to 100 ms: what waits this way — a verdict's checks, an MCP call's
    watch — ends in milliseconds or is bounded by its own deadline)."""
    if current() is None:
        return event.wait(timeout)
    end = time.monotonic() + timeout
    delay = 0.002
    while not event.is_set():
        left = end - time.monotonic()
        if left <= 0:
            return False
        sleep(min(delay, left))
        delay = min(delay * 2, 0.1)
    return True


def blocking[R](fn: Callable[..., R], *args: Any) -> R:
    """`fn(*args)` on a thread of the blocking pool (in the caller's context), the fiber
    stepping aside meanwhile; outside a fiber, called here. For work that blocks on something
    other than the loop (files, a parser, a library's own socket)."""
    fiber = current()
    if fiber is None:
        return fn(*args)
    ctx = contextvars.copy_context()
    submitted = time.monotonic()
    started: list[float] = []

    def call() -> R:
        started.append(time.monotonic())
        try:
            return ctx.run(fn, *args)
        finally:
            release_connection()

    async def offload() -> R:
        assert _blocking_pool is not None  # created with the loop
        return await asyncio.get_running_loop().run_in_executor(_blocking_pool, call)

    try:
        return wait(offload())
    finally:
        if started:  # time waiting for a thread of the pool is queueing too
            fiber.queued += started[0] - submitted


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


# -- fibers ------------------------------------------------------------------------------------


class _Greenlet(greenlet.greenlet):  # type: ignore[misc]  # greenlet ships no stubs
    __slots__ = ("fiber",)  # no instance dict
    fiber: Fiber


class Fiber:
    """One run on a step thread: its greenlet, and the time it spent ready but not running."""

    __slots__ = ("args", "fn", "glet", "queued", "ready_since", "task", "thread")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], thread: _StepThread):
        self.fn, self.args, self.thread = fn, args, thread
        self.glet: _Greenlet | None = None
        self.queued = 0.0
        self.ready_since = 0.0
        self.task: asyncio.Task[Any] | None = None  # what the fiber waits for

    def main(self) -> None:
        try:
            self.fn(*self.args)
        except BaseException:  # noqa: BLE001 - a fiber's error must not end its thread
            log.exception("fiber.error")

    def start(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Coroutine[Any, Any, Any],
        ctx: contextvars.Context,
    ) -> None:  # on the loop
        """Run `coro` as the task this fiber waits for (`wait`), in the fiber's context."""
        self.task = loop.create_task(coro, context=ctx)
        self.task.add_done_callback(self._ended)

    def _ended(self, _task: asyncio.Task[Any]) -> None:  # on the loop
        self.thread.ready(self)


def current() -> Fiber | None:
    """The fiber this code runs in, if any."""
    glet = greenlet.getcurrent()
    return glet.fiber if isinstance(glet, _Greenlet) else None


def queued_seconds() -> float:
    """The seconds the current fiber spent ready but waiting for its step thread (0 outside a
    fiber): time a run lost to a busy worker, not time it ran."""
    fiber = current()
    return fiber.queued if fiber is not None else 0.0


class _StepThread(threading.Thread):
    """Runs its ready fibers one at a time, each until it steps aside or ends."""

    def __init__(self, pool: Fibers, index: int):
        super().__init__(name=f"{pool.name}-{index}", daemon=True)
        self.pool = pool
        self.cond = threading.Condition()
        self.queue: collections.deque[Fiber] = collections.deque()
        self.live = 0  # fibers of this thread that have not ended
        self.hub: Any = None  # the thread's own greenlet, set when it runs

    def ready(self, fiber: Fiber) -> None:
        fiber.ready_since = time.monotonic()
        with self.cond:
            self.queue.append(fiber)
            self.cond.notify()

    def waiting(self) -> int:
        with self.cond:
            return len(self.queue)

    def oldest_wait(self, now: float) -> float:
        with self.cond:
            return now - self.queue[0].ready_since if self.queue else 0.0

    def run(self) -> None:
        self.hub = greenlet.getcurrent()
        while True:
            with self.cond:
                while not self.queue:
                    if self.pool.closing and not self.live:
                        return
                    self.cond.wait(0.5)
                fiber = self.queue.popleft()
            self.pool.taken()
            _loop_first()
            fiber.queued += time.monotonic() - fiber.ready_since
            if fiber.glet is None:
                fiber.glet = _Greenlet(run=fiber.main, parent=self.hub)
                fiber.glet.fiber = fiber
            fiber.glet.switch()
            if fiber.glet.dead:
                release_connection()
                with self.cond:
                    self.live -= 1
                self.pool.ended()


class Fibers:
    """`threads` step threads running fibers; `spawn` puts one on the least busy thread."""

    def __init__(self, threads: int, *, name: str = "step"):
        if threads < 1:
            raise ValueError("a fiber pool needs at least one thread")
        self.name = name
        self.closing = False
        self._threads = [_StepThread(self, i) for i in range(threads)]
        self._idle = threading.Condition()
        self._drain = threading.Condition()
        self._low_water = -1  # while >= 0, a waiter wants to know when waiting() drops to it
        self._started = False

    def start(self) -> None:
        if not self._started:
            self._started = True
            for thread in self._threads:
                thread.start()

    def spawn(self, fn: Callable[..., Any], *args: Any) -> None:
        self.start()
        thread = min(self._threads, key=lambda t: t.live)
        with thread.cond:
            thread.live += 1
        thread.ready(Fiber(fn, args, thread))

    @property
    def live(self) -> int:
        return sum(t.live for t in self._threads)

    def waiting(self) -> int:
        """Fibers ready to run and waiting for their thread."""
        return sum(t.waiting() for t in self._threads)

    def wait_ready_at_most(self, count: int, timeout: float) -> bool:
        """Block until at most `count` fibers are ready and waiting for their thread, or
        `timeout` passed; True when so. One waiter at a time (the dispatcher)."""
        with self._drain:
            self._low_water = count
            try:
                return self.waiting() <= count or (
                    self._drain.wait(timeout) and self.waiting() <= count
                )
            finally:
                self._low_water = -1

    def taken(self) -> None:
        """A step thread took a ready fiber: wake the waiter once few enough are left."""
        if self._low_water >= 0 and self.waiting() <= self._low_water:
            with self._drain:
                self._drain.notify_all()

    def lag(self) -> float:
        """Seconds the oldest ready fiber has waited for its thread."""
        now = time.monotonic()
        return max(t.oldest_wait(now) for t in self._threads)

    def ended(self) -> None:
        with self._idle:
            self._idle.notify_all()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until every fiber has ended; True when none is left."""
        end = None if timeout is None else time.monotonic() + timeout
        with self._idle:
            while self.live:
                left = None if end is None else end - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._idle.wait(0.2 if left is None else min(left, 0.2))
        return True

    def close(self) -> None:
        """No more fibers: the threads end once theirs have."""
        self.closing = True
        for thread in self._threads:
            with thread.cond:
                thread.cond.notify()
