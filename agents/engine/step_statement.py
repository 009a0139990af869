"""The common step — its turns with their calls, its calls' moves, its events, the run row's usage
and checkpoint — written as ONE statement in autocommit: no BEGIN, no COMMIT, one round trip.

The statement is a data-modifying CTE. Its first part is the fence (`leases.FENCE_CTE`: the
`_HOLDS` checks on the task row it locks, and the lease renewal); the new rows' ids come from their
sequences in a one-row part drawn from the fence; the run row's UPDATE draws from those ids, and
every INSERT and the calls' UPDATE draw from the run row's UPDATE. A run that lost its task
therefore writes nothing: every part has zero rows. The last part then fails the statement on
purpose (an integer cast of a marked text) — also when the run is no longer started or a call
cannot make its move (TOOL_CALL_TRANSITIONS, checked by the UPDATE's `status = ANY(sources)`) — so
that the statement's transaction rolls back, the lease renewal with it; the caller raises
AttemptLost or TransitionNotAllowed as the transaction-per-step path does.

Ids flow inside the statement: a turn's id into its calls' `turn_id`, a call's id into an event's
`data.tool_call_id` (jsonb `||`) and into the checkpoint. The checkpoint is computed in Python
before the statement with a marker in place of each new call's id; its JSON text is cut at the
markers and put together in SQL around the ids.

What `Step` holds beyond that (memory, the conversation, approvals, reviews, artifacts, the plan,
proposals, compaction, the outcome, an event that notifies a person) keeps the fenced-transaction
path (`Recorder._commit`). The SQL is built once per shape (how many rows of each kind, where the
ids go) and cached.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, cast

from django.db import DataError, models
from django.db import connection as db
from django.db.models import Field
from django.utils import timezone

from agents.engine.leases import FENCE_CTE
from agents.engine.run_transitions import CallUpdate, calls_status_statement
from agents.engine.usage import FIELDS
from agents.models import AgentRun, ToolCall, Turn
from agents.states import TOOL_CALL_TRANSITIONS, RunStatus, ToolCallStatus
from core import fastsql
from core.actors import Actor, ActorKind
from core.exceptions import AttemptLost, TransitionNotAllowed
from tasks.models import TaskEvent
from tasks.notify.outbox import notification_of

log = logging.getLogger("acthelm.tasks")

if TYPE_CHECKING:
    from agents.engine.recorder import CallState, NewCall, Result, Step

#: What the last part of the statement casts to an integer when a move or the run row failed.
_REFUSED = "acthelm step refused"
_REFUSED_RE = re.compile(_REFUSED + r": held (\d+), run (\d+), moved (\d+)")
#: A new call's id in the checkpoint's JSON text, until the statement puts the id there. A NUL
#: cannot be stored in jsonb, so no checkpoint holds one; the nonce makes it this process's own.
_NONCE = secrets.token_hex(8)
_MARK_RE = re.compile(r'"\\u0000' + _NONCE + r':(\d+)"')


class _NewId:
    """Stands for a new call's id while the checkpoint is computed."""

    __slots__ = ("k",)

    def __init__(self, k: int) -> None:
        self.k = k


class _Encoder(json.JSONEncoder):
    def default(self, o: Any) -> Any:
        if isinstance(o, _NewId):
            return f"\x00{_NONCE}:{o.k}"
        return super().default(o)


def _cast(field: Field[Any, Any]) -> str:
    """The type a parameter of this column is cast to: the column's, a varchar without its length
    (so that a value too long fails as an INSERT's would, never cut)."""
    db_type = field.db_type(db) or "text"
    return re.sub(r"^varchar\(\d+\)$", "varchar", db_type)


