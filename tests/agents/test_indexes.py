"""The schema's indexes against the lookups they serve (agents/migrations/0017): every foreign
key of the project's tables is the leading column of an index (deleting a parent, or reading a
task's turns, never scans a child table), and no plain index repeats the leading columns of
another index on the same table (each one is an insert more in every step)."""

import pytest
from django.apps import apps
from django.db import connection

pytestmark = pytest.mark.django_db

PROJECT_APPS = ("agents", "approvals", "console", "memory", "tasks", "schedules")

# Index name, its table, whether it is unique, its predicate (partial index) and its key columns
# in order; an expression index has no key columns here.
_INDEXES = """
SELECT i.relname, t.relname, x.indisunique, pg_get_expr(x.indpred, x.indrelid),
       ARRAY(SELECT a.attname FROM unnest(x.indkey) WITH ORDINALITY AS k(attnum, n)
             JOIN pg_attribute a ON a.attrelid = t.oid AND a.attnum = k.attnum
             ORDER BY k.n)
FROM pg_index x
JOIN pg_class i ON i.oid = x.indexrelid
JOIN pg_class t ON t.oid = x.indrelid
WHERE t.relname = ANY(%s) AND x.indexprs IS NULL
"""


def _project_tables() -> dict[str, list[str]]:
    """Each project table and its foreign-key columns."""
    tables: dict[str, list[str]] = {}
    for label in PROJECT_APPS:
        for model in apps.get_app_config(label).get_models():
            tables[model._meta.db_table] = [
                f.column for f in model._meta.concrete_fields if f.many_to_one
            ]
    return tables


def _indexes(tables: list[str]) -> list[tuple[str, str, bool, str | None, list[str]]]:
    with connection.cursor() as cursor:
        cursor.execute(_INDEXES, [tables])
        return cursor.fetchall()


def test_every_foreign_key_leads_an_index() -> None:
    tables = _project_tables()
    # A partial index serves a foreign key's lookups when its predicate only leaves out NULLs.
    leading = {
        (table, columns[0])
        for _, table, _, predicate, columns in _indexes(list(tables))
        if predicate is None or predicate == f"({columns[0]} IS NOT NULL)"
    }
    unindexed = [
        f"{table}.{column}"
        for table, columns in tables.items()
        for column in columns
        if (table, column) not in leading
    ]
    assert unindexed == []


def test_no_plain_index_repeats_another_index() -> None:
    indexes = _indexes(list(_project_tables()))
    redundant = [
        f"{name} ({', '.join(columns)}) is covered by {other}"
        for name, table, unique, predicate, columns in indexes
        if not unique and predicate is None
        for other, other_table, _, other_predicate, other_columns in indexes
        if other != name
        and other_table == table
        and other_predicate is None
        and other_columns[: len(columns)] == columns
        and (len(other_columns) > len(columns) or other < name)
    ]
    assert redundant == []


def test_the_step_tables_keep_their_unique_indexes() -> None:
    """The indexes that replaced the dropped ones, and the partial unique index that Django's own
    AlterField would have dropped with them (one started run per task)."""
    names = {row[0] for row in _indexes(["agents_turn", "agents_toolcall", "agents_agentrun"])}
    assert {
        "turn_index_unique",
        "toolcall_position_unique",
        "run_number_unique",
        "run_one_started_per_task",
    } <= names
    assert not names & {
        "agents_turn_task_id_52fadeb6",
        "agents_toolcall_turn_id_84231bbf",
        "agents_agentrun_task_id_28d8bb9e",
    }
