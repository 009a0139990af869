"""A connection's test started from the console, run in the background so the page stays
usable: the one writer of `ConnectionTest` rows.

`connection_test_start` records the test (one per connection at a time: a second click while one
runs gets the running one) and, once that is committed, runs it in a thread of the web process.
The thread calls the one test service (`connections.connection_test`), records each phase
("connecting", "waiting for the model"), holds no database connection while it waits on the
model and closes its own when it ends. A test is bounded: each request by the connection's
timeout, the whole by a deadline after which an unfinished row counts as timed out (its process
may have stopped) and a new test may start."""

import logging
import threading
from datetime import datetime, timedelta

from django.db import connection as db_connection
from django.db import transaction
from django.utils import timezone

from agents.catalogue.connections import connection_test
from agents.models import Connection, ConnectionTest
from agents.permissions import MANAGE_CONNECTIONS
from agents.states import ConnectionTestPhase
from core.actors import Actor
from core.exceptions import ActhelmError, InvalidInput

log = logging.getLogger("acthelm.agents")

# Up to three requests a model (the answer, streamed — asked again whole when the stream failed —
# and the tool-calling probe), each within the connection's timeout, plus a margin for the
# database writes between them.
REQUESTS_PER_MODEL = 3
MARGIN_SECONDS = 10

# Ended tests kept per connection: the page shows the newest; the rest is a short history.
KEEP_ENDED = 5


def _deadline_seconds(conn: Connection, models: int) -> float:
    return float(conn.timeout_seconds) * REQUESTS_PER_MODEL * max(1, models) + MARGIN_SECONDS


def connection_test_start(
    *, actor: Actor, connection_id: int, background: bool = True
) -> tuple[ConnectionTest, bool]:
    """Start testing a connection's models; `(test, started)`. While a test of this connection
    runs (before its deadline) no second one starts: the running one is returned. With
    `background=False` the caller runs it (`connection_test_run`)."""
    actor.require(MANAGE_CONNECTIONS)
    now = timezone.now()
    with transaction.atomic():
        conn = Connection.objects.select_for_update().filter(pk=connection_id).first()
        if conn is None:
            raise InvalidInput(f"connection {connection_id} does not exist")
        running = conn.tests.filter(finished_at__isnull=True).first()
        if running is not None and running.deadline_at > now:
            return running, False
        if running is not None:
            _end(running.pk, ConnectionTestPhase.TIMED_OUT, message="no result before its deadline")
        models = conn.models.count()
        if not models:
            raise InvalidInput(f"connection {conn.name} has no model")
        test = ConnectionTest.objects.create(
            connection=conn,
            requested_by=actor.user,
            phase=ConnectionTestPhase.CONNECTING,
            phase_at=now,
            deadline_at=now + timedelta(seconds=_deadline_seconds(conn, models)),
        )
        keep = conn.tests.filter(finished_at__isnull=False).order_by("-id")[:KEEP_ENDED]
        conn.tests.filter(finished_at__isnull=False).exclude(pk__in=keep.values("pk")).delete()
        if background:
            transaction.on_commit(lambda: _spawn(test.pk))
    log.info(
        "connection.test_started",
        extra={"connection": conn.name, "test_id": test.pk, "actor": actor.label},
    )
    return test, True


def _spawn(test_id: int) -> None:
    thread = threading.Thread(
        target=connection_test_run, args=(test_id,), name=f"connection-test-{test_id}", daemon=True
    )
    thread.start()


def _phase(test_id: int, phase: ConnectionTestPhase, model_name: str = "") -> None:
    ConnectionTest.objects.filter(pk=test_id, finished_at__isnull=True).update(
        phase=phase, model_name=model_name[:200], phase_at=timezone.now()
    )


def _end(
    test_id: int,
    phase: ConnectionTestPhase,
    *,
    results: list[dict[str, object]] | None = None,
    message: str = "",
) -> None:
    """End an unfinished test (one guarded statement: a test already ended stays as it was)."""
    now = timezone.now()
    ConnectionTest.objects.filter(pk=test_id, finished_at__isnull=True).update(
        phase=phase, phase_at=now, finished_at=now, results=results or [], message=message[:2000]
    )


def connection_test_run(test_id: int) -> None:
    """Run a started test to its end and record it; the body of the background thread."""
    try:
        test = ConnectionTest.objects.select_related("connection", "requested_by").get(pk=test_id)
        if test.requested_by is None:
            _end(test_id, ConnectionTestPhase.FAILED, message="the person who started it is gone")
            return

        def waiting(model_name: str) -> None:
            _phase(test_id, ConnectionTestPhase.WAITING, model_name)
            db_connection.close()  # nothing is held while the model answers

        results = connection_test(
            actor=Actor.person(test.requested_by),
            name=test.connection.name,
            before_probe=waiting,
        )
        _end(test_id, ConnectionTestPhase.FINISHED, results=[dict(r) for r in results])
    except ActhelmError as exc:
        _end(test_id, ConnectionTestPhase.FAILED, message=f"{exc.message} [{exc.code}]")
    except Exception:
        # A bug must not leave the page waiting until the deadline: recorded, then logged.
        log.exception("connection.test_crashed", extra={"test_id": test_id})
        _end(test_id, ConnectionTestPhase.FAILED, message="the test stopped with an internal error")
    finally:
        db_connection.close()


def latest_test(connection_id: int) -> ConnectionTest | None:
    """The connection's newest test, for the page (an unfinished one past its deadline reads
    as timed out: `test_state`)."""
    return ConnectionTest.objects.filter(connection_id=connection_id).order_by("-id").first()


def shown_phase(test: ConnectionTest, now: datetime | None = None) -> str:
    """The test's phase as the page shows it: an unfinished test past its deadline is timed
    out, whatever its row says."""
    when = now or timezone.now()
    if test.finished_at is None and test.deadline_at <= when:
        return ConnectionTestPhase.TIMED_OUT
    return test.phase