@dataclass(frozen=True)
class _Table:
    """An INSERT's columns (fastsql.Insert's, the id first) and each parameter's SQL."""

    insert: fastsql.Insert
    names: str
    casts: tuple[str, ...]
    index: dict[str, int]

    @classmethod
    @functools.cache
    def of(cls, model: type[models.Model]) -> _Table:
        insert = fastsql.Insert.of(model)
        names = ", ".join(
            ["id", *(db.ops.quote_name(c.field.column or "") for c in insert.columns)]
        )
        casts = tuple(f"%s::{_cast(c.field)}" for c in insert.columns)
        index = {c.attname: i for i, c in enumerate(insert.columns)}
        return cls(insert, names, casts, index)

    def row(self, id_sql: str, replace: dict[str, str]) -> str:
        """One row's SQL: the id's expression, then a parameter per column but those replaced."""
        sqls = list(self.casts)
        for attname, sql in replace.items():
            sqls[self.index[attname]] = sql
        return "(" + ", ".join([id_sql, *sqls]) + ")"

    def values(self, given: dict[str, Any], now: datetime, skip: tuple[str, ...] = ()) -> list[Any]:
        out = self.insert.values(given, now)
        for attname in skip:
            del out[self.index[attname]]  # in its place, SQL (skip is in column order, reversed)
        return out


@dataclass(frozen=True)
class _Shape:
    turns: int
    calls: tuple[int, ...]  # each new call's turn (its position in the step's turns)
    moves: int
    events: tuple[int | None, ...]  # each event's new call, if it names one
    checkpoint: tuple[int, ...]  # the new calls whose ids the checkpoint's text holds, in order
    answer: bool


@functools.cache
def _usage_sets() -> str:
    """The step's usage added to the run row, column by column (as `recorder._run_update`)."""
    sets = []
    for usage in FIELDS:
        f = AgentRun._meta.get_field(usage.name)
        assert isinstance(f, Field)  # a column of the run row
        sets.append(f"{f.column} = {f.column} + %s::{f.db_type(db)}")
    return ", ".join(sets)


@functools.cache
def _sql(shape: _Shape) -> str:
    seq = "nextval(pg_get_serial_sequence('{table}', 'id'))"
    ids = [f"{seq.format(table=Turn._meta.db_table)} AS t{i}" for i in range(shape.turns)]
    ids += [f"{seq.format(table=ToolCall._meta.db_table)} AS c{k}" for k in range(len(shape.calls))]
    parts = [
        f"fence AS ({FENCE_CTE})",
        f"ids AS (SELECT {', '.join(['1 AS one', *ids])} FROM fence)",
    ]

    usage = _usage_sets()
    pieces = ["%s::text"]
    for k in shape.checkpoint:
        pieces += [f"ids.c{k}::text", "%s::text"]
    sets = [usage, f"checkpoint = concat({', '.join(pieces)})::jsonb"]
    if shape.answer:
        sets += ["answer = %s::text", "answer_stored_at = %s::timestamptz"]
    parts.append(
        f"run AS (UPDATE agents_agentrun SET {', '.join(sets)} FROM ids "
        f"WHERE id = %s AND status = '{RunStatus.STARTED}' RETURNING 1 AS one)"
    )
    if shape.turns:
        turns = _Table.of(Turn)
        rows = ", ".join(turns.row(f"ids.t{i}", {}) for i in range(shape.turns))
        parts.append(
            f"turns AS (INSERT INTO {turns.insert.table} ({turns.names}) "
            f"SELECT v.* FROM run, ids, LATERAL (VALUES {rows}) AS v)"
        )
    if shape.calls:
        calls = _Table.of(ToolCall)
        rows = ", ".join(
            calls.row(f"ids.c{k}", {"turn_id": f"ids.t{turn}"})
            for k, turn in enumerate(shape.calls)
        )
        parts.append(
            f"calls AS (INSERT INTO {calls.insert.table} ({calls.names}) "
            f"SELECT v.* FROM run, ids, LATERAL (VALUES {rows}) AS v)"
        )
    if shape.moves:
        moves, _ = calls_status_statement(0, [CallUpdate(0, "")] * shape.moves, gate="run, ")
        parts.append(f"moved AS ({moves} RETURNING c.id)")
    if shape.events:
        events = _Table.of(TaskEvent)
        row_sqls = []
        for call in shape.events:
            data = (
                {"data": f"(%s::jsonb || jsonb_build_object('tool_call_id', ids.c{call}))"}
                if call is not None
                else {}
            )
            row_sqls.append(events.row(seq.format(table=events.insert.table), data))
        parts.append(
            f"events AS (INSERT INTO {events.insert.table} ({events.names}) "
            f"SELECT v.* FROM run, ids, LATERAL (VALUES {', '.join(row_sqls)}) AS v)"
        )
    held = "count(f.status)"  # 1 when the fence held; an aggregate has its one row either way
    run_count = "(SELECT count(*) FROM run)"
    moved = "(SELECT count(*) FROM moved)" if shape.moves else "0"
    check = (
        f"CASE WHEN {held} = 1 AND {run_count} = 1 AND {moved} = {shape.moves} THEN 0 "
        f"ELSE ('{_REFUSED}: held ' || {held} || ', run ' || {run_count} || ', moved ' || "
        f"{moved})::int END"
    )
    returned = ["min(f.status)", check, *(f"min(ids.c{k})" for k in range(len(shape.calls)))]
    return (
        f"WITH {', '.join(parts)} SELECT {', '.join(returned)} FROM fence f LEFT JOIN ids ON true"
    )


