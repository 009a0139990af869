"""What a task has used across all its runs, and what remains of its limits. The limits
themselves (names, settings, labels, counters, failure codes) are the table `tasks.limits`."""

from collections.abc import Iterable
from decimal import Decimal

from agents.engine.store.usage import FIELDS, KINDS, ZERO, Usage, task_usage
from tasks.limits import CUMULATIVE, Limit
from tasks.models import Task

# A task's usage (the value and its sum over the runs) is the run's store's: its rows carry it.
__all__ = [
    "FIELDS",
    "KINDS",
    "ZERO",
    "Usage",
    "exhausted_limits",
    "first_reached",
    "headroom",
    "reached",
    "remaining",
    "task_usage",
]


def reached(limit: Limit, task: Task, usage: Usage) -> str | None:
    """The failure message when ``task`` has used all of the cumulative ``limit`` (a limit the task
    does not set, such as no money budget, is never reached); None while some remains."""
    granted = getattr(task, limit.field)
    used = getattr(usage, limit.counter)
    if granted is None or used < granted:
        return None
    return limit.reached.format(granted=granted, used=used)


def remaining(task: Task, usage: Usage) -> dict[str, int | float | str]:
    """What remains of each cumulative limit (never negative); JSON-safe (cost as a string).
    A limit the task does not set (no money budget) is left out."""
    result: dict[str, int | float | str] = {}
    for limit in CUMULATIVE:
        granted = getattr(task, limit.field)
        if granted is None:
            continue
        left = granted - getattr(usage, limit.counter)
        if limit.money:
            result[limit.failure_code] = str(max(Decimal(0), left).quantize(Decimal("0.0001")))
        else:
            result[limit.failure_code] = max(0, left)
    return result


def first_reached(limits: Iterable[Limit], task: Task, usage: Usage) -> tuple[Limit, str] | None:
    """The first of ``limits`` the task has reached, with its failure message; None if none."""
    for limit in limits:
        if message := reached(limit, task, usage):
            return limit, message
    return None


def headroom(
    limits: Iterable[Limit], task: Task, usage: Usage, counter: str | None = None
) -> int | None:
    """What remains before the first of ``limits`` is reached (never negative), counting only
    those whose counter is ``counter`` when it is given; None when none of them is set. For
    limits that count whole units (tokens, network requests, MCP calls)."""
    left = [
        getattr(task, limit.field) - getattr(usage, limit.counter)
        for limit in limits
        if (counter is None or limit.counter == counter) and getattr(task, limit.field) is not None
    ]
    return max(0, min(left)) if left else None


def exhausted_limits(task: Task, usage: Usage | None = None) -> set[str]:
    """The codes of the cumulative limits the task has reached."""
    usage = usage or task_usage(task.pk)
    out: set[str] = set()
    for limit in CUMULATIVE:
        if reached(limit, task, usage):
            out.add(limit.failure_code)
    return out
