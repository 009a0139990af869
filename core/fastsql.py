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

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg
from django.db import DEFAULT_DB_ALIAS, DatabaseError, connection, connections, models
from django.db.models.expressions import RawSQL
from django.db.models.query import ModelIterable

type Params = Sequence[Any] | Mapping[str, Any]


def sequence(model: type[models.Model]) -> str:
    """The sequence of `model`'s id column, by the name PostgreSQL gives an identity column's,
    for `nextval('<it>'::regclass)`: a constant when the statement is planned, where
    pg_get_serial_sequence() looks the catalogs up at each call. Migration agents 0018 checks
    the names the worker uses against pg_get_serial_sequence."""
    return f"{model._meta.db_table}_{model._meta.pk.column}_seq"


def _run(cursor: psycopg.Cursor[Any], sql: str, params: Params, many: bool, context: Any) -> None:
    with context["connection"].wrap_database_errors:
        cursor.execute(sql, params)


def execute(sql: str, params: Params) -> psycopg.Cursor[Any]:
    """Run `sql` on this thread's connection (opened if need be) with server-side binding;
    returns the psycopg cursor to fetch from."""
    db = connections[DEFAULT_DB_ALIAS]  # this thread's, looked up once (`connection` each time)
    with db.wrap_database_errors:
        db.ensure_connection()
        raw = db.connection
        assert raw is not None  # ensure_connection opened it
        cursor: psycopg.Cursor[Any] = psycopg.Cursor(raw)
    executor: Callable[..., Any] = functools.partial(_run, cursor)
    for wrapper in reversed(db.execute_wrappers):
        executor = functools.partial(wrapper, executor)
    executor(sql, params, False, {"connection": db, "cursor": cursor})
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


def _plain_field(field: models.Field[Any, Any]) -> bool:
    return isinstance(field, _PLAIN) and not isinstance(field, models.JSONField)


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
            columns.append(_Column(field.attname, field, stamp, prep=not _plain_field(field)))
        return cls(model._meta.db_table, tuple(columns))

    @functools.cache  # noqa: B019 (one per model and row count, for the process's life)
    def sql(self, rows: int = 1) -> str:
        names = ", ".join(connection.ops.quote_name(c.field.column or "") for c in self.columns)
        one = "(" + ", ".join(["%s"] * len(self.columns)) + ")"
        values = ", ".join([one] * rows)
        return f"INSERT INTO {self.table} ({names}) VALUES {values} RETURNING id"

    def chosen(self, given: Mapping[str, Any], now: datetime) -> list[Any]:
        """Each column's Python value: the caller's, `now` for an auto_now(_add) column, else
        the model's default."""
        out = []
        for c in self.columns:
            if c.attname in given:
                out.append(given[c.attname])
            elif c.stamp:
                out.append(now)
            else:
                out.append(c.field.get_default())
        return out

    def values(self, given: Mapping[str, Any], now: datetime) -> list[Any]:
        """`chosen`, bound as the field binds it."""
        db = connections[DEFAULT_DB_ALIAS]
        return [
            c.field.get_db_prep_save(value, db) if c.prep else value
            for c, value in zip(self.columns, self.chosen(given, now), strict=True)
        ]

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
        db = connections[DEFAULT_DB_ALIAS]
        for obj in objs:
            for c in self.columns:
                value = getattr(obj, c.attname)
                if c.stamp and value is None:
                    value = now
                    setattr(obj, c.attname, now)
                params.append(c.field.get_db_prep_save(value, db) if c.prep else value)
        cursor = execute(self.sql(len(objs)), params)
        for obj, row in zip(objs, cursor.fetchall(), strict=True):
            obj.pk = row[0]
            obj._state.adding = False
            obj._state.db = connection.alias
        return list(objs)


