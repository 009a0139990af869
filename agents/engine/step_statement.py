"""The common step — its turns with their calls, its calls' moves, its events, the run row's usage
and checkpoint — written as ONE statement in autocommit: no BEGIN, no COMMIT, one round trip.

The statement calls the PL/pgSQL function `acthelm_step` (`function_sql`, installed by migration
agents 0015_step_function, its fence by 0016_step_fence_lock, its ids by 0018_step_ids_generic_plan,
the conversation by 0019_step_writes_the_conversation)
with the step's rows as one jsonb object. PL/pgSQL caches the plans of its statements per session,
so the server parses and plans the step's SQL once per connection instead of on every step (each
statement's plan is kept generic: none depends on the step's values), and the client prepares
nothing: it works through any pooler, PgBouncer in transaction mode too. Its first statement is the
fence (`leases.fence_lock`: the `_HOLDS` checks on the task row it locks; the process heartbeat
renews the lease, the step does not). A run that lost its task gets no status back and nothing is
written (the statement commits as a read-only transaction; the caller raises AttemptLost). When the
run is no longer started or a call cannot make its move (TOOL_CALL_TRANSITIONS, checked by each
move's `status = ANY(sources)`) the function raises SQLSTATE AH001 / AH002, so that the statement's
transaction rolls back; the caller raises AttemptLost or TransitionNotAllowed as the
transaction-per-step path does.

Ids flow inside the function: new turns' and calls' ids are drawn from their sequences, a turn's
id goes into its calls' `turn_id`, a call's id into an event's `data.tool_call_id` (jsonb `||`)
and into the checkpoint. The checkpoint is computed in Python before the statement with a marker
in place of each new call's id; its JSON text is cut at the markers and put together in the
function around the ids.

A task's first step also writes its conversation (the system prompt and the tool pins). A run's
last step also writes its end when that is a hand-off (`Handoff`, decided by
`agents.engine.outcomes.handoff`: an approved final answer moves the task to review): the run's
end and the task's move with its event, after the same fence, when the task's status is still the
one the end was decided for and no notification target wants the move; else the function
declines it (`handed_off` false), writing nothing, and the fenced transaction writes the end.
What `Step` holds beyond that (memory, new tool pins alone, approvals, reviews, artifacts, the
plan, proposals, compaction, any other outcome, an event that notifies a person) keeps the
fenced-transaction path (`Recorder._commit`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast

from django.db import DatabaseError, models
from django.db import connection as db
from django.db.models import Field
from django.utils import timezone

from agents.engine.leases import fence_lock
from agents.engine.run_transitions import (
    CALL_MOVE_RECORD,
    call_move_from_record,
    call_move_json,
)
from agents.engine.usage import FIELDS
from agents.models import AgentRun, Conversation, ToolCall, Turn
from agents.states import TOOL_CALL_TRANSITIONS, RunStatus, ToolCallStatus
from core import fastsql
from core.actors import Actor, ActorKind
from core.exceptions import AttemptLost, TransitionNotAllowed
from tasks.models import Task, TaskEvent
from tasks.notify.models import NotificationTarget
from tasks.notify.outbox import notification_of

log = logging.getLogger("acthelm.tasks")

if TYPE_CHECKING:
    from agents.engine.recorder import CallState, NewCall, Result, Step

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
    """The type a value of this column is read as: the column's, a varchar without its length
    (so that a value too long fails as an INSERT's would, never cut)."""
    db_type = field.db_type(db) or "text"
    return re.sub(r"^varchar\(\d+\)$", "varchar", db_type)


#: The function's arguments: task, run, the checkpoint's JSON text cut at the
#: new calls' ids, which new call (1-based) each cut holds, the answer (NULL: none), the time it
#: was stored, and the step's rows as one jsonb object (`_payload`).
SIGNATURE = (
    "acthelm_step(\n  p_task bigint, p_run bigint, p_texts text[], p_marks integer[],\n"
    "  p_answer text, p_now timestamptz, p_step jsonb,\n"
    "  OUT task_status varchar, OUT new_call_ids bigint[], OUT handed_off boolean)"
)
#: How a DROP FUNCTION names it (a migration that changes the arguments drops it first).
IDENTITY = "acthelm_step(bigint, bigint, text[], integer[], text, timestamptz, jsonb)"
# The checkpoint's pieces go in binary (%b): psycopg's text format escapes every quote of the JSON
# in them with a regular expression (4 % of a read-only step's worker instructions, by
# bench/step_instructions.py); the binary format copies the strings.
_CALL = (
    "SELECT task_status, new_call_ids, handed_off"
    " FROM acthelm_step(%s, %s, %b, %s, %s, %s, %s::jsonb)"
)

#: The columns a hand-off (`Handoff`) may write: of the run, as it ends; of the task, as it moves.
#: One the hand-off does not give keeps its value.
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
        f"    FROM jsonb_to_recordset(p_step->'{key}') AS r(\n      {sep.join(record)});\n"
    )


