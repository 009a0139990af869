"""What a run is told: memory entries in the task's scopes, ranked against its instruction."""

import re
from typing import Protocol

from django.db import connection
from django.db.models import Exists, Model, Q, QuerySet

from core import fastsql
from memory.models import MemoryEntry, MemoryScope, MemorySelection

_WORD = re.compile(r"[A-Za-z0-9]{3,}")


class Subject(Protocol):
    """What memory reads of a task (tasks.Task: memory sits below the tasks app)."""

    @property
    def goal_id(self) -> int | None: ...
    @property
    def tags(self) -> list[str]: ...
    @property
    def instruction(self) -> str: ...


def entries_in_scope(task: Subject) -> QuerySet[MemoryEntry]:
    scope = Q(scope=MemoryScope.GLOBAL)
    if task.goal_id:
        scope |= Q(scope=MemoryScope.GOAL, goal_id=task.goal_id)
    if task.tags:
        scope |= Q(scope=MemoryScope.TAG, tag__in=task.tags)
    return MemoryEntry.objects.filter(scope, active=True)


def any_active() -> Exists:
    """Whether any memory entry is active, as an expression a query of the task annotates: with
    none, `rank_for_task` would rank nothing, and a task's start skips it (one statement less,
    at every start of a deployment that keeps no memory)."""
    return Exists(MemoryEntry.objects.filter(active=True))


def _rank_sql() -> str:
    """The ranking query in one fixed shape (every scope's arm, the words as one parameter): no
    ORM compile of the search expressions on each task's start, where it cost ~1 ms of a
    one-turn task's ~12. The same ranking as
    `entries_in_scope(task).annotate(rank=SearchRank(SearchVector("title", "body",
    config="english"), SearchQuery(words, search_type="websearch", config="english")))`;
    without words the rank is NULL, reported as 0.0, and the newest come first."""
    table = MemoryEntry._meta.db_table
    columns = ", ".join(f'"{f.column}"' for f in MemoryEntry._meta.concrete_fields)
    vector = "to_tsvector('english'::regconfig, COALESCE(title, '') || ' ' || COALESCE(body, ''))"
    return (
        f"SELECT {columns}, ts_rank({vector}, "
        f"websearch_to_tsquery('english'::regconfig, %(words)s::text)) AS rank FROM {table} "
        f"WHERE active AND (scope = '{MemoryScope.GLOBAL}' "
        f"OR (scope = '{MemoryScope.GOAL}' AND goal_id = %(goal)s::bigint) "
        f"OR (scope = '{MemoryScope.TAG}' AND tag = ANY(%(tags)s::varchar[]))) "
        "ORDER BY rank DESC NULLS LAST, updated_at DESC, id LIMIT 200"
    )


_RANK_SQL = _rank_sql()


def rank_for_task(task: Subject, *, budget_chars: int) -> list[tuple[MemoryEntry, float]]:
    """Entries in scope, best match with the instruction first (PostgreSQL full-text search),
    then newest, as many as fit in `budget_chars`."""
    words = sorted(set(_WORD.findall(task.instruction.lower())))[:64]
    params = {
        "words": " OR ".join(words) if words else None,
        "goal": task.goal_id,
        "tags": list(task.tags or []),
    }
    names = [f.attname for f in MemoryEntry._meta.concrete_fields]
    chosen: list[tuple[MemoryEntry, float]] = []
    used = 0
    for *values, rank in fastsql.execute(_RANK_SQL, params).fetchall():
        entry = MemoryEntry.from_db(connection.alias, names, values)
        size = len(entry.title) + len(entry.body) + 8
        if used + size > budget_chars:
            continue
        chosen.append((entry, float(rank or 0.0)))
        used += size
    return chosen


def record_selection(run: Model, chosen: list[tuple[MemoryEntry, float]]) -> list[MemorySelection]:
    """``run``: the agents.AgentRun (by its id: memory sits below the agents app)."""
    return MemorySelection.objects.bulk_create(
        [
            MemorySelection(
                run_id=run.pk,
                entry=entry,
                position=i,
                rank=rank,
                title=entry.title,
                chars=len(entry.title) + len(entry.body),
            )
            for i, (entry, rank) in enumerate(chosen)
        ]
    )


def copy_selection(*, from_run_id: int, to_run: Model) -> None:
    """A later run of the task sends the same stored prompt, so it records the same entries.
    ``to_run``: the agents.AgentRun (by its id: memory sits below the agents app)."""
    rows = MemorySelection.objects.filter(run_id=from_run_id).order_by("position")
    MemorySelection.objects.bulk_create(
        [
            MemorySelection(
                run_id=to_run.pk,
                entry_id=r.entry_id,
                position=r.position,
                rank=r.rank,
                title=r.title,
                chars=r.chars,
            )
            for r in rows
        ]
    )


def render_memory(chosen: list[tuple[MemoryEntry, float]]) -> str:
    return "\n\n".join(f"### {entry.title}\n{entry.body.strip()}" for entry, _ in chosen)
