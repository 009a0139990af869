"""core.fibers: runs as greenlets on a few step threads, their waits as tasks on one loop.

What the worker relies on: a waiting fiber holds no thread; the fibers of one thread take turns
only where they wait, never inside a transaction; time ready but queued is counted, so that a
run can leave it out of its runtime; the pool's lag says when the worker is behind."""

import asyncio
import threading
import time

import pytest
from django.db import connection, transaction

from core import fibers


@pytest.fixture
def pool():
    pool = fibers.Fibers(1, name="test-step")
    yield pool
    pool.close()


def test_a_thousand_waiting_fibers_hold_no_thread_of_their_own(pool):
    """1,000 fibers waiting on the loop at once: the process has no more threads than before
    they started, and each gets its own result back."""
    loop = fibers.io_loop()
    pool.start()
    before = threading.active_count()
    results: list[int] = []

    async def new_gate() -> asyncio.Event:
        return asyncio.Event()

    gate = fibers.wait(new_gate())

    async def hold(n: int) -> int:
        await gate.wait()
        return n

    for n in range(1000):
        pool.spawn(lambda n=n: results.append(fibers.wait(hold(n))))
    deadline = time.monotonic() + 30
    while pool.lag() > 0 and time.monotonic() < deadline:  # every fiber has started and waits
        time.sleep(0.05)
    assert pool.live == 1000
    assert threading.active_count() <= before  # no thread per waiting fiber
    loop.call_soon_threadsafe(gate.set)
    assert pool.join(30)
    assert sorted(results) == list(range(1000))


def test_an_error_in_the_coroutine_is_raised_in_the_fiber(pool):
    seen: list[BaseException] = []

    async def fail() -> None:
        raise ValueError("from the loop")

    def run() -> None:
        try:
            fibers.wait(fail())
        except ValueError as exc:
            seen.append(exc)

    pool.spawn(run)
    assert pool.join(10)
    assert [str(e) for e in seen] == ["from the loop"]


def test_a_task_cancelled_on_the_loop_is_a_cancel_in_the_fiber(pool):
    """The fiber waits for its task itself: a task cancelled on the loop (what a cancel event
    does to a request) ends the wait with CancelledError, and the fiber lets the task go."""
    loop = fibers.io_loop()
    tasks: list[asyncio.Task] = []
    seen: list[str] = []

    async def hold() -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.append(task)
        await asyncio.sleep(30)

    def run() -> None:
        try:
            fibers.wait(hold())
        except asyncio.CancelledError:
            fiber = fibers.current()
            seen.append("cancelled" if fiber is not None and fiber.task is None else "kept")

    pool.spawn(run)
    deadline = time.monotonic() + 10
    while not tasks and time.monotonic() < deadline:
        time.sleep(0.01)
    loop.call_soon_threadsafe(tasks[0].cancel)
    assert pool.join(10)
    assert seen == ["cancelled"]


def test_outside_a_fiber_wait_blocks_the_calling_thread():
    async def answer() -> int:
        await asyncio.sleep(0.01)
        return 42

    assert fibers.current() is None
    assert fibers.wait(answer()) == 42


@pytest.mark.django_db(transaction=True)
def test_a_fiber_never_steps_aside_inside_a_transaction(pool):
    """The fibers of a thread share its connection: one that waits inside a transaction keeps
    its thread (the wait blocks), so no other fiber runs a statement inside that transaction."""
    order: list[str] = []

    def in_transaction() -> None:
        with transaction.atomic():
            order.append("a: begin")
            fibers.sleep(0.2)  # inside the transaction: blocks, does not switch
            order.append("a: commit")
        connection.close()

    def other() -> None:
        order.append("b: runs")
        fibers.sleep(0)

    pool.spawn(in_transaction)
    pool.spawn(other)
    assert pool.join(10)
    assert order == ["a: begin", "a: commit", "b: runs"]