class Select[M: models.Model]:
    """A queryset compiled ONCE, run with other values: `Select(lambda task, run: <queryset>)`
    is compiled with a sentinel for each argument; `rows(task=1, run=2)` binds the values in
    the sentinels' places (server-side) and builds the instances through Django's own
    `ModelIterable` — select_related objects, annotations and every field's converters (JSON,
    decimals, arrays, datetimes) as the ORM would have built them. Only the compile is skipped.

    The arguments must be integers (ids) that appear in the compiled parameters as they are, or
    lists of ids: the queryset then filters with `id_list(argument)` (`pk__in=id_list(tasks)`), one
    array parameter whatever the length, so that the compiled SQL serves any number of ids."""

    #: Far below any id; each argument gets its own.
    _SENTINEL = -7_310_000_000

    def __init__(self, make: Callable[..., models.QuerySet[M, Any]], *names: str) -> None:
        self.make, self.names = make, names
        self._compiled: tuple[Any, str, list[Any], Any] | None = None
        self._converters: dict[int, Any] | None = None

    def _compile(self) -> tuple[Any, str, list[Any], Any]:
        if self._compiled is None:
            sentinels = {name: self._SENTINEL - i for i, name in enumerate(self.names)}
            queryset = self.make(**sentinels)
            compiler = queryset.query.get_compiler(using=queryset.db)
            sql, params = compiler.as_sql()
            slots = {value: name for name, value in sentinels.items()}
            template = [_slot(p, slots) for p in params]
            found = {p.name for p in template if isinstance(p, _Slot)}
            if found != set(self.names):
                raise ValueError(f"arguments {set(self.names) - found} are not parameters")
            self._compiled = (compiler, sql, template, queryset._fetch_mode)  # type: ignore[attr-defined]
        return self._compiled

    def _run(self, values: Mapping[str, int | Sequence[int]]) -> tuple[Any, Any]:
        compiler, sql, template, fetch_mode = self._compile()
        params = [_bound(p, values) if isinstance(p, _Slot) else p for p in template]
        fetched = execute(sql, params).fetchall()
        mine = copy.copy(compiler)  # this call's rows and this thread's connection
        mine.connection = connections[DEFAULT_DB_ALIAS]
        mine.execute_sql = lambda *args, **kwargs: [fetched]
        if self._converters is None:
            # The fields' converters (JSON, decimals, …; PostgreSQL's operations add none), the
            # same for every run: worked out once, not for each of the columns on every call.
            fields = [s[0] for s in mine.select[0 : mine.col_count]]
            self._converters = mine.get_converters(fields)
        converters = self._converters
        mine.get_converters = lambda expressions: converters
        return mine, fetch_mode

    def rows(self, **values: int | Sequence[int]) -> list[M]:
        """The queryset's model instances (a queryset of instances, not of values)."""
        compiler, fetch_mode = self._run(values)
        source = _Source(compiler.query.model, compiler, fetch_mode)
        return list(ModelIterable(source))  # type: ignore[arg-type]

    def tuples(self, **values: int | Sequence[int]) -> list[tuple[Any, ...]]:
        """The selected columns of each row, converted (for a `values_list`/`values` queryset:
        in its order of fields)."""
        compiler, _ = self._run(values)
        return [tuple(row) for row in compiler.results_iter()]


@dataclass(frozen=True)
class Row:
    """A model's whole row in hand-written SQL: `columns("t")` is the select list of every
    concrete column (`t.id, t.title, …`), `instance(values)` the model instance from those
    values, each through its field's converters (JSON, …) as the ORM's compiler applies them.
    What `Model.objects.raw()` does, with the columns' order, names and converters worked out
    once per model instead of at every call."""

    model: type[models.Model]
    attnames: tuple[str, ...]
    converters: tuple[tuple[int, tuple[Callable[..., Any], ...], Any], ...]

    @classmethod
    @functools.cache
    def of(cls, model: type[models.Model]) -> Row:
        db = connections[DEFAULT_DB_ALIAS]
        fields = model._meta.concrete_fields
        converters = []
        for i, field in enumerate(fields):
            col = field.get_col(model._meta.db_table)
            found = db.ops.get_db_converters(col) + col.get_db_converters(db)
            if found:
                converters.append((i, tuple(found), col))
        return cls(model, tuple(f.attname for f in fields), tuple(converters))

    def columns(self, alias: str) -> str:
        return ", ".join(
            f"{alias}.{connection.ops.quote_name(f.column or '')}"
            for f in self.model._meta.concrete_fields
        )

    def instance(self, values: Sequence[Any]) -> models.Model:
        values = list(values[: len(self.attnames)])
        db = connections[DEFAULT_DB_ALIAS]
        for i, found, col in self.converters:
            for converter in found:
                values[i] = converter(values[i], col, db)
        return self.model.from_db(db.alias, self.attnames, values)


@dataclass(frozen=True)
class _Slot:
    name: str
    many: bool = False  # a list of ids (`id_list`), bound as one array


def id_list(ids: int | Sequence[int]) -> RawSQL:
    """The right-hand side of `pk__in=` for a list of ids bound as ONE array parameter
    (`IN (SELECT unnest(%s::bigint[]))`): the SQL is the same for any number of ids, so that a
    `Select` compiles it once (and gives the argument's sentinel, an int, here)."""
    return RawSQL("SELECT unnest(%s::bigint[])", ([ids] if isinstance(ids, int) else list(ids),))


def _slot(param: Any, slots: Mapping[int, str]) -> Any:
    """A compiled parameter, or the `_Slot` of the argument whose sentinel it is."""
    if type(param) is int and param in slots:
        return _Slot(slots[param])
    if type(param) is list and len(param) == 1 and type(param[0]) is int and param[0] in slots:
        return _Slot(slots[param[0]], many=True)
    return param


