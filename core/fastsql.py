"""Statements a worker runs on every step, without the ORM's compile: SQL built once per model,
parameters bound by the server (psycopg's `Cursor`), on Django's own connection and in its
transaction. Not prepared unless the database's OPTIONS set `prepare_threshold` (Django leaves it
unset so that a transaction-mode pooler works; psycopg then uses the connection's threshold).

What the ORM would add per statement — compiling the query, the client-side quoting of Django's
`ClientCursor` — is most of a step's CPU at a few milliseconds a step. Everything else that
Django's cursor does stays: its execute wrappers run (the benchmarks count statements through
them), psycopg's errors become Django's (`OperationalError`, `IntegrityError`, …, which the worker
tells apart), and a statement runs inside the caller's `transaction.atomic()` like any other.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from django.db import connection, models

type Params = Sequence[Any] | Mapping[str, Any]


def _run(cursor: psycopg.Cursor[Any], sql: str, params: Params, many: bool, context: Any) -> None:
    with connection.wrap_database_errors:
        cursor.execute(sql, params)


def execute(sql: str, params: Params) -> psycopg.Cursor[Any]:
    """Run `sql` on this thread's connection (opened if need be) with server-side binding;
    returns the psycopg cursor to fetch from."""
    with connection.wrap_database_errors:
        connection.ensure_connection()
        raw = connection.connection
        assert raw is not None  # ensure_connection opened it
        cursor: psycopg.Cursor[Any] = psycopg.Cursor(raw)
    executor: Callable[..., Any] = functools.partial(_run, cursor)
    for wrapper in reversed(connection.execute_wrappers):
        executor = functools.partial(wrapper, executor)
    executor(sql, params, False, {"connection": connection, "cursor": cursor})
    return cursor


@dataclass(frozen=True)
class _Column:
    attname: str
    field: models.Field[Any, Any]
    stamp: bool  # auto_now / auto_now_add: the caller's `now` when not given
    # Whether a value goes through the field's get_db_prep_save: JSON (Jsonb with the field's
    # encoder) and anything but the plain types psycopg adapts as they are.
    prep: bool


#: Fields whose Python values psycopg binds as they are (their get_db_prep_save only returns
#: the value: no conversion to skip).
_PLAIN = (
    models.CharField,
    models.TextField,
    models.IntegerField,
    models.BooleanField,
    models.FloatField,
    models.DateTimeField,
    models.ForeignKey,
)


@dataclass(frozen=True)
class Insert:
    """`INSERT INTO <table> (every concrete column but the id) VALUES (…) RETURNING id` for a
    model: the values the caller gives (by attname: `task_id`, not `task`), the model's defaults
    for the rest, the caller's `now` for auto_now(_add) columns — what `bulk_create` would
    write, without building model instances or compiling a query."""

    table: str
    columns: tuple[_Column, ...]

    @classmethod
    @functools.cache
    def of(cls, model: type[models.Model]) -> Insert:
        columns = []
        for field in model._meta.concrete_fields:
            if field.primary_key:
                continue
            stamp = bool(getattr(field, "auto_now", False) or getattr(field, "auto_now_add", False))
            plain = isinstance(field, _PLAIN) and not isinstance(field, models.JSONField)
            columns.append(_Column(field.attname, field, stamp, prep=not plain))
        return cls(model._meta.db_table, tuple(columns))

    @functools.cache  # noqa: B019 (one per model and row count, for the process's life)
    def sql(self, rows: int = 1) -> str:
        names = ", ".join(connection.ops.quote_name(c.field.column or "") for c in self.columns)
        one = "(" + ", ".join(["%s"] * len(self.columns)) + ")"
        values = ", ".join([one] * rows)
        return f"INSERT INTO {self.table} ({names}) VALUES {values} RETURNING id"

    def values(self, given: Mapping[str, Any], now: datetime) -> list[Any]:
        out = []
        for c in self.columns:
            if c.attname in given:
                value = given[c.attname]
            elif c.stamp:
                value = now
            else:
                value = c.field.get_default()
            out.append(c.field.get_db_prep_save(value, connection) if c.prep else value)
        return out

    def rows(self, rows: Sequence[Mapping[str, Any]], now: datetime) -> list[int]:
        """Insert `rows` in one statement; their ids, in order."""
        if not rows:
            return []
        params: list[Any] = []
        for given in rows:
            params += self.values(given, now)
        cursor = execute(self.sql(len(rows)), params)
        return [row[0] for row in cursor.fetchall()]

    def instances[M: models.Model](self, objs: Sequence[M], now: datetime) -> list[M]:
        """Insert unsaved model instances in one statement (what `bulk_create` does for them):
        their values as set, `now` for an auto_now(_add) column left empty; sets each one's id
        and marks it saved."""
        if not objs:
            return []
        params: list[Any] = []
        for obj in objs:
            for c in self.columns:
                value = getattr(obj, c.attname)
                if c.stamp and value is None:
                    value = now
                    setattr(obj, c.attname, now)
                params.append(c.field.get_db_prep_save(value, connection) if c.prep else value)
        cursor = execute(self.sql(len(objs)), params)
        for obj, row in zip(objs, cursor.fetchall(), strict=True):
            obj.pk = row[0]
            obj._state.adding = False
            obj._state.db = connection.alias
        return list(objs)
