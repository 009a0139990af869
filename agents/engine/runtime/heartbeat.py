"""The worker process's one heartbeat (`Heartbeat`): it renews every lease the process holds in
one statement, on a connection of its own, and tells each run whether it still holds its task.
The worker (`agents.engine.runtime.worker`) starts it and lists its runs (`Runs`)."""

import logging
import threading
import time
from dataclasses import dataclass
from typing import Protocol

from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError
from django.db import connection as db

from agents.engine.run.state import RunSignals
from agents.engine.runtime.pool import heartbeat_name, pool_name_of
from agents.engine.store import Claim, renew_leases
from core.dbpool import reserve_connection
from tasks.states import TaskStatus

log = logging.getLogger("acthelm.worker")

# Only these mean "the database went away": the task is handed back (not an attempt). Any other
# DatabaseError is the database refusing what was written, which fails the attempt.
CONNECTION_ERRORS = (OperationalError, InterfaceError)
DB_ERRORS = (*CONNECTION_ERRORS, DatabaseError)


@dataclass(frozen=True)
class Running:
    claim: Claim
    signals: RunSignals


class Runs(Protocol):
    """What the heartbeat reads of its worker: the runs it holds, and whether it has halted."""

    worker_id: str
    halted: threading.Event

    def running_snapshot(self) -> dict[int, Running]: ...

    def is_running(self, run_id: int) -> bool: ...


class Heartbeat(threading.Thread):
    """One heartbeat for the whole process: every ACTHELM_HEARTBEAT_SECONDS it renews the lease
    of every task the process runs in ONE statement (`renew_leases`, the fence's checks for each
    pair), and its answer tells each run whether it lost its task (cancelled, recovered, reset,
    deleted: the run's cancel event, which also aborts an in-flight model request or fetch) or
    has a pause request. `poke(task_id)` checks those tasks at once: a person's action arrives as
    a NOTIFY (`tasks.transitions.SIGNAL_CHANNEL`); the interval is the fallback where
    notifications do not arrive (PgBouncer in transaction mode).

    With a pool, the heartbeat's connection is its own (`reserve_connection`): the runs cannot
    hold it, so however long they keep the pool's connections, every lease is renewed while
    the process and PostgreSQL are alive."""

    def __init__(self, worker: Runs):
        super().__init__(name="heartbeat", daemon=True)
        self.worker = worker
        self._wake = threading.Condition()
        self._poked: set[int] = set()
        self._ended = threading.Event()
        self.beats = 0
        self.reserved = False  # whether this thread's connection is its own (with a pool)

    def end(self) -> None:
        self._ended.set()
        self.poke(0)

    def poke(self, task_id: int) -> None:
        with self._wake:
            self._poked.add(task_id)
            self._wake.notify()

    def run(self) -> None:
        pool_name = db.settings_dict["OPTIONS"].get("application_name")
        self.reserved = reserve_connection(
            application_name=heartbeat_name(self.worker.worker_id)
            if pool_name == pool_name_of(self.worker.worker_id)
            else None
        )
        interval = settings.ACTHELM_HEARTBEAT_SECONDS
        next_beat = time.monotonic() + interval
        while not (self.worker.halted.is_set() or self._ended.is_set()):
            with self._wake:
                timeout = next_beat - time.monotonic()
                if not self._poked and timeout > 0:
                    self._wake.wait(timeout)
                poked, self._poked = self._poked, set()
            if time.monotonic() >= next_beat:
                self.beat(None)
                next_beat = time.monotonic() + interval
            elif poked:
                self.beat(poked)
        db.close()

    def beat(self, only: set[int] | None) -> None:
        running = self.worker.running_snapshot()
        if only is not None:
            running = {run_id: r for run_id, r in running.items() if r.claim.task_id in only}
        if not running:
            return
        pairs = [(r.claim.task_id, run_id) for run_id, r in running.items()]
        try:
            try:
                held = renew_leases(pairs)
            except CONNECTION_ERRORS:
                # The kept connection died (a restart, pg_terminate_backend): reconnect once now
                # rather than skip a beat.
                db.close()
                held = renew_leases(pairs)
        except DB_ERRORS:
            log.exception("heartbeat.db_error", extra={"worker": self.worker.worker_id})
            db.close()
            return
        except Exception:  # a bug must not silence the heartbeat of the running tasks
            log.exception("heartbeat.error", extra={"worker": self.worker.worker_id})
            return
        finally:
            if not self.reserved:  # without a pool: no idle connection between beats
                db.close()
        self.beats += 1
        for run_id, r in running.items():
            status = held.get(r.claim.task_id)
            if status is None:
                # Else the run just ended (its task moved on with its last write, which may have
                # committed before this answer while the run is still listed), or it was told
                # already. An ending run that did lose its task finds out at that write's fence.
                ended = r.signals.ending.is_set() or r.signals.cancel.is_set()
                if self.worker.is_running(run_id) and not ended:
                    log.warning("run.lost", extra={"task_id": r.claim.task_id, "run_id": run_id})
                    r.signals.cancel.set()
            elif status == TaskStatus.PAUSE_REQUESTED:
                r.signals.pause.set()
            else:
                r.signals.pause.clear()
