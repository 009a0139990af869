"""What a task has used across all its runs, and what remains of its limits. The limits
themselves (names, settings, labels, counters, failure codes) are the table `tasks.limits`."""

from collections.abc import Iterable
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import cast

from tasks.limits import CUMULATIVE, Limit
from tasks.models import Task

#: MCP tools are named SERVER__TOOL; no built-in tool name contains the separator.
MCP_SEPARATOR = "__"


@dataclass(frozen=True)
class Usage:
    """What was used: by a task (all its runs), by one run, or by one step (the delta the
    recorder adds to the run row). Each field is a column of `AgentRun` of the same name, summed
    by `task_usage`; a cumulative limit's `counter` names a field (or `tokens`)."""

    model_turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    active_seconds: float = 0.0
    network_requests: int = 0
    # Executions of MCP tools (every start counts, a run again after a crash too).
    mcp_calls: int = 0
    # US dollars: the sum of the turns' known costs.
    cost: Decimal = Decimal(0)

    def __add__(self, other: "Usage") -> "Usage":
        if not isinstance(other, Usage):
            return NotImplemented
        # Field by field, spelled out: a run adds usages a dozen times a step, and the generic
        # sum over FIELDS (a dict, two getattr a field, keyword arguments) cost ~4 us each.
        # tests/agents/test_usage_ledger.py adds each field alone, so a new one is not dropped.
        return Usage(
            self.model_turns + other.model_turns,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.active_seconds + other.active_seconds,
            self.network_requests + other.network_requests,
            self.mcp_calls + other.mcp_calls,
            self.cost + other.cost,
        )

    def plus_seconds(self, seconds: float) -> "Usage":
        """This usage with `seconds` more of active time."""
        return Usage(
            self.model_turns,
            self.input_tokens,
            self.output_tokens,
            self.active_seconds + seconds,
            self.network_requests,
            self.mcp_calls,
            self.cost,
        )

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def as_dict(self) -> dict[str, int | float | str]:
        """JSON-safe, as checkpoints and the API show it (tokens as one number)."""
        return {
            "model_turns": self.model_turns,
            "tokens": self.tokens,
            "active_seconds": self.active_seconds,
            "network_requests": self.network_requests,
            "mcp_calls": self.mcp_calls,
            "cost": str(self.cost),
        }


FIELDS = fields(Usage)
#: Each field's type, to convert its sum with (Usage's annotations are classes, never strings).
KINDS = {f.name: cast(type, f.type) for f in FIELDS}
#: Nothing used: what a run and a step start from.
ZERO = Usage()


def task_usage(task_id: int) -> Usage:
    """Usage summed over every run of the task, in one aggregate: limits hold across pauses and
    restarts. The run's store runs it (`agents.engine.store.usage`); imported here when called,
    because the store is built on this module's `Usage`."""
    from agents.engine.store.usage import task_usage as summed

    return summed(task_id)


def is_mcp_tool(name: str) -> bool:
    return MCP_SEPARATOR in (name or "")


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