@dataclass
class _Plan:
    """The step laid out for the statement: new calls (with the Result that moves each, if one
    does), moves of saved calls, events."""

    new: list[tuple[int, NewCall, Result | None]]
    moves: list[Result]


def plan(step: Step, actor: Actor) -> _Plan | None:
    """The step as one statement, or None when it holds anything the statement does not write
    (then the fenced-transaction path writes it, and refuses what it refuses)."""
    if (
        step.memory_chosen
        or step.memory_from_run is not None
        or step.system_prompt is not None
        or step.tool_pins is not None
        or step.clear_feedback
        or step.artifacts
        or step.plan is not None
        or step.proposals
        or step.compaction is not None
        or actor.kind == ActorKind.PERSON
    ):
        return None
    new: list[tuple[int, NewCall, Result | None]] = []
    by_state: dict[int, int] = {}
    for i, turn in enumerate(step.turns):
        for c in turn.calls:
            if c.approval is not None or c.state.pk is not None:
                return None
            by_state[id(c.state)] = len(new)
            new.append((i, c, None))
    moves: list[Result] = []
    moved: set[int] = set()
    for r in step.results:
        if r.approval is not None or r.unknown or id(r.call) in moved:
            return None
        moved.add(id(r.call))
        k = by_state.get(id(r.call))
        if k is not None:
            turn_at, c, _ = new[k]
            # Inserted in its state, then moved: the move must be one the table allows.
            if r.to not in TOOL_CALL_TRANSITIONS[c.state.status]:
                return None
            new[k] = (turn_at, c, r)
        elif r.call.pk is None:
            return None
        else:
            moves.append(r)
    for e in step.events:
        if notification_of(e.kind, e.data) is not None:
            return None
    return _Plan(new, moves)


def _call_row(
    task_id: int, run_id: int, c: NewCall, r: Result | None, now: datetime
) -> dict[str, Any]:
    """A new call's row: as inserted, then as its Result in this step moves it (what
    `set_calls_status` would write over the inserted row)."""
    s = c.state
    row: dict[str, Any] = {
        "task_id": task_id,
        "run_id": run_id,
        "position": s.position,
        "call_id": s.call_id,
        "tool": s.tool[:100],
        "arguments": s.arguments,
        "arguments_raw": s.arguments_raw[:100_000],
        "arguments_hash": s.arguments_hash,
        "recovery_class": s.recovery_class,
        "status": s.status,
        "error_code": s.error_code,
        "result": c.result,
        "result_for_model": s.result_for_model,
        "finished_at": now if s.status == ToolCallStatus.REFUSED else None,
    }
    if r is not None:
        row["status"] = r.to
        for key, value in (
            ("result", r.result),
            ("result_for_model", r.result_for_model),
            ("error_code", r.error_code),
            ("arguments", r.arguments),
            ("arguments_hash", r.arguments_hash),
        ):
            if value is not None:
                row[key] = value
        if r.finished:
            row["finished_at"] = now
        if r.started:
            row["started_at"] = now
        row["run_count"] = r.runs
    return row