def _ids(var: str, model: type[models.Model], key: str) -> str:
    # The sequence as a constant (resolved when the statement is planned), the rows from
    # jsonb_array_elements: the statement's plan does not depend on the step's values, so the
    # session keeps one generic plan. With pg_get_serial_sequence() (a catalog lookup folded
    # at planning) and generate_series(1, <the count>), every step planned it again.
    return (
        f"  {var} := ARRAY(SELECT nextval('{fastsql.sequence(model)}'::regclass)\n"
        f"    FROM jsonb_array_elements(p_step->'{key}'));\n"
    )


def function_sql() -> str:
    """`CREATE OR REPLACE FUNCTION acthelm_step(...)` as the models make it today (columns and
    their types). A migration holds it as a frozen string (0015_step_function);
    tests/agents/test_step_function.py fails when this changes and no newer migration does.

    What it does, in the caller's one autocommitted statement: the fence (`leases.fence_lock`);
    a run that lost its task gets no status back and nothing is written. Then the run row's usage
    and checkpoint (and answer), only while it is started (else SQLSTATE AH001), the task's
    conversation with its first step, the turns and
    the new calls (ids from their sequences: a turn's id into its calls' turn_id, a new call's id
    into the checkpoint's text and into its event's data.tool_call_id), each saved call's move by
    id (one it cannot make: SQLSTATE AH002), the events. Either error rolls the whole statement
    back. PL/pgSQL caches its statements' plans per session, so the server parses and plans the
    step's SQL once per connection, not once per step — with no prepared statement on the client,
    so through any pooler."""
    usage = []
    for u in FIELDS:
        f = AgentRun._meta.get_field(u.name)
        assert isinstance(f, Field)  # a column of the run row
        usage.append(f"{f.column} = {f.column} + (v_usage->>'{u.name}')::{f.db_type(db)}")
    sets = ",\n      ".join(usage)
    fence = fence_lock(task="p_task", run="p_run").strip()
    fence = fence.replace("\n", "\n    ")
    conversation = _insert(Conversation, "conversation", [], {})
    turns = _insert(Turn, "turns", [("id", "v_turns[r._i]", "_i integer")], {})
    calls = _insert(
        ToolCall,
        "calls",
        [("id", "v_calls[r._k]", "_k integer"), ("", "", "_turn integer")],
        {"turn_id": "v_turns[r._turn]"},
        skip=("turn_id",),
    )
    events = _insert(
        TaskEvent,
        "events",
        [("", "", "_call integer")],  # its new call's id goes into data.tool_call_id
        {
            "data": "CASE WHEN r._call IS NULL THEN r.data "
            "ELSE r.data || jsonb_build_object('tool_call_id', v_calls[r._call]) END"
        },
    )
    move = call_move_from_record("m", "p_run").replace("\n", "\n      ")
    run_end = _handoff_sets(AgentRun, "r", HANDOFF_RUN_COLUMNS, "run")
    task_move = _handoff_sets(Task, "t", HANDOFF_TASK_COLUMNS, "task")
    targets = NotificationTarget._meta.db_table
    return f"""CREATE OR REPLACE FUNCTION {SIGNATURE}
LANGUAGE plpgsql AS $fn$
DECLARE
  v_usage jsonb := p_step->'usage';
  v_turns bigint[];
  v_calls bigint[];
  v_text text;
  m record;
  v_handoff jsonb := p_step->'handoff';
BEGIN
  {fence}
    INTO task_status;
  IF task_status IS NULL THEN
    RETURN;
  END IF;
  IF v_handoff IS NOT NULL THEN
    -- Declined, nothing written: the task is not in the status the run's end was decided for,
    -- or a notification target wants the move (its outbox rows are written in Python).
    IF task_status IS DISTINCT FROM v_handoff->>'from' OR (
        v_handoff->>'notify' IS NOT NULL AND EXISTS (
          SELECT 1 FROM {targets} n
          WHERE n.enabled AND n.events @> ARRAY[v_handoff->>'notify']::varchar[])) THEN
      handed_off := false;
      RETURN;
    END IF;
  END IF;
{_ids("v_turns", Turn, "turns")}{_ids("v_calls", ToolCall, "calls")}  v_text := p_texts[1];
  FOR i IN 1 .. coalesce(array_length(p_marks, 1), 0) LOOP
    v_text := v_text || v_calls[p_marks[i]]::text || p_texts[i + 1];
  END LOOP;
  UPDATE agents_agentrun SET
      {sets},
      checkpoint = v_text::jsonb,
      answer = coalesce(p_answer, answer),
      answer_stored_at = CASE WHEN p_answer IS NULL THEN answer_stored_at ELSE p_now END
    WHERE id = p_run AND agents_agentrun.status = '{RunStatus.STARTED}';
  IF NOT FOUND THEN
    RAISE EXCEPTION 'run % is not started', p_run USING ERRCODE = '{NOT_STARTED}';
  END IF;
  IF p_step ? 'conversation' THEN
{conversation}  END IF;
  IF v_turns <> '{{}}' THEN
{turns}  END IF;
  IF v_calls <> '{{}}' THEN
{calls}  END IF;
  FOR m IN SELECT * FROM jsonb_to_recordset(p_step->'moves') AS x(
      {CALL_MOVE_RECORD})
  LOOP
    {move};
    IF NOT FOUND THEN
      RAISE EXCEPTION 'tool call % cannot become %', m.id, m.status USING ERRCODE = '{REFUSED}';
    END IF;
  END LOOP;
{events}  new_call_ids := v_calls;
  IF v_handoff IS NOT NULL THEN
    UPDATE agents_agentrun r SET
      {run_end}
      FROM jsonb_populate_record(NULL::agents_agentrun, v_handoff->'run') v
      WHERE r.id = p_run AND r.status = '{RunStatus.STARTED}';
    IF NOT FOUND THEN
      RAISE EXCEPTION 'run % is not started', p_run USING ERRCODE = '{NOT_STARTED}';
    END IF;
    UPDATE tasks_task t SET
      {task_move}
      FROM jsonb_populate_record(NULL::tasks_task, v_handoff->'task') v
      WHERE t.id = p_task;
    task_status := v_handoff->'task'->>'status';
    handed_off := true;
  END IF;
END
$fn$"""


