"""The worker pool's checkout check (core.dbpool.check_idle): an idle healthy connection is
handed out without a round trip; one the server cut is never handed out; one the server merely
spoke to (a notification) still is, after the empty query proved it."""

import time

import psycopg
import pytest
from psycopg_pool import ConnectionPool

from core.dbpool import check_idle

pytestmark = pytest.mark.django_db(transaction=True)


def _params() -> dict:
    from django.db import connection

    params = connection.get_connection_params()
    params.pop("cursor_factory", None)
    return {**params, "autocommit": True}


def _last_query(pid: int) -> str:
    with psycopg.connect(**_params()) as other:
        row = other.execute("SELECT query FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
    assert row is not None
    return row[0]


def _terminate(pid: int) -> None:
    """Cut the session from another one, and wait until its process is gone."""
    with psycopg.connect(**_params()) as other:
        other.execute("SELECT pg_terminate_backend(%s)", [pid])
        deadline = time.monotonic() + 10
        while other.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone():
            assert time.monotonic() < deadline, "the backend outlived pg_terminate_backend"
            time.sleep(0.02)
    time.sleep(0.05)  # the end of the stream reaches the client's socket


def test_an_idle_healthy_connection_passes_without_a_round_trip():
    with psycopg.connect(**_params()) as conn:
        conn.execute("SELECT 'the last statement'")
        check_idle(conn)
        check_idle(conn)
        assert _last_query(conn.info.backend_pid) == "SELECT 'the last statement'"


def test_a_connection_the_server_cut_fails_the_check():
    with psycopg.connect(**_params()) as conn:
        _terminate(conn.info.backend_pid)
        with pytest.raises(psycopg.OperationalError):
            check_idle(conn)


def test_a_closed_connection_fails_the_check():
    conn = psycopg.connect(**_params())
    conn.close()
    with pytest.raises(psycopg.OperationalError):
        check_idle(conn)


def test_a_connection_with_a_notification_waiting_passes_after_the_empty_query():
    with psycopg.connect(**_params()) as conn, psycopg.connect(**_params()) as other:
        conn.execute("LISTEN acthelm_dbpool_test")
        other.execute("NOTIFY acthelm_dbpool_test")
        time.sleep(0.05)
        check_idle(conn)  # readable, yet healthy: the empty query decides
        assert _last_query(conn.info.backend_pid) == ""
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_the_pool_never_hands_out_a_connection_the_server_cut():
    pool = ConnectionPool(
        kwargs=_params(), min_size=1, max_size=1, check=check_idle, open=True, timeout=10
    )
    try:
        with pool.connection() as conn:
            first = conn.info.backend_pid
        _terminate(first)
        with pool.connection() as conn:
            assert conn.info.backend_pid != first
            assert conn.execute("SELECT 1").fetchone() == (1,)
    finally:
        pool.close()


def test_a_worker_pool_checks_with_check_idle(settings):
    from django.db import connection

    from agents.engine.runtime.pool import configure_pool

    saved = {**connection.settings_dict, "OPTIONS": {**connection.settings_dict["OPTIONS"]}}
    try:
        configure_pool(2, worker_id="w-dbpool")
        assert connection.settings_dict["OPTIONS"]["pool"]["check"] is check_idle
    finally:
        connection.close()
        connection.settings_dict.clear()
        connection.settings_dict.update(saved)
