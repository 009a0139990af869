"""What a task has used across all its runs, and what remains of its limits. The limits
themselves (names, settings, labels, counters, failure codes) are the table `tasks.limits`."""

from dataclasses import asdict, dataclass
from decimal import Decimal

from django.db.models import DecimalField, Sum
from django.db.models.functions import Coalesce

from agents.models import AgentRun, ToolCall, Turn
from tasks.limits import CUMULATIVE, Limit

#: MCP tools are named SERVER__TOOL; no built-in tool name contains the separator.
MCP_SEPARATOR = "__"


@dataclass(frozen=True)
class Usage:
    model_turns: int = 0
    tokens: int = 0
    active_seconds: float = 0.0
    network_requests: int = 0
    # Executions of MCP tools (every start counts, a run again after a crash too).
    mcp_calls: int = 0
    # US dollars: the sum of the turns' known costs.
    cost: Decimal = Decimal(0)

    def as_dict(self) -> dict:
        data = asdict(self)
        data["cost"] = str(self.cost)
        return data


def task_usage(task_id: int) -> Usage:
    """Usage summed over every run of the task: limits hold across pauses and restarts."""
    totals = AgentRun.objects.filter(task_id=task_id).aggregate(
        model_turns=Coalesce(Sum("model_turns"), 0),
        input_tokens=Coalesce(Sum("input_tokens"), 0),
        output_tokens=Coalesce(Sum("output_tokens"), 0),
        active_seconds=Coalesce(Sum("active_seconds"), 0.0),
        network_requests=Coalesce(Sum("network_requests"), 0),
    )
    return Usage(
        model_turns=totals["model_turns"],
        tokens=totals["input_tokens"] + totals["output_tokens"],
        active_seconds=float(totals["active_seconds"]),
        network_requests=totals["network_requests"],
        mcp_calls=task_mcp_calls(task_id),
        cost=task_cost(task_id),
    )


def task_mcp_calls(task_id: int) -> int:
    """How often the task started an MCP tool (``ToolCall.run_count`` is raised at each start,
    in the same transaction that marks the call running, so a crash cannot lose one)."""
    return ToolCall.objects.filter(task_id=task_id, tool__contains=MCP_SEPARATOR).aggregate(
        n=Coalesce(Sum("run_count"), 0)
    )["n"]


def task_cost(task_id: int) -> Decimal:
    return Turn.objects.filter(task_id=task_id).aggregate(
        cost=Coalesce(Sum("cost"), Decimal(0), output_field=DecimalField())
    )["cost"]


def is_mcp_tool(name: str) -> bool:
    return MCP_SEPARATOR in (name or "")


def reached(limit: Limit, task, usage: Usage) -> str | None:
    """The failure message when ``task`` has used all of the cumulative ``limit`` (a limit the task
    does not set, such as no money budget, is never reached); None while some remains."""
    granted = getattr(task, limit.field)
    used = getattr(usage, limit.counter)
    if granted is None or used < granted:
        return None
    return limit.reached.format(granted=granted, used=used)


def remaining(task, usage: Usage) -> dict:
    """What remains of each cumulative limit (never negative); JSON-safe (cost as a string).
    A limit the task does not set (no money budget) is left out."""
    result = {}
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


def exhausted_limits(task, usage: Usage | None = None) -> set[str]:
    """The codes of the cumulative limits the task has reached."""
    usage = usage or task_usage(task.pk)
    out = set()
    for limit in CUMULATIVE:
        if reached(limit, task, usage):
            out.add(limit.failure_code)
    return out
