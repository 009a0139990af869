"""What a task has used across all its runs, summed by the database: one aggregate over the run
rows (`agents.engine.usage.task_usage` is its door for the rest of the project)."""

import functools

from django.db.models import Field

from agents.engine.usage import KINDS, Usage
from agents.models import AgentRun
from core import fastsql


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
    """Usage summed over every run of the task, in one aggregate."""
    row = fastsql.execute(_task_usage_sql(), [task_id]).fetchone()
    assert row is not None  # an aggregate without GROUP BY returns one row
    return Usage(
        **{name: kind(value) for (name, kind), value in zip(KINDS.items(), row, strict=True)}
    )
