"""A task's limits: what each counts, what is used across all its runs, and what remains."""

from dataclasses import asdict, dataclass
from decimal import Decimal

from django.db.models import DecimalField, Sum
from django.db.models.functions import Coalesce

from agents.models import AgentRun, ToolCall, Turn

#: MCP tools are named SERVER__TOOL; no built-in tool name contains the separator.
MCP_SEPARATOR = "__"

# Failure code -> (the task's limit field, the usage counter it is compared with).
# A limit field that is empty (limit_cost) means no limit.
CUMULATIVE_LIMITS = {
    "limit_steps": ("limit_turns", "model_turns"),
    "limit_runtime": ("limit_runtime_seconds", "active_seconds"),
    "limit_tokens": ("limit_token_budget", "tokens"),
    "limit_network": ("limit_network_requests", "network_requests"),
    "limit_mcp": ("limit_mcp_calls", "mcp_calls"),
    "limit_cost": ("limit_cost", "cost"),
}


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


def mcp_limit_reached(*, limit: int, used: int) -> bool:
    """True when no further MCP call may start: check before marking an MCP call running."""
    return used >= limit


def cost_limit_reached(*, limit: Decimal | None, used: Decimal) -> bool:
    """True when the money budget is spent (no budget: never). Check before each model turn."""
    return limit is not None and used >= limit


def remaining(task, usage: Usage) -> dict:
    """What remains of each cumulative limit (never negative); JSON-safe (cost as a string).
    A limit the task does not set (no money budget) is left out."""
    result = {}
    for code, (limit_field, counter) in CUMULATIVE_LIMITS.items():
        granted = getattr(task, limit_field)
        if granted is None:
            continue
        left = granted - getattr(usage, counter)
        if isinstance(left, Decimal):
            result[code] = str(max(Decimal(0), left).quantize(Decimal("0.0001")))
        else:
            result[code] = max(0, left)
    return result


def exhausted_limits(task, usage: Usage | None = None) -> set[str]:
    """The codes of the cumulative limits the task has reached."""
    usage = usage or task_usage(task.pk)
    out = set()
    for code, (limit_field, counter) in CUMULATIVE_LIMITS.items():
        granted = getattr(task, limit_field)
        if granted is not None and getattr(usage, counter) >= granted:
            out.add(code)
    return out
