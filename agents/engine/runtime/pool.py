"""A worker process's database connections: a pool of at most the configured size
(`configure_pool`), named in pg_stat_activity after the worker (`pool_name_of`), and the
heartbeat's connection of its own (`heartbeat_name`)."""

from django.conf import settings
from django.db import connection as db

from core.dbpool import check_idle


def pool_name_of(worker_id: str) -> str:
    """`application_name` of a worker's pooled connections (pg_stat_activity)."""
    return f"acthelm-worker {worker_id}"[:63]


def heartbeat_name(worker_id: str) -> str:
    """`application_name` of a worker's heartbeat connection."""
    return f"acthelm-heartbeat {worker_id}"[:63]


def configure_pool(size: int, *, worker_id: str = "") -> None:
    """Make this process's connections a pool of at most `size` (Django's own psycopg pool,
    `OPTIONS["pool"]`): every thread borrows a connection for a transaction or a statement and
    gives it back (`release_connection`), so a worker process opens at most `size` connections
    plus the heartbeat's own and its LISTEN connection, whatever `--concurrency` says. Call it
    before any query."""
    if size <= 0:
        return
    db.close()
    options = db.settings_dict.setdefault("OPTIONS", {})
    options["pool"] = {
        "min_size": 1,
        "max_size": size,
        "timeout": settings.ACTHELM_DB_POOL_TIMEOUT_SECONDS,
        "name": "acthelm-worker",
        "check": check_idle,  # a poll of the idle socket, not a round trip per checkout
    }
    db.settings_dict["CONN_MAX_AGE"] = 0
    if worker_id:  # so that pg_stat_activity says whose connections these are
        options.setdefault("application_name", pool_name_of(worker_id))
