"""The worker: claim a task, hold it with a heartbeat, run the loop, apply the outcome. Repeat.

Slots (threads, `--concurrency N`) claim from PostgreSQL directly: no broker. Idle slots sleep on
`LISTEN acthelm_ready` (the transitions that make a task ready NOTIFY on commit), with a polling
fallback. A maintenance thread runs `recover_stale()` (and the reconciler, when present). The
first SIGTERM/SIGINT stops claiming and lets every run hand its task back at its next safe point;
a second one exits at once (the leases then expire and another worker recovers the tasks).
"""

import logging
import os
import signal
import socket
import threading
import time

import psycopg
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError
from django.db import connection as db
from psycopg.conninfo import make_conninfo

from agents.leases import Claim, claim_next, renew_lease
from agents.loop import AgentLoop, RunSignals
from agents.outcomes import Outcome, apply_outcome, recover_stale
from agents.reconciler import reconcile
from agents.supervisor import supervise
from agents.supervisor import uses_model as supervisor_uses_model
from tasks.exceptions import AttemptLost
from tasks.notify.delivery import deliver_in_maintenance
from tasks.states import TaskStatus
from tasks.transitions import READY_CHANNEL

log = logging.getLogger("acthelm.worker")

# Only these mean "the database went away": the task is handed back (not an attempt). Any other
# DatabaseError is the database refusing what was written, which fails the attempt.
CONNECTION_ERRORS = (OperationalError, InterfaceError)
DB_ERRORS = (*CONNECTION_ERRORS, DatabaseError)


def storage_message(exc: Exception, loop) -> str:
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


class Heartbeat(threading.Thread):
    """Renews the lease every ACTHELM_HEARTBEAT_SECONDS; tells the run when it lost its task
    (cancelled, reset, recovered) or when a person asked for a pause."""

    def __init__(self, claim: Claim, signals: RunSignals):
        super().__init__(name=f"heartbeat-{claim.task_id}", daemon=True)
        self.claim = claim
        self.signals = signals
        self.done = threading.Event()

    def run(self) -> None:
        interval = settings.ACTHELM_HEARTBEAT_SECONDS
        try:
            while not self.done.wait(interval):
                try:
                    status = renew_lease(task_id=self.claim.task_id, run_id=self.claim.run_id)
                except AttemptLost:  # cancelled, recovered, reset — or deleted
                    if self.done.is_set():
                        return  # the run just ended; its task has moved on
                    log.warning(
                        "run.lost",
                        extra={"task_id": self.claim.task_id, "run_id": self.claim.run_id},
                    )
                    self.signals.cancel.set()
                    return
                except DB_ERRORS:
                    log.exception("heartbeat.db_error", extra={"task_id": self.claim.task_id})
                    db.close()
                    continue
                except Exception:  # a bug must not silence the heartbeat of a running task
                    log.exception("heartbeat.error", extra={"task_id": self.claim.task_id})
                    continue
                if status == TaskStatus.PAUSE_REQUESTED:
                    self.signals.pause.set()
                else:
                    self.signals.pause.clear()
        finally:
            db.close()


