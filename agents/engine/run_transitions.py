"""The only writer of a run's status and of a tool call's status (`RUN_TRANSITIONS`,
`TOOL_CALL_TRANSITIONS`); the caller holds the task's row lock. (A task's status has its own
writer, `tasks.transitions`.)"""

import functools
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone
from psycopg.types.json import Jsonb

from agents.engine import storable
from agents.models import AgentRun, ToolCall
from agents.states import (
    RUN_TRANSITIONS,
    TOOL_CALL_TRANSITIONS,
    FailureCode,
    RunStatus,
    ToolCallStatus,
)
from core import fastsql
from core.exceptions import TransitionNotAllowed
from tasks.models import Task


def end_values(status: str, now: datetime, **fields: object) -> dict[str, object]:
    """The run row's columns as a started run ends as `status` at `now` (its text fields made
    storable). TransitionNotAllowed for a status a started run cannot end as. What `finish_run`
    writes, and what a run writes when it ends in its last step's statement
    (agents.engine.step_statement.Handoff)."""
    if status not in RUN_TRANSITIONS[RunStatus.STARTED]:
        raise TransitionNotAllowed(f"a run cannot finish as {status}")
    stored = {k: storable.text(v) if isinstance(v, str) else v for k, v in fields.items()}
    return {"status": status, "finished_at": now, **stored}


def finish_run(run: AgentRun | int, status: str, **fields: object) -> None:
    """Move a started run to succeeded, failed or cancelled, with its result fields."""
    if not connection.in_atomic_block:
        raise RuntimeError("run transitions must run inside transaction.atomic()")
    run_id = run.pk if isinstance(run, AgentRun) else run
    values = end_values(status, timezone.now(), **fields)
    if fastsql.Update.plain(list(values.values())):
        # The worker ends every run here: SQL built once per set of fields (fastsql.Update).
        update = fastsql.Update.of(AgentRun, tuple(values), (("status", RunStatus.STARTED),))
        updated = update.run(run_id, list(values.values()))
    else:
        updated = AgentRun.objects.filter(pk=run_id, status=RunStatus.STARTED).update(**values)
    if updated != 1:
        raise TransitionNotAllowed(f"run {run_id} is not started; it cannot become {status}")
    if isinstance(run, AgentRun):
        run.status = status
        for name in fields:
            setattr(run, name, values[name])


def end_started_runs(task_id: int, status: str, **fields: object) -> list[int]:
    """A person's action ends whatever attempt was running (the worker notices at its heartbeat)."""
    ids = list(
        AgentRun.objects.filter(task_id=task_id, status=RunStatus.STARTED).values_list(
            "id", flat=True
        )
    )
    for run_id in ids:
        finish_run(run_id, status, **fields)
    return ids


def settle_for_cancelled_task(task: Task, reason: str = "") -> dict[str, list[int]]:
    """A person cancelled `task` (`tasks.services.task_cancel`, in its transaction): its running
    attempt ends now (its worker notices at its next safe point or heartbeat), and an external
    call in flight may have taken effect, so its outcome is unknown, never left "running" (the
    run that made it is over and writes nothing more). Returns what the cancel's event records."""
    runs = end_started_runs(task.pk, RunStatus.CANCELLED, error_code=FailureCode.CANCELLED)
    in_flight = list(
        ToolCall.objects.filter(task=task, status=ToolCallStatus.RUNNING).values_list(
            "pk", flat=True
        )
    )
    for call_id in in_flight:
        set_call_status(
            call_id,
            ToolCallStatus.UNKNOWN,
            error_code="cancelled_in_flight",
            finished_at=timezone.now(),
        )
    return {"runs_cancelled": runs, "calls_in_flight": in_flight}


def set_call_status(call: ToolCall | int, to: str, **fields: object) -> None:
    """Move a tool call along TOOL_CALL_TRANSITIONS with its result fields, in one conditional
    UPDATE; the caller is in the transaction that holds the task's lock (a fenced write, or a
    person's decision)."""
    if not connection.in_atomic_block:
        raise RuntimeError("tool-call transitions must run inside transaction.atomic()")
    call_id = call.pk if isinstance(call, ToolCall) else call
    sources = [state for state, targets in TOOL_CALL_TRANSITIONS.items() if to in targets]
    updated = ToolCall.objects.filter(pk=call_id, status__in=sources).update(status=to, **fields)
    if updated != 1:
        raise TransitionNotAllowed(f"tool call {call_id} cannot become {to}")
    if isinstance(call, ToolCall):
        call.status = to
        for name, value in fields.items():
            setattr(call, name, value)


@dataclass
class CallUpdate:
    """One tool call's move with its result fields, for `set_calls_status`. None keeps a field."""

    call_id: int
    to: str
    result: str | None = None
    result_for_model: str | None = None
    error_code: str | None = None
    finished_at: datetime | None = None
    started_at: datetime | None = None
    runs: int = 0
    arguments: dict[str, Any] | None = None
    arguments_hash: str | None = None