def write(
    p: _Plan,
    step: Step,
    *,
    task_id: int,
    run_id: int,
    actor: Actor,
    lease: float,
    checkpoint: Callable[[], dict[str, Any]],
) -> str:
    """Write the planned step in one autocommitted statement; the task's status. AttemptLost when
    the run no longer holds its task (nothing written), TransitionNotAllowed when a call cannot
    make its move (nothing written)."""
    now = timezone.now()
    states: list[CallState] = [c.state for _, c, _ in p.new]
    index = {id(s): k for k, s in enumerate(states)}

    # The checkpoint, with a marker where a new call's id goes.
    for k, s in enumerate(states):
        s.pk = cast(int, _NewId(k))
    try:
        text = json.dumps(checkpoint(), cls=_Encoder)
    finally:
        for s in states:
            s.pk = None
    cut = _MARK_RE.split(text)
    texts, marks = cut[0::2], tuple(int(k) for k in cut[1::2])

    params: list[Any] = [lease, task_id, run_id]
    params += [getattr(step.usage, f.name) for f in FIELDS]
    params += texts
    if step.answer is not None:
        params += [step.answer, now]
    params.append(run_id)
    turns = _Table.of(Turn)
    for t in step.turns:
        params += turns.values(
            {
                "task_id": task_id,
                "run_id": run_id,
                "index": t.index,
                "role": t.role,
                "content": t.content,
                "stop_reason": t.stop_reason,
                "discarded": t.discarded,
                "input_tokens": t.input_tokens,
                "output_tokens": t.output_tokens,
                "cached_input_tokens": t.cached_input_tokens,
                "cache_write_tokens": t.cache_write_tokens,
                "cost": t.cost,
            },
            now,
        )
    calls = _Table.of(ToolCall)
    for _, c, r in p.new:
        params += calls.values(_call_row(task_id, run_id, c, r, now), now, skip=("turn_id",))
    if p.moves:
        _, move_params = calls_status_statement(
            run_id,
            [r.update(now) for r in p.moves],
        )
        params += move_params
    events = _Table.of(TaskEvent)
    event_calls: list[int | None] = []
    for e in step.events:
        new_call = index.get(id(e.call)) if e.call is not None else None
        event_calls.append(new_call)
        data = e.data
        if e.call is not None and new_call is None:
            data = {**e.data, "tool_call_id": e.call.pk}
        params += events.values(
            {
                "task_id": task_id,
                "run_id": run_id,
                "kind": e.kind,
                "actor_kind": actor.kind,
                "actor_label": actor.label,
                "data": data,
            },
            now,
        )
    shape = _Shape(
        turns=len(step.turns),
        calls=tuple(turn for turn, _, _ in p.new),
        moves=len(p.moves),
        events=tuple(event_calls),
        checkpoint=marks,
        answer=step.answer is not None,
    )
    try:
        row = fastsql.execute(_sql(shape), params).fetchone()
    except DataError as exc:
        found = _REFUSED_RE.search(str(exc))
        if found is None:
            raise
        if found.group(1) != "1" or found.group(2) != "1":
            log.warning("run.fenced_out", extra={"task_id": task_id, "run_id": run_id})
            raise AttemptLost(f"run {run_id} no longer holds task {task_id}") from None
        raise TransitionNotAllowed(
            f"{len(p.moves) - int(found.group(3))} of {len(p.moves)} tool calls cannot make "
            "their move"
        ) from None
    assert row is not None  # an aggregate's one row
    for s, pk in zip(states, row[2:], strict=True):
        s.pk = pk
    status: str = row[0]
    return status
