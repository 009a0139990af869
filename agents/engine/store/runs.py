"""The only writer of a run's status and of a tool call's status (`RUN_TRANSITIONS`,
`TOOL_CALL_TRANSITIONS`); the caller holds the task's row lock. (A task's status has its own
writer, `tasks.transitions`.) A call's move is a `values.Result`, whichever path writes it: the
fenced transaction (`set_calls_status`) or the step function (`call_move_json`)."""

import functools
from datetime import datetime
from typing import Any

from django.db import connection
from django.utils import timezone
from psycopg.types.json import Jsonb

from agents.engine.store import storable
from agents.engine.store.values import Result
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
    (`statement.Handoff`)."""
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
    """A person cancelled `task` (`agents.actions.task.task_cancel`, in its transaction): its
    running
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


def set_calls_status(run_id: int, moves: list[Result], now: datetime) -> None:
    """Move several tool calls of one step along TOOL_CALL_TRANSITIONS in ONE statement; every
    row must move, else TransitionNotAllowed (and the caller's transaction rolls back)."""
    if not moves:
        return
    if not connection.in_atomic_block:
        raise RuntimeError("tool-call transitions must run inside transaction.atomic()")
    sql, params = calls_status_statement(run_id, moves, now)
    moved = fastsql.execute(sql, params).rowcount  # server-bound, without Django's quoting
    if moved != len(moves):
        raise TransitionNotAllowed(
            f"{len(moves) - moved} of {len(moves)} tool calls cannot make their move"
        )


def calls_status_statement(
    run_id: int, moves: list[Result], now: datetime
) -> tuple[str, list[Any]]:
    """The UPDATE that moves `moves` (each row only from a state TOOL_CALL_TRANSITIONS allows
    into its target) and its parameters; the caller checks that every row moved. (The
    one-statement step moves its calls one by one inside its function: `call_move_json`.)"""
    params: list[Any] = [run_id]  # SQL values and Jsonb, which the stubs do not list
    for r in moves:
        params += [
            r.call.saved_pk,
            r.to,
            r.result,
            r.result_for_model,
            r.error_code,
            now if r.finished else None,
            now if r.started else None,
            r.runs,
            Jsonb(r.arguments) if r.arguments is not None else None,
            r.arguments_hash,
            _sources(r.to),
        ]
    return _calls_sql(len(moves)), params


@functools.cache
def _sources(to: str) -> list[str]:
    """The states a call may move to `to` from (TOOL_CALL_TRANSITIONS)."""
    return [str(state) for state, targets in TOOL_CALL_TRANSITIONS.items() if to in targets]


@functools.cache
def _calls_sql(rows: int) -> str:
    return _CALLS_SQL.format(rows=", ".join([_CALL_ROW] * rows))


def call_move_json(r: Result, now: datetime) -> dict[str, Any]:
    """`r` as the JSON object the step function's moves read (sql/acthelm_step.sql: a field
    left out keeps the column's value), with the states it may move from: what
    `set_calls_status` writes for the row."""
    row: dict[str, Any] = {
        "id": r.call.saved_pk,
        "status": r.to,
        "runs": r.runs,
        "sources": _sources(r.to),
    }
    for key, value in (
        ("result", r.result),
        ("rfm", r.result_for_model),
        ("code", r.error_code),
        ("finished", now if r.finished else None),
        ("started", now if r.started else None),
        ("arguments", r.arguments),
        ("hash", r.arguments_hash),
    ):
        if value is not None:
            row[key] = value
    return row
