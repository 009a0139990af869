"""The worker: claim tasks, hold them with one heartbeat, run them as fibers, apply the outcome.

No broker: PostgreSQL is the queue. A dispatcher claims for the free places (several tasks in one
statement) and starts a fiber per claimed task (`core.fibers`): the runs share a few step threads
(`ACTHELM_STEP_THREADS`), and a run waiting for its model, a tool's request or an MCP server holds
no thread and no connection — the request is a task on the process's event loop. The dispatcher
takes only what the worker can carry: while the oldest ready run has waited longer than
`ACTHELM_CLAIM_MAX_LAG_SECONDS` for a step thread, or the loop runs that late, it claims nothing
(a busy worker slows, it never fails work), and the time a run spends ready but queued is not
counted against its runtime limit. One heartbeat renews every lease the process holds in one
statement, on a thread and connection of its own outside the pool, so that no run can make it
wait. One listener (`LISTEN`) wakes the dispatcher for new work and the heartbeat for a person's
action on a task that runs here. A maintenance thread runs `recover_stale()`, the reconciler
and what apps registered with it (`agents.engine.runtime.maintenance`: the schedules' tick); a
thread of its own delivers the notification outbox, so no receiver can delay recovery. A run
borrows a pooled connection only to read or write (`configure_pool`), its verdict included
(`agents.engine.verdict.supervisor`). The first SIGTERM/SIGINT stops claiming and lets every run
hand its task back at its next safe point; a second one exits at once (the leases then expire and
another worker recovers the tasks).
"""

import logging
import os
import signal
import socket
import threading
import time
from types import FrameType

import psycopg
from django.conf import settings
from django.db import DatabaseError
from django.db import connection as db

from agents.engine.run.loop import AgentLoop, RunSignals
from agents.engine.run.recorder import SavedState, load_starts
from agents.engine.runtime.heartbeat import CONNECTION_ERRORS, DB_ERRORS, Heartbeat, Running
from agents.engine.runtime.maintenance import run_maintenance
from agents.engine.runtime.reconciler import reconcile
from agents.engine.runtime.recovery import recover_stale
from agents.engine.runtime.seen import record_seen
from agents.engine.store import (
    Claim,
    claim_batch,
    claim_next,
    seconds_to_earliest_expiry,
)
from agents.engine.verdict.outcomes import Outcome, apply_outcome
from agents.engine.verdict.supervisor import supervise
from agents.engine.verdict.supervisor import uses_model as supervisor_uses_model
from agents.models import AgentRun
from agents.states import FailureCode
from core import fibers
from core.dbpool import release_connection
from core.dburl import listen_conninfo
from core.exceptions import AttemptLost
from tasks import live
from tasks.notify.delivery import deliver_in_maintenance
from tasks.transitions import READY_CHANNEL, SIGNAL_CHANNEL

log = logging.getLogger("acthelm.worker")

DELIVERY_INTERVAL_SECONDS = 1.0  # between delivery passes (a pass sends every row that is due)
_BEHIND_RECHECK_SECONDS = 0.1  # how soon a worker that is behind looks again


def step_threads() -> int:
    """ACTHELM_STEP_THREADS, or one per core, at most the database pool's size (each step
    thread borrows one connection at a time)."""
    if settings.ACTHELM_STEP_THREADS > 0:
        return settings.ACTHELM_STEP_THREADS
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    pool = settings.ACTHELM_DB_POOL_SIZE
    return max(1, min(cores or 1, pool) if pool > 0 else (cores or 1))


def storage_message(exc: Exception, loop: AgentLoop | None) -> str:
    """Why a step could not be stored, with what the model said in it (escaped and bounded),
    so that a person can read it on the failed run."""
    lines = [f"the database refused the run's step: {type(exc).__name__}: {exc}"[:2000]]
    for turn in getattr(getattr(loop, "step", None), "turns", []) or []:
        if turn.content:
            lines.append(f"[{turn.role}] {turn.content[:4000]}")
        for call in turn.calls:
            lines.append(f"[tool call {call.state.tool}] {call.state.arguments_raw[:2000]}")
    return "\n".join(lines)[:10_000]