def _bound(slot: _Slot, values: Mapping[str, int | Sequence[int]]) -> Any:
    value = values[slot.name]
    if slot.many != (not isinstance(value, int)):
        raise TypeError(f"{slot.name}: {'a list of ids' if slot.many else 'an id'} expected")
    return list(value) if isinstance(value, Sequence) else value


class _Source:
    """What `ModelIterable` reads of a queryset, around a compiler that has its rows."""

    _known_related_objects: dict[Any, Any] = {}  # noqa: RUF012 (read only)

    def __init__(self, model: type[models.Model], compiler: Any, fetch_mode: Any) -> None:
        self.model, self.db, self._compiler = model, connection.alias, compiler
        self.query = self
        self._fetch_mode = fetch_mode

    def get_compiler(self, using: str | None = None) -> Any:
        return self._compiler


def _plain(value: Any) -> bool:
    """A value the UPDATE binds as a parameter (not an expression or a model instance)."""
    return not (hasattr(value, "resolve_expression") or hasattr(value, "prepare_database_save"))


@dataclass(frozen=True)
class Update:
    """`UPDATE <table> SET <columns> WHERE id = … [AND <filter>]` for some fields of a model:
    the SQL Django's update compiler writes for `filter(pk=…, **where).update(**values)`, compiled
    ONCE per model, fields and filter; each value goes through its field's get_db_prep_save as
    there, but for the fields whose values psycopg binds as they are (`_PLAIN`). Only for plain
    values (no expressions, no model instances: `plain` says) and models whose fields'
    placeholders do not depend on the value (no binary or geometry field)."""

    fields: tuple[models.Field[Any, Any], ...]
    sql: str
    where: tuple[Any, ...]  # the filter's parameters; _Slot("pk") for the row's id
    prep: tuple[bool, ...]  # per field: through get_db_prep_save (as `Insert`'s columns)

    @classmethod
    @functools.cache
    def of(
        cls, model: type[models.Model], names: tuple[str, ...], where: tuple[tuple[str, Any], ...]
    ) -> Update:
        from django.db.models.sql import UpdateQuery

        fields = []
        for name in names:
            field = model._meta.get_field(name)
            assert isinstance(field, models.Field) and field.concrete and not field.primary_key
            if isinstance(field, models.BinaryField):
                raise ValueError(f"{name}: a binary field's placeholder depends on its value")
            fields.append(field)
        sentinel = Select._SENTINEL
        query = UpdateQuery(model)
        query.add_update_fields([(f, None, f.get_default()) for f in fields])
        query.add_q(models.Q(pk=sentinel, **dict(where)))
        sql, params = query.get_compiler(connection.alias).as_sql()
        given = params[len(fields) :]
        if len(params) != len(fields) + len(where) + 1 or sentinel not in given:
            raise ValueError(f"the UPDATE of {model.__name__} binds other parameters: {params}")
        slots = tuple(_Slot("pk") if p == sentinel else p for p in given)
        prep = tuple(not _plain_field(f) for f in fields)
        return cls(tuple(fields), sql, slots, prep)

    @staticmethod
    def plain(values: Sequence[Any]) -> bool:
        return all(_plain(v) for v in values)

    def run(self, pk: int, values: Sequence[Any]) -> int:
        """Update the row `pk` with `values` (in the order of the fields); the rows updated."""
        db = connections[DEFAULT_DB_ALIAS]
        params = [
            f.get_db_prep_save(v, db) if prep else v
            for f, v, prep in zip(self.fields, values, self.prep, strict=True)
        ]
        params += [pk if isinstance(p, _Slot) else p for p in self.where]
        return execute(self.sql, params).rowcount


def save(obj: models.Model) -> None:
    """`obj.save()` for a row that exists (no signals are connected to the models this writes;
    none may be): every field but the id, auto_now stamped by the field itself (`pre_save`), in
    ONE UPDATE compiled once per model. An instance with deferred fields, or a value that is an
    expression, is saved by the ORM. Raises DatabaseError when the row is gone."""
    model = type(obj)
    fields = [f for f in model._meta.concrete_fields if not f.primary_key and not f.generated]
    if obj.get_deferred_fields() or obj._state.adding:
        obj.save()
        return
    values = [f.pre_save(obj, False) for f in fields]
    if not Update.plain(values):
        obj.save()
        return
    update = Update.of(model, tuple(f.name for f in fields), ())
    if update.run(obj.pk, values) != 1:
        raise DatabaseError(f"{model.__name__} {obj.pk} was not updated: the row is gone")
