"""The run store's database functions, `acthelm_step` and `acthelm_claim`, rendered from their
templates in `sql/`: each `{{name}}` is filled from the enums (a status as a quoted literal, never
typed into SQL), the SQLSTATEs the store raises, and the models' column lists.

A migration never renders them: it applies the text frozen as it was then
(agents/migrations/sql/<migration>_<function>.sql, with its SHA-256 recorded in the migration).
tests/agents/test_store_functions.py fails when what these render is not the newest frozen text
(a change needs a new migration) or when a frozen text changed (an old migration's never does)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from django.db import connection as db
from django.db import models
from django.db.models import Field

from agents.engine.store.claim import EVENT_COLUMNS, RUN_COLUMNS
from agents.engine.store.fence import fence_lock
from agents.engine.store.literal import literal
from agents.engine.store.usage import FIELDS
from agents.models import AgentRun, Conversation, ToolCall, Turn
from agents.states import RunStatus
from core import fastsql
from tasks.models import Task, TaskEvent
from tasks.states import TaskStatus

DIR = Path(__file__).resolve().parent / "sql"
_PLACEHOLDER = re.compile(r"\{\{(\w+)\}\}")

#: The function's arguments and results (a migration that changes them drops it first).
STEP_IDENTITY = "acthelm_step(bigint, bigint, text[], integer[], text, timestamptz, jsonb)"

#: The SQLSTATEs the step function raises: the run is no longer started; a call cannot make its
#: move.
NOT_STARTED = "AH001"
REFUSED = "AH002"

#: The columns a hand-off (`statement.Handoff`) may write: of the run, as it ends; of the task,
#: as it moves. One the hand-off does not give keeps its value.
HANDOFF_RUN_COLUMNS = (
    "status",
    "finished_at",
    "verdict",
    "verdict_reason",
    "answer",
    "error_code",
    "error_message",
)
HANDOFF_TASK_COLUMNS = (
    "status",
    "lease_owner",
    "lease_expires_at",
    "failure_code",
    "failure_message",
    "updated_at",
)


def render(name: str, values: dict[str, str]) -> str:
    """The template `sql/<name>` with each `{{key}}` replaced by `values[key]`, its leading
    comment lines (the template's own) left out. Every placeholder must have a value and every
    value a placeholder: a typo fails here, not in the database."""
    lines = (DIR / name).read_text(encoding="utf-8").removesuffix("\n").split("\n")
    while lines and lines[0].startswith("--"):
        lines.pop(0)
    template = "\n".join(lines)
    used = set(_PLACEHOLDER.findall(template))
    if used != set(values):
        raise KeyError(f"{name}: placeholders {sorted(used)}, values {sorted(values)}")
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


def _cast(field: Field[Any, Any]) -> str:
    """The type a value of this column is read as: the column's, a varchar without its length
    (so that a value too long fails as an INSERT's would, never cut)."""
    db_type = field.db_type(db) or "text"
    return re.sub(r"^varchar\(\d+\)$", "varchar", db_type)


def _columns(model: type[models.Model], skip: tuple[str, ...] = ()) -> list[tuple[str, str]]:
    """The columns a step inserts into `model`'s table (all but the id; `fastsql.Insert`'s), each
    with the type its value is read as from JSON."""
    return [
        (c.field.column or "", _cast(c.field))
        for c in fastsql.Insert.of(model).columns
        if c.attname not in skip
    ]


def _insert(
    model: type[models.Model],
    key: str,
    first: list[tuple[str, str, str]],
    replace: dict[str, str],
    skip: tuple[str, ...] = (),
) -> str:
    """INSERT of the step's `key` rows into `model`'s table: `first` are extra (column, SQL,
    record field definition) pairs (the id from the drawn ones), `replace` a column's SQL in place
    of its value (the turn id of a call, the event's data with its call's id)."""
    table = model._meta.db_table
    cols = _columns(model)
    record = [f'"{c}" {t}' for c, t in _columns(model, skip)] + [d for _, _, d in first if d]
    names = [c for c, _, _ in first if c] + [f'"{c}"' for c, _ in cols]
    values = [v for c, v, _ in first if c] + [replace.get(c, f'r."{c}"') for c, _ in cols]
    sep = ",\n      "
    return (
        f"    INSERT INTO {table} (\n      {sep.join(names)})\n"
        f"    SELECT\n      {sep.join(values)}\n"
        f"    FROM jsonb_to_recordset(p_step->'{key}') AS r(\n      {sep.join(record)});"
    )


def column(model: type[models.Model], name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.column  # a concrete column of the row
    return field.column


def _handoff_sets(model: type[models.Model], alias: str, names: tuple[str, ...], key: str) -> str:
    """`column = <the hand-off's value, if it gives one, else the row's>` for each of `names`,
    the value `v` read from the hand-off's `key` object by jsonb_populate_record (so in the
    column's own type)."""
    sets = []
    for name in names:
        c = column(model, name)
        sets.append(f"{c} = CASE WHEN v_handoff->'{key}' ? '{c}' THEN v.{c} ELSE {alias}.{c} END")
    return ",\n      ".join(sets)


def step_function_sql() -> str:
    """`CREATE OR REPLACE FUNCTION acthelm_step(...)` as the template and the models make it
    today (sql/acthelm_step.sql).

    What it does, in the caller's one autocommitted statement: the fence (`fence.fence_lock`);
    a run that lost its task gets no status back and nothing is written. Then the run row's usage
    and checkpoint (and answer), only while it is started (else SQLSTATE AH001), the task's
    conversation with its first step, the turns and the new calls (ids from their sequences: a
    turn's id into its calls' turn_id, a new call's id into the checkpoint's text and into its
    event's data.tool_call_id), each saved call's move by id (one it cannot make: SQLSTATE
    AH002), the events, and the run's end with the task's move when it is a hand-off. Either
    error rolls the whole statement back."""
    usage = []
    for u in FIELDS:
        f = AgentRun._meta.get_field(u.name)
        assert isinstance(f, Field)  # a column of the run row
        usage.append(f"{f.column} = {f.column} + (v_usage->>'{u.name}')::{f.db_type(db)}")
    fence = fence_lock(task="p_task", run="p_run").strip().replace("\n", "\n    ")
    return render(
        "acthelm_step.sql",
        {
            "fence": fence,
            "usage": ",\n      ".join(usage),
            "started": literal(RunStatus.STARTED),
            "not_started": literal(NOT_STARTED),
            "refused": literal(REFUSED),
            "insert_conversation": _insert(Conversation, "conversation", [], {}),
            "insert_turns": _insert(Turn, "turns", [("id", "v_turns[r._i]", "_i integer")], {}),
            "insert_calls": _insert(
                ToolCall,
                "calls",
                [("id", "v_calls[r._k]", "_k integer"), ("", "", "_turn integer")],
                {"turn_id": "v_turns[r._turn]"},
                skip=("turn_id",),
            ),
            "insert_events": _insert(
                TaskEvent,
                "events",
                [("", "", "_call integer")],  # its new call's id goes into data.tool_call_id
                {
                    "data": "CASE WHEN r._call IS NULL THEN r.data "
                    "ELSE r.data || jsonb_build_object('tool_call_id', v_calls[r._call]) END"
                },
            ),
            "run_end": _handoff_sets(AgentRun, "r", HANDOFF_RUN_COLUMNS, "run"),
            "task_move": _handoff_sets(Task, "t", HANDOFF_TASK_COLUMNS, "task"),
        },
    )


def _insert_columns(
    model: type[models.Model], given: dict[str, str], alias: str
) -> tuple[str, str]:
    """Column list and SELECT expressions for an INSERT … SELECT of `model` inside the claim
    function: `given` maps columns to SQL; every other column is read from `alias`, the row of the
    model's defaults the caller passes (`claim.defaults`)."""
    columns: list[str] = []
    values: list[str] = []
    for field in model._meta.concrete_fields:
        c = field.column
        assert c is not None  # a concrete field has a column
        columns.append(c)
        values.append(given.get(c, f'{alias}."{c}"'))
    return ", ".join(columns), ", ".join(values)


def claim_function_sql() -> str:
    """`CREATE OR REPLACE FUNCTION acthelm_claim(...)` as the template and the models make it
    today (sql/acthelm_claim.sql): the run's and the claim event's columns
    (`claim.RUN_COLUMNS`, `claim.EVENT_COLUMNS`)."""
    run_columns, run_values = _insert_columns(AgentRun, RUN_COLUMNS, "run_default")
    event_columns, event_values = _insert_columns(TaskEvent, EVENT_COLUMNS, "event_default")
    return render(
        "acthelm_claim.sql",
        {
            "ready": literal(TaskStatus.READY),
            "done": literal(TaskStatus.DONE),
            "in_progress": literal(TaskStatus.IN_PROGRESS),
            "run_columns": run_columns,
            "run_values": run_values,
            "event_columns": event_columns,
            "event_values": event_values,
        },
    )
