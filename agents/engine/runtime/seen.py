"""Each worker process says when it was last seen (`WorkerSeen`), from its maintenance loop, so
the Workers page lists idle workers too. One upsert at most every SEEN_EVERY seconds; it never
raises (the maintenance thread also recovers other workers' runs)."""

import logging
import os
import socket
import time

from django.db import DatabaseError
from django.db import connection as db
from django.utils import timezone

from agents.models import WorkerSeen

log = logging.getLogger("acthelm.worker")

SEEN_EVERY = 5.0
STARTED = timezone.now()  # this process's start, as the page shows it
_last: dict[str, float] = {}


def record_seen(worker_id: str, *, force: bool = False) -> None:
    """Upsert this process's row: (worker_id) → host, pid, started, last_seen = now."""
    now = time.monotonic()
    if not force and now - _last.get(worker_id, -SEEN_EVERY) < SEEN_EVERY:
        return
    _last[worker_id] = now
    try:
        WorkerSeen.objects.bulk_create(
            [
                WorkerSeen(
                    worker_id=worker_id[:200],
                    host=socket.gethostname()[:200],
                    pid=os.getpid(),
                    started=STARTED,
                    last_seen=timezone.now(),
                )
            ],
            update_conflicts=True,
            unique_fields=["worker_id"],
            update_fields=["host", "pid", "started", "last_seen"],
        )
    except DatabaseError:
        db.close()
    except Exception:  # the maintenance thread must not end
        log.exception("worker.seen_error", extra={"worker": worker_id})