class Worker:
    def __init__(self, *, worker_id: str | None = None, concurrency: int = 1, burst: bool = False):
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.worker_id = worker_id or default_worker_id()
        self.concurrency = concurrency
        self.burst = burst
        self.stopping = threading.Event()
        self._cond = threading.Condition()
        self._generation = 0
        self._running: dict[int, RunSignals] = {}
        self._lock = threading.Lock()
        self.processed = 0

    # -- signals -------------------------------------------------------------------------------

    def install_signal_handlers(self) -> None:
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum, frame) -> None:
        if self.stopping.is_set():
            log.warning("worker.exit_now", extra={"worker": self.worker_id})
            os._exit(1)
        log.info("worker.stopping", extra={"worker": self.worker_id, "signal": signum})
        self.stop()

    def stop(self) -> None:
        self.stopping.set()
        with self._lock:
            for signals in self._running.values():
                signals.stop.set()
        self._wake()

    def _wake(self) -> None:
        with self._cond:
            self._generation += 1
            self._cond.notify_all()

    # -- main ----------------------------------------------------------------------------------

    def run(self) -> int:
        log.info(
            "worker.started",
            extra={"worker": self.worker_id, "concurrency": self.concurrency, "burst": self.burst},
        )
        helpers = [
            threading.Thread(target=self._listen, name="listen", daemon=True),
            threading.Thread(target=self._maintain, name="maintain", daemon=True),
        ]
        for t in helpers:
            t.start()
        slots = [
            threading.Thread(target=self._slot, args=(n,), name=f"slot-{n}")
            for n in range(self.concurrency)
        ]
        for t in slots:
            t.start()
        for t in slots:
            while t.is_alive():
                t.join(0.2)  # keep the main thread responsive to signals
        self.stopping.set()
        self._wake()
        log.info("worker.stopped", extra={"worker": self.worker_id, "processed": self.processed})
        return 0

    def _slot(self, n: int) -> None:
        idle_recovered = False
        try:
            while not self.stopping.is_set():
                seen = self._generation
                try:
                    claim = claim_next(worker_id=self.worker_id)
                except DB_ERRORS:
                    log.exception("worker.claim_failed", extra={"worker": self.worker_id})
                    db.close()
                    self.stopping.wait(1.0)
                    continue
                except Exception:  # nothing may end a slot
                    log.exception("worker.claim_error", extra={"worker": self.worker_id})
                    self.stopping.wait(1.0)
                    continue
                if claim is None:
                    if self.burst:
                        if idle_recovered:
                            return
                        self._recover_once()
                        idle_recovered = True
                        continue
                    with self._cond:
                        if self._generation == seen and not self.stopping.is_set():
                            self._cond.wait(settings.ACTHELM_POLL_SECONDS)
                    continue
                idle_recovered = False
                try:
                    self.process(claim)
                except Exception:  # nothing may end a slot
                    log.exception("worker.process_error", extra={"task_id": claim.task_id})
        finally:
            db.close()

    def process(self, claim: Claim) -> str | None:
        """Run one claimed task to an outcome and record it with the run's last step."""
        signals = RunSignals()
        if self.stopping.is_set():
            signals.stop.set()
        with self._lock:
            self._running[claim.run_id] = signals
        heartbeat = Heartbeat(claim, signals)
        heartbeat.start()
        status = loop = None
        try:
            loop = AgentLoop(
                task_id=claim.task_id,
                run_id=claim.run_id,
                worker_id=self.worker_id,
                signals=signals,
            )
            outcome = loop.run()
            verdict = None
            if outcome.kind == Outcome.FINAL:
                if supervisor_uses_model():
                    loop.commit()  # the answer is stored before a slow supervisor call
                verdict = supervise(
                    loop.task,
                    outcome.answer,
                    usage=loop.usage(),
                    open_operations=bool(loop.open_operations()),
                )
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
            log.warning("run.fenced_out", extra={"task_id": claim.task_id, "run_id": claim.run_id})
        except CONNECTION_ERRORS:
            # The database went away mid-run: reconnect and hand the task back, rather than let
            # the lease expire (which recovery would count as a lost worker).
            log.exception("run.db_error", extra={"task_id": claim.task_id})
            status = self._hand_back(claim)
        except DatabaseError as exc:
            # The database refused what the run tried to store (a data, integrity or programming
            # error): the same step would be refused again, so this is a failed attempt — it
            # counts, and the attempts' limit ends it — never a hand-back.
            log.exception("run.storage_rejected", extra={"task_id": claim.task_id})
            status = self._fail_attempt(
                claim, "storage_rejected", storage_message(exc, loop), retryable=True
            )
        except Exception as exc:  # a bug must not kill the worker; the run fails visibly
            log.exception("run.crashed", extra={"task_id": claim.task_id})
            status = self._fail_attempt(
                claim, "internal_error", f"{type(exc).__name__}: {exc}", retryable=True
            )
        finally:
            heartbeat.done.set()
            heartbeat.join(5)
            with self._lock:
                self._running.pop(claim.run_id, None)
            self.processed += 1
        return status

    def _fail_attempt(self, claim: Claim, code: str, message: str, *, retryable: bool):
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
                time.sleep(delay)
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
            deliver_in_maintenance()  # bounded, never raises: see tasks/notify/delivery.py
            now = time.monotonic()
            if now >= next_reconcile:
                self._reconcile_once()
                next_reconcile = now + settings.ACTHELM_RECONCILE_INTERVAL_SECONDS
            expiry = self._seconds_to_earliest_expiry()
            if now >= next_recover or (expiry is not None and expiry <= 0):
                self._recover_once()
                next_recover = now + settings.ACTHELM_RECOVER_INTERVAL_SECONDS
                expiry = None
            wake = min(next_recover, next_reconcile)
            if expiry is not None:
                wake = min(wake, now + expiry + 0.05)
            self.stopping.wait(min(max(0.2, wake - time.monotonic()), 5.0))
        db.close()

    def _seconds_to_earliest_expiry(self) -> float | None:
        """Seconds until the earliest lease of a held task expires, by the database's clock."""
        try:
            with db.cursor() as cursor:
                cursor.execute(
                    "SELECT EXTRACT(EPOCH FROM min(lease_expires_at) - now()) FROM tasks_task "
                    "WHERE status IN ('in_progress', 'pause_requested')"
                )
                value = cursor.fetchone()[0]
        except DB_ERRORS:
            db.close()
            return None
        except Exception:  # the maintenance thread must not end
            log.exception("worker.expiry_error")
            return None
        return None if value is None else float(value)

    def _reconcile_once(self) -> None:
        try:
            reconcile()
        except DB_ERRORS:
            log.exception("worker.reconcile_failed")
            db.close()
        except Exception:
            log.exception("worker.reconcile_error")

    def _listen(self) -> None:
        """LISTEN on its own connection; any notification wakes the idle slots."""
        while not self.stopping.is_set():
            try:
                params = db.get_connection_params()
                conninfo = make_conninfo(
                    **{
                        k: v
                        for k, v in params.items()
                        if k in ("dbname", "user", "password", "host", "port")
                    },
                    application_name=f"acthelm-listen {self.worker_id}"[:63],
                )
                with psycopg.connect(conninfo, autocommit=True) as conn:
                    conn.execute(f"LISTEN {READY_CHANNEL}")
                    self._wake()  # anything that became ready while we were not listening
                    while not self.stopping.is_set():
                        for _ in conn.notifies(timeout=1.0, stop_after=1):
                            self._wake()
            except psycopg.Error:
                log.warning("worker.listen_reconnect", extra={"worker": self.worker_id})
                self.stopping.wait(1.0)
