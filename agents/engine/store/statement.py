"""The common step — its turns with their calls, its calls' moves, its events, the run row's usage
and checkpoint — written as ONE statement in autocommit: no BEGIN, no COMMIT, one round trip.

The statement calls the PL/pgSQL function `acthelm_step` (sql/acthelm_step.sql, rendered by
`functions.step_function_sql`; the migrations apply its text frozen in agents/migrations/sql/)
with the step's rows as one jsonb object. PL/pgSQL caches the plans of its statements per session,
so the server parses and plans the step's SQL once per connection instead of on every step (each
statement's plan is kept generic: none depends on the step's values), and the client prepares
nothing: it works through any pooler, PgBouncer in transaction mode too. Its first statement is the
fence (`fence.fence_lock`: the `_HOLDS` checks on the task row it locks; the process heartbeat
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
last step also writes its end when that is a hand-off (`Handoff`, a value the verdict hands the
store — `agents.engine.verdict.outcomes.handoff` decides it; the store never imports the verdict: an
approved final answer moves the task to review): the run's end and the task's move with its event,
after the same fence, when the task's status is still the one the end was decided for and no
notification target wants the move; else the function declines it (`handed_off` false), writing
nothing, and the fenced transaction writes the end. What `Step` holds beyond that (memory, new
tool pins alone, a conversation started over, approvals, reviews, artifacts, the plan,
proposals, compaction, any other outcome, an event that notifies a person) keeps the
fenced-transaction path (`agents.engine.run.recorder.Recorder._commit`, `writes`).
"""

from __future__ import annotations

import json
import logging
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, cast

from django.db import DatabaseError, models
from django.utils import timezone

from agents.engine.store.functions import NOT_STARTED, REFUSED, column
from agents.engine.store.runs import call_move_json
from agents.engine.store.usage import FIELDS
from agents.engine.store.values import (
    CallState,
    NewCall,
    Result,
    Step,
    conversation_values,
    new_call_row,
    turn_row,
)
from agents.models import AgentRun, Conversation, ToolCall, Turn
from agents.states import TOOL_CALL_TRANSITIONS
from core import fastsql
from core.actors import Actor, ActorKind
from core.exceptions import AttemptLost, TransitionNotAllowed
from tasks.models import Task, TaskEvent
from tasks.notify.outbox import notification_of

log = logging.getLogger("acthelm.tasks")

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


# The checkpoint's pieces go in binary (%b): psycopg's text format escapes every quote of the JSON
# in them with a regular expression (4 % of a read-only step's worker instructions, by
# bench/step_instructions.py); the binary format copies the strings.
_CALL = (
    "SELECT task_status, new_call_ids, handed_off"
    " FROM acthelm_step(%s, %s, %b, %s, %s, %s, %s::jsonb)"
)


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


def _columns_of(model: type[models.Model], values: dict[str, Any]) -> dict[str, Any]:
    """`values` by field name as the hand-off's JSON gives them: by column name."""
    return {column(model, name): value for name, value in values.items()}


@dataclass(frozen=True)
class Handoff:
    """A run's end written by its last step's statement (`agents.engine.verdict.outcomes.handoff`):
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
class StepPlan:
    """The step laid out for the statement: new calls (with the Result that moves each, if one
    does), moves of saved calls, events."""

    new: list[tuple[int, NewCall, Result | None]]
    moves: list[Result]


def plan(step: Step, actor: Actor) -> StepPlan | None:
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
    return StepPlan(new, moves)


def _call_row(
    task_id: int, run_id: int, c: NewCall, r: Result | None, now: datetime
) -> dict[str, Any]:
    """A new call's row: as inserted (`values.new_call_row`), then as its Result in this step
    moves it (what `runs.set_calls_status` would write over the inserted row)."""
    row = new_call_row(task_id, run_id, c, now)
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
    p: StepPlan,
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
            turn_row(task_id, run_id, t),
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
        "moves": [call_move_json(r, now) for r in p.moves],
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
