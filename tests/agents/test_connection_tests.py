"""A connection's test in the background (agents.catalogue.connection_tests): the row the page
polls, one test at a time per connection, a deadline, and no database connection held while the
model is asked. Against a scripted model on loopback that holds its answer."""

import time
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from agents.catalogue import connection_tests as tests
from agents.models import ConnectionTest, Model
from agents.states import ConnectionTestPhase, ModelTestStatus
from core.actors import Actor
from core.exceptions import InvalidInput, NotPermitted
from tests.factories import ConnectionFactory, ModelFactory, UserFactory
from tests.fakes.model_server import ScriptedModelServer, reply_text

HOLD_SECONDS = 2.0


def _manager() -> Actor:
    return Actor.person(UserFactory(perms=["agents.manage_connections"]))


def _until(predicate, timeout: float = 15.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError("timed out waiting")


def _other_backends() -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        return int(cursor.fetchone()[0])


@pytest.mark.django_db(transaction=True)
def test_a_test_runs_in_the_background_and_records_its_progress():
    actor = _manager()
    with ScriptedModelServer(flavor="openai", context_length=32768) as server:
        server.enqueue(reply_text("OK", delay=HOLD_SECONDS))
        conn = ConnectionFactory(base_url=server.url)
        model = ModelFactory(
            connection=conn, name="slow", supports_tools=False, context_window=None
        )
        before = _other_backends()
        test, started = tests.connection_test_start(actor=actor, connection_id=conn.pk)
        # The start returns at once: the model has not answered (it holds every answer).
        assert started and test.phase == ConnectionTestPhase.CONNECTING
        assert test.finished_at is None and test.deadline_at > timezone.now()
        _until(lambda: server.completion_requests)
        waiting = _until(
            lambda: ConnectionTest.objects.filter(
                pk=test.pk, phase=ConnectionTestPhase.WAITING
            ).first()
        )
        assert waiting.model_name == "slow" and waiting.finished_at is None
        # While the model holds its answer, the test holds no database connection.
        # (At most as many: a thread of another test in this process may let one go meanwhile.)
        assert _other_backends() <= before
        # A second start while it runs starts nothing.
        again, started_again = tests.connection_test_start(actor=actor, connection_id=conn.pk)
        assert not started_again and again.pk == test.pk
        done = _until(
            lambda: ConnectionTest.objects.filter(pk=test.pk, finished_at__isnull=False).first()
        )
    assert done.phase == ConnectionTestPhase.FINISHED
    assert done.results[0]["model"] == "slow" and done.results[0]["ok"] is True
    assert len(server.completion_requests) == 1
    model.refresh_from_db()
    assert model.test_status == ModelTestStatus.PASSED and model.context_window == 32768
    # The thread closed its connection when it ended.
    _until(lambda: _other_backends() <= before)


@pytest.mark.django_db
def test_a_test_past_its_deadline_reads_timed_out_and_a_new_one_may_start():
    actor = _manager()
    conn = ConnectionFactory(timeout_seconds=5)
    ModelFactory(connection=conn)
    stuck, started = tests.connection_test_start(
        actor=actor, connection_id=conn.pk, background=False
    )
    assert started
    # Bounded: three requests within the timeout (the streamed answer, asked again whole when
    # the stream failed, and the tool probe), plus a margin.
    assert stuck.deadline_at - stuck.started_at <= timedelta(seconds=3 * 5 + 11)
    ConnectionTest.objects.filter(pk=stuck.pk).update(
        deadline_at=timezone.now() - timedelta(seconds=1)
    )
    stuck.refresh_from_db()
    assert tests.shown_phase(stuck) == ConnectionTestPhase.TIMED_OUT
    fresh, started = tests.connection_test_start(
        actor=actor, connection_id=conn.pk, background=False
    )
    assert started and fresh.pk != stuck.pk
    stuck.refresh_from_db()
    assert stuck.phase == ConnectionTestPhase.TIMED_OUT and stuck.finished_at is not None
    # The stuck run ending late writes nothing over the timed-out row.
    tests._end(stuck.pk, ConnectionTestPhase.FINISHED, results=[{"model": "x", "ok": True}])
    stuck.refresh_from_db()
    assert stuck.phase == ConnectionTestPhase.TIMED_OUT and stuck.results == []


@pytest.mark.django_db(transaction=True)  # the run closes its database connection
def test_a_failure_to_run_is_recorded_not_left_running():
    actor = _manager()
    conn = ConnectionFactory()
    ModelFactory(connection=conn)
    test, _ = tests.connection_test_start(actor=actor, connection_id=conn.pk, background=False)
    conn.delete()  # the connection went away before the test ran
    assert not ConnectionTest.objects.filter(pk=test.pk).exists()  # removed with it
    conn = ConnectionFactory()
    ModelFactory(connection=conn)
    test, _ = tests.connection_test_start(actor=actor, connection_id=conn.pk, background=False)
    Model.objects.filter(connection=conn).delete()
    tests.connection_test_run(test.pk)
    test.refresh_from_db()
    assert test.phase == ConnectionTestPhase.FAILED and "has no model" in test.message
    assert test.finished_at is not None


@pytest.mark.django_db
def test_starting_needs_the_permission_and_a_connection_with_models():
    conn = ConnectionFactory()
    with pytest.raises(NotPermitted):
        tests.connection_test_start(
            actor=Actor.person(UserFactory(perms=["agents.view_connection"])),
            connection_id=conn.pk,
        )
    with pytest.raises(InvalidInput, match="has no model"):
        tests.connection_test_start(actor=_manager(), connection_id=conn.pk)
    with pytest.raises(InvalidInput, match="does not exist"):
        tests.connection_test_start(actor=_manager(), connection_id=conn.pk + 1000)
    assert not ConnectionTest.objects.exists()


@pytest.mark.django_db
def test_ended_tests_are_kept_a_few_per_connection():
    actor = _manager()
    conn = ConnectionFactory()
    ModelFactory(connection=conn)
    for _ in range(tests.KEEP_ENDED + 3):
        test, _ = tests.connection_test_start(actor=actor, connection_id=conn.pk, background=False)
        tests._end(test.pk, ConnectionTestPhase.FINISHED)
    # Pruned as each test starts: the ended ones kept then, and the newest.
    assert ConnectionTest.objects.filter(connection=conn).count() == tests.KEEP_ENDED + 1
    assert tests.latest_test(conn.pk) == test