_CALLS_SQL = """
UPDATE agents_toolcall c SET
    status = v.status,
    result = coalesce(v.result, c.result),
    result_for_model = coalesce(v.rfm, c.result_for_model),
    error_code = coalesce(v.code, c.error_code),
    finished_at = coalesce(v.finished, c.finished_at),
    started_at = coalesce(v.started, c.started_at),
    run_count = c.run_count + v.runs,
    arguments = coalesce(v.arguments, c.arguments),
    arguments_hash = coalesce(v.hash, c.arguments_hash),
    run_id = %s
FROM (VALUES {rows}) AS v(id, status, result, rfm, code, finished, started, runs, arguments,
                               hash, sources)
WHERE c.id = v.id AND c.status = ANY(v.sources)
"""
_CALL_ROW = (
    "(%s::bigint, %s::varchar, %s::text, %s::text, %s::varchar, %s::timestamptz, "
    "%s::timestamptz, %s::int, %s::jsonb, %s::varchar, %s::varchar[])"
)


def set_calls_status(run_id: int, updates: list[CallUpdate]) -> None:
    """Move several tool calls of one step along TOOL_CALL_TRANSITIONS in ONE statement; every
    row must move, else TransitionNotAllowed (and the caller's transaction rolls back)."""
    if not updates:
        return
    if not connection.in_atomic_block:
        raise RuntimeError("tool-call transitions must run inside transaction.atomic()")
    sql, params = calls_status_statement(run_id, updates)
    moved = fastsql.execute(sql, params).rowcount  # server-bound, without Django's quoting
    if moved != len(updates):
        raise TransitionNotAllowed(
            f"{len(updates) - moved} of {len(updates)} tool calls cannot make their move"
        )


def calls_status_statement(run_id: int, updates: list[CallUpdate]) -> tuple[str, list[Any]]:
    """The UPDATE that moves `updates` (each row only from a state TOOL_CALL_TRANSITIONS allows
    into its target) and its parameters; the caller checks that every row moved. (The
    one-statement step moves its calls one by one inside its function: `call_move_from_record`.)"""
    params: list[Any] = [run_id]  # SQL values and Jsonb, which the stubs do not list
    for u in updates:
        params += [
            u.call_id,
            u.to,
            u.result,
            u.result_for_model,
            u.error_code,
            u.finished_at,
            u.started_at,
            u.runs,
            Jsonb(u.arguments) if u.arguments is not None else None,
            u.arguments_hash,
            _sources(u.to),
        ]
    return _calls_sql(len(updates)), params


@functools.cache
def _sources(to: str) -> list[str]:
    """The states a call may move to `to` from (TOOL_CALL_TRANSITIONS)."""
    return [str(state) for state, targets in TOOL_CALL_TRANSITIONS.items() if to in targets]


@functools.cache
def _calls_sql(rows: int) -> str:
    return _CALLS_SQL.format(rows=", ".join([_CALL_ROW] * rows))


#: A move's fields as `call_move_from_record` reads them: the columns of a record taken from a
#: jsonb object (`jsonb_to_recordset(...) AS m(<this>)`), one per CallUpdate field.
CALL_MOVE_RECORD = (
    "id bigint, status varchar, result text, rfm text, code varchar,\n      "
    "finished timestamptz, started timestamptz, runs integer, arguments jsonb,\n      "
    "hash varchar, sources varchar[]"
)


def call_move_from_record(record: str, run: str) -> str:
    """One call's move (what `set_calls_status` writes for a row) as an UPDATE of the call whose
    fields are the record variable `record` (columns `CALL_MOVE_RECORD`), by the run `run` (an
    SQL expression): only from a state TOOL_CALL_TRANSITIONS allows into its target (`sources`,
    as `call_move_json` gives it); the caller checks that the row moved. The step function of
    `agents.engine.step_statement` runs it once per call (by id: a set-based UPDATE there got a
    cached hash-join plan that was slow)."""
    m = record
    return f"""UPDATE agents_toolcall c SET
    status = {m}.status,
    result = coalesce({m}.result, c.result),
    result_for_model = coalesce({m}.rfm, c.result_for_model),
    error_code = coalesce({m}.code, c.error_code),
    finished_at = coalesce({m}.finished, c.finished_at),
    started_at = coalesce({m}.started, c.started_at),
    run_count = c.run_count + {m}.runs,
    arguments = coalesce({m}.arguments, c.arguments),
    arguments_hash = coalesce({m}.hash, c.arguments_hash),
    run_id = {run}
  WHERE c.id = {m}.id AND c.status = ANY({m}.sources)"""


def call_move_json(u: CallUpdate) -> dict[str, Any]:
    """`u` as the JSON object `call_move_from_record` reads (a field left None is left out: the
    UPDATE keeps the column's value), with the states it may move from."""
    row: dict[str, Any] = {
        "id": u.call_id,
        "status": u.to,
        "runs": u.runs,
        "sources": _sources(u.to),
    }
    for key, value in (
        ("result", u.result),
        ("rfm", u.result_for_model),
        ("code", u.error_code),
        ("finished", u.finished_at),
        ("started", u.started_at),
        ("arguments", u.arguments),
        ("hash", u.arguments_hash),
    ):
        if value is not None:
            row[key] = value
    return row
