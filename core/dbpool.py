"""The worker's connection pool, seen from the code that waits: give the connection back first."""

import copy
import select

import psycopg
from django.db import DEFAULT_DB_ALIAS, connection, connections
from psycopg import pq
from psycopg_pool import ConnectionPool


def release_connection() -> None:
    """Give this thread's database connection back to the pool (a worker process with
    `ACTHELM_DB_POOL_SIZE`), so that nothing holds one while it waits for a model, a tool or a
    receiver. Without a pool, or inside a transaction, it does nothing."""
    if connection.settings_dict["OPTIONS"].get("pool") and not connection.in_atomic_block:
        connection.close()


def is_pooled() -> bool:
    """Whether this thread's connection is borrowed from the pool."""
    return bool(connection.settings_dict["OPTIONS"].get("pool"))


def reserve_connection(*, application_name: str | None = None) -> bool:
    """Give THIS thread a connection of its own, outside the pool and kept open between uses
    (closing it disconnects; the next query opens it again), so that it never waits behind the
    threads that borrow from the pool: the worker's heartbeat. `application_name`, when given,
    replaces the pool's. Without a pool it does nothing and returns False."""
    if not is_pooled():
        return False
    pooled = connections[DEFAULT_DB_ALIAS]
    pooled.close()
    own = copy.deepcopy(pooled.settings_dict)
    del own["OPTIONS"]["pool"]
    if application_name:
        own["OPTIONS"]["application_name"] = application_name
    own["CONN_MAX_AGE"] = None  # persistent: opened once, reopened only after an error
    connections[DEFAULT_DB_ALIAS] = type(pooled)(own, DEFAULT_DB_ALIAS)
    return True


def check_idle(conn: psycopg.Connection) -> None:
    """The pool's check of a connection it is about to hand out (`OPTIONS["pool"]["check"]`),
    without a round trip: an idle healthy connection has nothing to read, so its socket is
    polled without waiting. Readable means the server said something unasked (its FATAL
    before it closed, the end of the stream, a notice): then the empty query that psycopg's own
    check sends decides, and raises for a broken connection (the pool discards it and hands
    out another). A connection psycopg already knows to be closed, or not idle, never passes
    unchecked. The empty query on every checkout was a round trip per borrowed connection
    (~5 % of a worker's CPU per step)."""
    pgconn = conn.pgconn
    if (
        not conn.closed
        and pgconn.status == pq.ConnStatus.OK
        and pgconn.transaction_status == pq.TransactionStatus.IDLE
        and not _readable(pgconn.socket)
    ):
        return
    ConnectionPool.check_connection(conn)  # raises for a closed or broken connection


def _readable(fd: int) -> bool:
    """Whether the socket has something to read (or hung up), without waiting. `poll`, not
    `select`: a worker's descriptors pass FD_SETSIZE (1024)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN | select.POLLPRI)
    return bool(poller.poll(0))