def _handoff_sets(model: type[models.Model], alias: str, names: tuple[str, ...], key: str) -> str:
    """`column = <the hand-off's value, if it gives one, else the row's>` for each of `names`,
    the value `v` read from the hand-off's `key` object by jsonb_populate_record (so in the
    column's own type)."""
    sets = []
    for name in names:
        column = _column(model, name)
        sets.append(
            f"{column} = CASE WHEN v_handoff->'{key}' ? '{column}' "
            f"THEN v.{column} ELSE {alias}.{column} END"
        )
    return ",\n      ".join(sets)


#: The SQLSTATEs the function raises: the run is no longer started; a call cannot make its move.
NOT_STARTED = "AH001"
REFUSED = "AH002"


class _RowEncoder(json.JSONEncoder):
    """The step's rows as JSON: a time in ISO 8601 (to the microsecond), a decimal as its text."""

    def default(self, o: Any) -> Any:
        if isinstance(o, datetime):
            return o.isoformat()
        if isinstance(o, Decimal):
            return str(o)
        return super().default(o)


def _row(model: type[models.Model], given: dict[str, Any], now: datetime) -> dict[str, Any]:
    """A row as the function reads it: every column (by its name) the caller gives, `now` for an
    auto_now(_add) one, the model's default for the rest (what `fastsql.Insert.values` binds)."""
    insert = fastsql.Insert.of(model)
    return {
        c.field.column or "": value
        for c, value in zip(insert.columns, insert.chosen(given, now), strict=True)
    }


def _column(model: type[models.Model], name: str) -> str:
    field = model._meta.get_field(name)
    assert isinstance(field, Field) and field.column  # a concrete column of the row
    return field.column


def _columns_of(model: type[models.Model], values: dict[str, Any]) -> dict[str, Any]:
    """`values` by field name as the hand-off's JSON gives them: by column name."""
    return {_column(model, name): value for name, value in values.items()}


def conversation_values(
    task_id: int, system_prompt: str, tool_pins: dict[str, Any] | None
) -> dict[str, Any]:
    """The task's conversation row, written with its first step (by either path)."""
    return {
        "task_id": task_id,
        "system_prompt": system_prompt,
        "system_prompt_sha256": hashlib.sha256(system_prompt.encode()).hexdigest(),
        "tool_pins": tool_pins or {},
    }


