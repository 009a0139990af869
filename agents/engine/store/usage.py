"""What was used, as a value (`Usage`: by a task, a run or a step, each field a column of the run
row), and what a task has used across all its runs, summed by the database in one aggregate.
`agents.engine.run.usage` adds what remains of a task's limits."""

import functools
from dataclasses import dataclass, fields
from decimal import Decimal
from typing import cast

from django.db.models import Field

from agents.models import AgentRun
from core import fastsql


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


@functools.cache
def _task_usage_sql() -> str:
    """The aggregate, built once (the ORM's compile of seven sums cost a task ~1 ms of CPU)."""
    meta = AgentRun._meta

    def column(name: str) -> str:
        found = meta.get_field(name)
        assert isinstance(found, Field) and found.column  # a column of the run row
        return found.column

    sums = ", ".join(f"coalesce(sum({column(name)}), 0)" for name in KINDS)
    return f"SELECT {sums} FROM {meta.db_table} WHERE {column('task')} = %s"


def task_usage(task_id: int) -> Usage:
    """Usage summed over every run of the task, in one aggregate: limits hold across pauses and
    restarts."""
    row = fastsql.execute(_task_usage_sql(), [task_id]).fetchone()
    assert row is not None  # an aggregate without GROUP BY returns one row
    return Usage(
        **{name: kind(value) for (name, kind), value in zip(KINDS.items(), row, strict=True)}
    )
