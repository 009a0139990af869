"""What the worker's maintenance loop runs besides recovery and the reconciler: passes that apps
above the engine register when they are ready (`schedules` registers its tick), as the ledger's
cancel calls what the apps above it registered. The engine imports none of them."""

import logging
from collections.abc import Callable

from django.db import DatabaseError, InterfaceError, OperationalError
from django.db import connection as db

log = logging.getLogger("acthelm.worker")

_HOOKS: dict[str, Callable[[], object]] = {}


def register_maintenance(name: str, hook: Callable[[], object]) -> None:
    """Run ``hook()`` on every pass of the maintenance loop (once per name)."""
    _HOOKS[name] = hook


def run_maintenance() -> None:
    """One pass of every registered hook. Never raises: one hook's error is logged and the
    others, and the loop, go on (a lost connection is closed, so the next pass opens one)."""
    for name, hook in list(_HOOKS.items()):
        try:
            hook()
        except (DatabaseError, InterfaceError, OperationalError):
            log.exception("worker.maintenance_failed", extra={"hook": name})
            db.close()
        except Exception:  # the maintenance thread must not end
            log.exception("worker.maintenance_error", extra={"hook": name})