def default_worker_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Worker:
    """`concurrency` runs at once, as fibers on a few step threads; one dispatcher claims for
    the free places (several ready tasks in one statement) while the worker keeps up, one
    heartbeat renews every lease, one listener hears new work and people's actions."""

    def __init__(
        self,
        *,
        worker_id: str | None = None,
        concurrency: int = 1,
        burst: bool = False,
        evaluation_only: bool = False,
    ):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.evaluation_only = evaluation_only  # claim evaluation tasks only (acthelm_eval)
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.burst = burst
        self.stopping = threading.Event()  # no more claims; runs hand back at a safe point
        self.halted = threading.Event()  # every run has ended: the helpers end too
        self._cond = threading.Condition()
        self._generation = 0
        self._running: dict[int, Running] = {}
        self.fibers = fibers.Fibers(step_threads(), name="step")
        self._lock = threading.Lock()
        self.heartbeat: Heartbeat | None = None
        self.processed = 0

    # -- signals -------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.stopping.is_set():
            log.warning("worker.exit_now", extra={"worker": self.worker_id})
            os._exit(1)
        log.info("worker.stopping", extra={"worker": self.worker_id, "signal": signum})
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            for r in self._running.values():
                r.signals.stop.set()
        self._wake()

    def _wake(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    def running_snapshot(self) -> dict[int, Running]:
        with self._lock:
            return dict(self._running)

    def is_running(self, run_id: int) -> bool:
        with self._lock:
            return run_id in self._running

    def signal(self, task_id: int) -> None:
        """A person acted on `task_id` (a NOTIFY): if it runs here, check it now."""
        if self.heartbeat is not None:
            self.heartbeat.poke(task_id)

    # -- main ----------------------------------------------------------------------------------

    def run(self) -> int:
        log.info(
            "worker.started",
            extra={"worker": self.worker_id, "concurrency": self.concurrency, "burst": self.burst},
        )
        self._start_heartbeat()
        helpers = [
            threading.Thread(target=self._listen, name="listen", daemon=True),
            threading.Thread(target=self._maintain, name="maintain", daemon=True),
            threading.Thread(target=self._deliver, name="deliver", daemon=True),
        ]
        for t in helpers:
            t.start()
        dispatcher = threading.Thread(target=self._dispatch, name="dispatch")
        dispatcher.start()
        while dispatcher.is_alive():
            dispatcher.join(0.2)  # keep the main thread responsive to signals
        self.stopping.set()
        self.halted.set()
        self._wake()
        if self.heartbeat is not None:
            self.heartbeat.poke(0)
        # A maintenance or delivery pass under way finishes before the worker says it stopped
        # (each is bounded, and waits between passes end at once): a worker run inside another
        # program (the tests, `--burst`) leaves no thread writing to the database behind it.
        deadline = time.monotonic() + settings.ACTHELM_NOTIFY_PASS_SECONDS + 10
        for t in helpers:
            if t.name != "listen":  # only its own LISTEN connection; it ends within a second
                t.join(max(0.0, deadline - time.monotonic()))
                if t.is_alive():
                    log.warning("worker.helper_still_running", extra={"thread": t.name})
        log.info(
            "worker.stopped",
            extra={
                "worker": self.worker_id,
                "processed": self.processed,
                "heartbeats": self.heartbeat.beats if self.heartbeat else 0,
            },
        )
        return 0

    def _start_heartbeat(self) -> bool:
        """Start the process heartbeat unless it runs; True when this call started it."""
        with self._lock:
            if self.heartbeat is not None:
                return False
            self.heartbeat = Heartbeat(self)
        self.heartbeat.start()
        return True

    def _dispatch(self) -> None:
        """Claim for the free places, start a thread per claimed task, wait for a free place or
        new work (a NOTIFY, a run ending, the poll interval). In burst mode, end when nothing is
        claimable and nothing runs (after one pass of recovery)."""
        idle_recovered = False
        try:
            while True:
                seen = self._generation
                with self._lock:
                    free = self.concurrency - len(self._running)
                    busy = bool(self._running)
                if self.stopping.is_set():
                    if not busy:
                        return
                    free = 0
                elif free > 0:
                    if self.behind():
                        # Busy: the runs it holds come first. Look again shortly.
                        self.stopping.wait(_BEHIND_RECHECK_SECONDS)
                        continue
                    free = self.can_take(free)
                    if not free:
                        # Enough runs ready: claim again as soon as the step threads have
                        # taken half of them (a fixed pause here paced the claims, not the CPU).
                        self.fibers.wait_ready_at_most(
                            settings.ACTHELM_CLAIM_BATCH // 2, _BEHIND_RECHECK_SECONDS
                        )
                        continue
                claims, starts = self._claim(free) if free > 0 else ([], {})
                for claim in claims:
                    self._start_run(claim, starts.get(claim.task_id))
                if claims:
                    idle_recovered = False
                    continue
                if self.burst and free > 0 and not busy:
                    if idle_recovered:
                        return
                    self._recover_once()
                    idle_recovered = True
                    continue
                with self._cond:
                    if self._generation == seen:
                        self._cond.wait(settings.ACTHELM_POLL_SECONDS)
        finally:
            self._join_runs()
            db.close()

    def _claim(self, free: int) -> tuple[list[Claim], dict[int, SavedState]]:
        """The claimed tasks, and the saved state of those that start afresh, read on the
        claim's connection in one statement (`load_starts`); the others read their own."""
        try:
            claims = claim_batch(
                worker_id=self.worker_id,
                limit=min(free, settings.ACTHELM_CLAIM_BATCH),
                evaluation_only=self.evaluation_only,
            )
        except DB_ERRORS:
            log.exception("worker.claim_failed", extra={"worker": self.worker_id})
            db.close()
            release_connection()
            self.stopping.wait(1.0)
            return [], {}
        except Exception:  # nothing may end the dispatcher
            log.exception("worker.claim_error", extra={"worker": self.worker_id})
            release_connection()
            self.stopping.wait(1.0)
            return [], {}
        try:
            # The claims are committed: whatever happens here, their runs start (and read their
            # state themselves when it could not be read for them).
            return claims, load_starts([(c.task_id, c.run_id) for c in claims])
        except DB_ERRORS:
            log.exception("worker.load_failed", extra={"worker": self.worker_id})
            db.close()
        except Exception:
            log.exception("worker.load_error", extra={"worker": self.worker_id})
        finally:
            release_connection()
        return claims, {}

    def behind(self) -> bool:
        """The worker is not keeping up with the runs it holds: the oldest ready run has waited
        longer than ACTHELM_CLAIM_MAX_LAG_SECONDS for a step thread, or the event loop runs its
        callbacks that late. It claims nothing then."""
        limit = settings.ACTHELM_CLAIM_MAX_LAG_SECONDS
        return self.fibers.lag() > limit or fibers.loop_lag() > limit

    def can_take(self, free: int) -> int:
        """How many of the `free` places to claim for now (when not `behind`): none while more
        than half of ACTHELM_CLAIM_BATCH runs are ready, else no more than keeps
        ACTHELM_CLAIM_BATCH runs ready (new runs start as fast as the step threads take them,
        not faster)."""
        ready = self.fibers.waiting()
        if ready > settings.ACTHELM_CLAIM_BATCH // 2:
            return 0
        return max(0, min(free, settings.ACTHELM_CLAIM_BATCH - ready))

    def _start_run(self, claim: Claim, saved: SavedState | None = None) -> None:
        # Listed (and so heartbeaten) from the claim on, also while it waits for a step thread.
        signals = RunSignals()
        if self.stopping.is_set():
            signals.stop.set()
        with self._lock:
            self._running[claim.run_id] = Running(claim, signals)
        self.fibers.spawn(self._run_fiber, claim, saved, signals)

    def _run_fiber(self, claim: Claim, saved: SavedState | None, signals: RunSignals) -> None:
        try:
            self.process(claim, saved, signals=signals)
        except Exception:  # nothing may end the worker
            log.exception("worker.process_error", extra={"task_id": claim.task_id})
        finally:
            db.close()
            self._wake()

    def _join_runs(self) -> None:
        self.fibers.join()
        self.fibers.close()

    def drain(self) -> int:
        """Claim and run tasks one at a time in THIS thread until nothing is claimable (what a
        burst worker of concurrency 1 does, without its threads): for the benchmarks' measuring
        process, which must see every statement on its own thread's connection."""
        while (
            claim := claim_next(worker_id=self.worker_id, evaluation_only=self.evaluation_only)
        ) is not None:
            self.process(claim)
        return self.processed

    def process(
        self,
        claim: Claim,
        saved: SavedState | None = None,
        *,
        signals: RunSignals | None = None,
    ) -> str | None:
        """Run one claimed task to an outcome and record it with the run's last step (`saved`:
        its state as read with the claim, else the run reads it)."""
        if signals is None:
            signals = RunSignals()
        if self.stopping.is_set():
            signals.stop.set()
        # Outside `run` (a test, a benchmark's measuring thread), the run has a heartbeat of its
        # own for as long as it runs.
        own_heartbeat = self._start_heartbeat()
        with self._lock:
            self._running[claim.run_id] = Running(claim, signals)
        status = loop = None
        try:
            loop = AgentLoop(
                task_id=claim.task_id,
                run_id=claim.run_id,
                worker_id=self.worker_id,
                signals=signals,
                saved=saved,
            )
            outcome = loop.run()
            if outcome.kind == Outcome.LOST:
                self._log_lost(claim)
                return None
            verdict = None
            if outcome.kind == Outcome.FINAL:
                if supervisor_uses_model():
                    loop.commit()  # the answer is stored before a slow supervisor call
                # The verdict reads what it needs, then gives the connection back before its
                # checks and its model request; a cancel or a lost lease aborts it.
                verdict = supervise(
                    loop.task,
                    outcome.answer,
                    usage=loop.usage(),
                    open_operations=bool(loop.open_operations()),
                    cancel=signals.cancel,
                    no_calls=loop.no_calls(),
                )
            signals.ending.set()
            status = loop.finish(outcome, verdict)
            log.info(
                "run.finished",
                extra={
                    "task_id": claim.task_id,
                    "run_id": claim.run_id,
                    "outcome": str(outcome.kind),
                    "code": outcome.code,
                    "status": status,
                },
            )
        except AttemptLost:
            self._log_lost(claim)
        except CONNECTION_ERRORS:
            # The database went away mid-run: reconnect and hand the task back, rather than let
            # the lease expire (which recovery would count as a lost worker).
            log.exception("run.db_error", extra={"task_id": claim.task_id})
            signals.ending.set()
            status = self._hand_back(claim)
        except DatabaseError as exc:
            # The database refused what the run tried to store (a data, integrity or programming
            # error): the same step would be refused again, so this is a failed attempt — it
            # counts, and the attempts' limit ends it — never a hand-back.
            log.exception("run.storage_rejected", extra={"task_id": claim.task_id})
            signals.ending.set()
            status = self._fail_attempt(
                claim, FailureCode.STORAGE_REJECTED, storage_message(exc, loop), retryable=True
            )
        except Exception as exc:  # a bug must not kill the worker; the run fails visibly
            log.exception("run.crashed", extra={"task_id": claim.task_id})
            signals.ending.set()
            status = self._fail_attempt(
                claim, FailureCode.INTERNAL_ERROR, f"{type(exc).__name__}: {exc}", retryable=True
            )
        finally:
            with self._lock:
                self._running.pop(claim.run_id, None)
                self.processed += 1
                heartbeat = self.heartbeat
                if own_heartbeat:
                    self.heartbeat = None
            if own_heartbeat:
                assert heartbeat is not None  # this run started it; only this run ends it
                heartbeat.end()
                heartbeat.join(5)
            release_connection()
        return status

    def _log_lost(self, claim: Claim) -> None:
        """A run that lost its task says why: a person's cancel, or fenced out (recovered,
        reset, deleted)."""
        try:
            status = AgentRun.objects.filter(pk=claim.run_id).values_list("error_code", flat=True)
            code = status.first()
        except DB_ERRORS:
            db.close()
            code = None
        finally:
            release_connection()
        event = "run.cancelled" if code == FailureCode.CANCELLED else "run.fenced_out"
        log.warning(event, extra={"task_id": claim.task_id, "run_id": claim.run_id})

    def _fail_attempt(
        self, claim: Claim, code: str, message: str, *, retryable: bool
    ) -> str | None:
        """Record a failed attempt after the run's own write failed (nothing of its last step
        was stored). None when that cannot be recorded either: the lease then expires and
        recovery, which counts lost runs, takes the task."""
        try:
            return apply_outcome(
                task_id=claim.task_id,
                run_id=claim.run_id,
                worker_id=self.worker_id,
                outcome=Outcome(Outcome.FAILED, code=code, message=message, retryable=retryable),
            )
        except (AttemptLost, *DB_ERRORS):
            log.exception("run.failure_not_recorded", extra={"task_id": claim.task_id})
            db.close()
            return None

    def _hand_back(self, claim: Claim) -> str | None:
        """After a database error: reconnect and hand the task back (retried while the lease
        lasts); whatever the run recorded before stays, and the next run resumes from it."""
        deadline = time.monotonic() + settings.ACTHELM_LEASE_SECONDS
        delay = 0.1
        while True:
            db.close()
            try:
                return apply_outcome(
                    task_id=claim.task_id,
                    run_id=claim.run_id,
                    worker_id=self.worker_id,
                    outcome=Outcome(Outcome.HANDED_BACK, message="database connection lost"),
                )
            except AttemptLost:
                return None
            except DB_ERRORS:
                if time.monotonic() + delay > deadline:
                    log.exception("run.hand_back_failed", extra={"task_id": claim.task_id})
                    db.close()
                    return None
                fibers.sleep(delay)
                delay = min(delay * 2, 1.0)

    # -- helpers -------------------------------------------------------------------------------

    def _recover_once(self) -> None:
        try:
            recovered = recover_stale()
            if recovered:
                log.info("worker.recovered", extra={"tasks": recovered})
        except DB_ERRORS:
            log.exception("worker.recover_failed")
            db.close()
        except Exception:  # recovery must keep running for the other workers' tasks
            log.exception("worker.recover_error")

    def _maintain(self) -> None:
        """Recovery and reconciliation. Recovery runs when the earliest lease among held tasks
        expires (so a dead worker's task resumes within about one lease), and at least every
        ACTHELM_RECOVER_INTERVAL_SECONDS for runs that overran their timeout."""
        next_recover = next_reconcile = 0.0
        while not self.stopping.is_set():
            record_seen(self.worker_id)  # the Workers page lists idle workers too; never raises
            now = time.monotonic()
            if now >= next_reconcile:
                self._reconcile_once()
                run_maintenance()  # what apps registered (the schedules' tick); never raises
                next_reconcile = now + settings.ACTHELM_RECONCILE_INTERVAL_SECONDS
            expiry = self._seconds_to_earliest_expiry()
            if now >= next_recover or (expiry is not None and expiry <= 0):
                self._recover_once()
                next_recover = now + settings.ACTHELM_RECOVER_INTERVAL_SECONDS
                expiry = None
            wake = min(next_recover, next_reconcile)
            if expiry is not None:
                wake = min(wake, now + expiry + 0.05)
            release_connection()
            self.stopping.wait(min(max(0.2, wake - time.monotonic()), 5.0))
        db.close()

    def _deliver(self) -> None:
        """The notification outbox, in a thread of its own: a slow or hostile receiver holds at
        most this thread (one send's deadline at a time), never recovery or reconciliation."""
        while not self.stopping.is_set():
            deliver_in_maintenance()  # bounded, never raises: see tasks/notify/delivery.py
            release_connection()
            self.stopping.wait(DELIVERY_INTERVAL_SECONDS)
        db.close()

    def _seconds_to_earliest_expiry(self) -> float | None:
        """Seconds until the earliest lease of a held task expires, by the database's clock."""
        try:
            return seconds_to_earliest_expiry()
        except DB_ERRORS:
            db.close()
            return None
        except Exception:  # the maintenance thread must not end
            log.exception("worker.expiry_error")
            return None

    def _reconcile_once(self) -> None:
        try:
            reconcile()
        except DB_ERRORS:
            log.exception("worker.reconcile_failed")
            db.close()
        except Exception:
            log.exception("worker.reconcile_error")

    def _listen(self) -> None:
        """LISTEN on its own connection (outside the pool): new work wakes the dispatcher; a
        person's action on a task that runs here makes the heartbeat check it at once; a web
        process's announcement that someone watches a task makes its runs publish their turns."""
        while not self.halted.is_set():
            try:
                # ACTHELM_LISTEN_DATABASE_URL, or the default database: every option of it
                # (sslmode, options, …); behind a transaction pooler, PostgreSQL itself.
                conninfo = listen_conninfo(
                    settings.ACTHELM_LISTEN_DATABASE_URL,
                    db.settings_dict,
                    application_name=f"acthelm-listen {self.worker_id}"[:63],
                )
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {READY_CHANNEL}")
                    conn.execute(f"LISTEN {SIGNAL_CHANNEL}")
                    conn.execute(f"LISTEN {live.WATCH_CHANNEL}")
                    self._wake()  # anything that became ready while we were not listening
                    if self.heartbeat is not None:
                        self.heartbeat.poke(0)  # and any action missed meanwhile
                    while not self.halted.is_set():
                        for note in conn.notifies(timeout=1.0, stop_after=100):
                            if note.channel == SIGNAL_CHANNEL:
                                if note.payload.isdigit():
                                    self.signal(int(note.payload))
                            elif note.channel == live.WATCH_CHANNEL:
                                # Someone watches a task: its runs here publish their turns
                                # (never a wake for the dispatcher).
                                live.watch_announced(note.payload)
                            else:
                                self._wake()
            except psycopg.Error:
                log.warning("worker.listen_reconnect", extra={"worker": self.worker_id})
                self.halted.wait(1.0)
