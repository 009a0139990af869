"""The worker's connection pool, seen from the code that waits: give the connection back first."""

import copy

from django.db import DEFAULT_DB_ALIAS, connection, connections


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