def test_outside_a_transaction_the_fibers_of_a_thread_take_turns_at_their_waits(pool):
    order: list[str] = []

    def run(name: str) -> None:
        order.append(f"{name}: before")
        fibers.sleep(0.05)
        order.append(f"{name}: after")

    pool.spawn(run, "a")
    pool.spawn(run, "b")
    assert pool.join(10)
    assert order[:2] == ["a: before", "b: before"]
    assert sorted(order[2:]) == ["a: after", "b: after"]


def test_time_ready_but_queued_behind_a_busy_fiber_is_counted(pool):
    """A fiber kept from its thread by another one's CPU work counts that time as queued (a run
    leaves it out of its runtime), and the pool's lag shows it while it lasts."""
    queued: dict[str, float] = {}
    lags: list[float] = []

    def busy() -> None:
        end = time.monotonic() + 0.5
        while time.monotonic() < end:
            pass
        queued["busy"] = fibers.queued_seconds()

    def patient() -> None:
        queued["patient"] = fibers.queued_seconds()

    pool.spawn(busy)
    pool.spawn(patient)
    time.sleep(0.3)
    lags.append(pool.lag())
    assert pool.join(10)
    assert queued["patient"] >= 0.4  # it was ready from the start, and ran after busy's 0.5 s
    assert queued["busy"] < queued["patient"]
    assert lags[0] >= 0.2
    assert pool.lag() == 0
    assert fibers.queued_seconds() == 0  # outside a fiber


def test_blocking_work_runs_off_the_step_thread(pool):
    """`blocking` hands a blocking call to the blocking pool: the fiber's step thread runs the
    other fibers meanwhile."""
    order: list[str] = []
    started = threading.Event()

    def slow() -> str:
        started.set()
        time.sleep(0.3)
        return "done"

    def first() -> None:
        order.append(fibers.blocking(slow))

    def second() -> None:
        started.wait(5)
        order.append("second ran meanwhile")

    pool.spawn(first)
    pool.spawn(second)
    assert pool.join(10)
    assert order == ["second ran meanwhile", "done"]


def test_a_waiter_is_woken_once_the_step_threads_have_taken_enough_ready_fibers(pool):
    """The dispatcher's wait for room: it returns as soon as few enough fibers are ready, not
    after a fixed pause, and not before."""
    gate = threading.Event()
    ran: list[int] = []

    def step(n: int) -> None:
        if n == 0:
            gate.wait(10)  # holds the one step thread: the other nine stay ready
        ran.append(n)

    for n in range(10):
        pool.spawn(step, n)
    time.sleep(0.2)
    assert pool.waiting() == 9
    assert pool.wait_ready_at_most(3, 0.2) is False  # nothing was taken: it timed out
    gate.set()
    assert pool.wait_ready_at_most(3, 10) is True
    assert pool.waiting() <= 3
    assert pool.join(10)
    assert sorted(ran) == list(range(10))
    assert pool.wait_ready_at_most(0, 0.01) is True


def test_an_event_is_a_threading_event_that_wakes_its_waiters():
    """`fibers.Event` (a run's signals) makes its Condition only when a thread blocks on it,
    and behaves as `threading.Event` does: set before or while threads wait, cleared, timed out."""
    event = fibers.Event()
    assert isinstance(event, threading.Event)
    assert not event.is_set() and event.wait(0.01) is False
    event.set()
    assert event.is_set() and event.wait() is True and event.wait(0) is True
    event.clear()
    assert not event.is_set() and event.wait(0.01) is False
    for _ in range(50):  # set while many threads are about to wait, or already wait
        event = fibers.Event()
        woken: list[bool] = []
        threads = [
            threading.Thread(target=lambda e=event, w=woken: w.append(e.wait(10))) for _ in range(8)
        ]
        for t in threads:
            t.start()
        event.set()
        for t in threads:
            t.join(15)
        assert woken == [True] * 8


def test_an_event_never_waited_on_holds_no_lock():
    """What a waiting run keeps of its signals: the flag, no Condition until a thread waits."""
    event = fibers.Event()
    event.set()
    event.clear()
    assert event._cond is None
    assert event.wait(0.001) is False
    assert isinstance(event._cond, threading.Condition)