@dataclass(frozen=True)
class Handoff:
    """A run's end written by its last step's statement (`agents.engine.outcomes.handoff`):
    the status the task must still have (`from_status`: the one the end was decided for), the
    run's columns as it ends and the task's as it moves (by name, within HANDOFF_RUN_COLUMNS and
    HANDOFF_TASK_COLUMNS), the move's event (a TaskEvent's fields) and the notification it is
    (None: none). The function declines it, writing nothing, when the task's status is another
    or a notification target wants it."""

    from_status: str
    run: dict[str, Any]
    task: dict[str, Any]
    event: dict[str, Any]
    notify: str | None


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
        or (step.tool_pins is not None and step.system_prompt is None)
        or step.restart
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
    checkpoint: Callable[[], dict[str, Any]],
    handoff: Handoff | None = None,
) -> str | None:
    """Write the planned step in one autocommitted statement (the step function); the task's
    status. AttemptLost when the run no longer holds its task (nothing written),
    TransitionNotAllowed when a call cannot make its move (nothing written). With `handoff`, the
    run ends and the task moves in the same statement; None when the function declined it
    (nothing written: the caller takes the transaction path)."""
    now = timezone.now()
    states: list[CallState] = [c.state for _, c, _ in p.new]
    index = {id(s): k for k, s in enumerate(states)}

    # The checkpoint, with a marker where a new call's id goes.
    for k, s in enumerate(states):
        s.pk = cast(int, _NewId(k + 1))
    try:
        text = json.dumps(checkpoint(), cls=_Encoder)
    finally:
        for s in states:
            s.pk = None
    cut = _MARK_RE.split(text)
    texts, marks = cut[0::2], [int(k) for k in cut[1::2]]

    turns = []
    for i, t in enumerate(step.turns, 1):
        row = _row(
            Turn,
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
        row["_i"] = i
        turns.append(row)
    calls = []
    for k, (turn, c, r) in enumerate(p.new, 1):
        row = _row(ToolCall, _call_row(task_id, run_id, c, r, now), now)
        del row["turn_id"]
        row["_k"], row["_turn"] = k, turn + 1
        calls.append(row)
    events = []
    for e in step.events:
        new_call = index.get(id(e.call)) if e.call is not None else None
        data = e.data
        if e.call is not None and new_call is None:
            data = {**e.data, "tool_call_id": e.call.pk}
        row = _row(
            TaskEvent,
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
        row["_call"] = None if new_call is None else new_call + 1
        events.append(row)
    payload: dict[str, Any] = {}
    if step.system_prompt is not None:  # the task's first step: its conversation, once
        values = conversation_values(task_id, step.system_prompt, step.tool_pins)
        payload["conversation"] = [_row(Conversation, values, now)]
    if handoff is not None:
        row = _row(TaskEvent, handoff.event, now)
        row["_call"] = None
        events.append(row)
        payload["handoff"] = {
            "from": handoff.from_status,
            "run": _columns_of(AgentRun, handoff.run),
            "task": _columns_of(Task, handoff.task),
            "notify": handoff.notify,
        }
    payload |= {
        "usage": {f.name: getattr(step.usage, f.name) for f in FIELDS},
        "turns": turns,
        "calls": calls,
        "moves": [call_move_json(r.update(now)) for r in p.moves],
        "events": events,
    }
    params = [
        task_id,
        run_id,
        texts,
        marks,
        step.answer,
        now,
        json.dumps(payload, cls=_RowEncoder, ensure_ascii=False),
    ]
    try:
        answer = fastsql.execute(_CALL, params).fetchone()
    except DatabaseError as exc:
        sqlstate = getattr(exc.__cause__, "sqlstate", None)
        if sqlstate == NOT_STARTED:
            log.warning("run.fenced_out", extra={"task_id": task_id, "run_id": run_id})
            raise AttemptLost(f"run {run_id} is no longer started") from None
        if sqlstate == REFUSED:
            raise TransitionNotAllowed(str(exc.__cause__).splitlines()[0]) from None
        raise
    assert answer is not None  # a function's one row
    status: str | None = answer[0]
    if status is None:
        log.warning("run.fenced_out", extra={"task_id": task_id, "run_id": run_id})
        raise AttemptLost(f"run {run_id} no longer holds task {task_id}")
    if handoff is not None and not answer[2]:
        return None
    for s, pk in zip(states, answer[1] or [], strict=True):
        s.pk = pk
    return status
