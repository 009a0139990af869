"""The worker's connection pool, seen from the code that waits: give the connection back first."""

from django.db import connection


def release_connection() -> None:
    """Give this thread's database connection back to the pool (a worker process with
    `ACTHELM_DB_POOL_SIZE`), so that nothing holds one while it waits for a model, a tool or a
    receiver. Without a pool, or inside a transaction, it does nothing."""
    if connection.settings_dict["OPTIONS"].get("pool") and not connection.in_atomic_block:
        connection.close()
