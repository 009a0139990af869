"""A task's limits: what each counts, what is used across all its runs, and what remains."""

from dataclasses import asdict, dataclass

from django.db.models import Sum
from django.db.models.functions import Coalesce

from agents.models import AgentRun

# Failure code -> (the task's limit field, the usage counter it is compared with).
CUMULATIVE_LIMITS = {
    "limit_steps": ("limit_turns", "model_turns"),
    "limit_runtime": ("limit_runtime_seconds", "active_seconds"),
    "limit_tokens": ("limit_token_budget", "tokens"),
    "limit_network": ("limit_network_requests", "network_requests"),
}


@dataclass(frozen=True)
class Usage:
    model_turns: int = 0
    tokens: int = 0
    active_seconds: float = 0.0
    network_requests: int = 0

    def as_dict(self) -> dict:
        return asdict(self)


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
    )


def remaining(task, usage: Usage) -> dict:
    """What remains of each cumulative limit (never negative)."""
    result = {}
    for code, (limit_field, counter) in CUMULATIVE_LIMITS.items():
        result[code] = max(0, getattr(task, limit_field) - getattr(usage, counter))
    return result


def exhausted_limits(task, usage: Usage | None = None) -> set[str]:
    """The codes of the cumulative limits the task has reached."""
    usage = usage or task_usage(task.pk)
    return {code for code, left in remaining(task, usage).items() if left <= 0}
