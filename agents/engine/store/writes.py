"""A step's rows in the fenced transaction (`agents.engine.run.recorder.Recorder._commit`), for a
step the one statement does not write: the conversation, the turns with their calls, the run row's
usage, checkpoint and answer. Each INSERT and UPDATE is SQL built once (`core.fastsql`); the rows
are the ones the step function inserts (`values.turn_row`, `values.new_call_row`)."""

from __future__ import annotations

import functools
from datetime import datetime
from typing import Any

from django.db import connection as db
from django.db.models import Field

from agents.engine.store.literal import literal
from agents.engine.store.usage import FIELDS, Usage
from agents.engine.store.values import NewCall, NewTurn, conversation_values, new_call_row, turn_row
from agents.models import AgentRun, Conversation, ToolCall, Turn
from agents.states import RunStatus
from core import fastsql
from core.exceptions import AttemptLost


def write_conversation(
    task_id: int,
    system_prompt: str,
    tool_pins: dict[str, Any] | None,
    now: datetime,
    *,
    restart: bool = False,
) -> None:
    """The task's conversation, once a task (with its first step); with `restart`, the new prompt
    of the conversation a person started over, over the row that exists."""
    values = conversation_values(task_id, system_prompt, tool_pins)
    if restart:
        del values["task_id"]
        Conversation.objects.filter(task_id=task_id).update(**values)
    else:
        fastsql.Insert.of(Conversation).rows([values], now)


def insert_turns(task_id: int, run_id: int, turns: list[NewTurn], now: datetime) -> list[NewCall]:
    """Two INSERTs without the ORM's compile: the turns, then their calls; each call's state
    gets its row's id. Returns the new calls."""
    if not turns:
        return []
    rows = fastsql.Insert.of(Turn).rows([turn_row(task_id, run_id, t) for t in turns], now)
    pairs = [(row, c) for row, t in zip(rows, turns, strict=True) for c in t.calls]
    if not pairs:
        return []
    calls = fastsql.Insert.of(ToolCall).rows(
        [{**new_call_row(task_id, run_id, c, now), "turn_id": turn_id} for turn_id, c in pairs],
        now,
    )
    for (_, c), pk in zip(pairs, calls, strict=True):
        c.state.pk = pk
    return [c for _, c in pairs]


@functools.cache
def _run_update(*, with_answer: bool) -> tuple[str, dict[str, Field[Any, Any]]]:
    """The step's UPDATE of its run row (usage added column by column, the checkpoint, the
    answer when there is one), guarded by the run being started; built once."""

    def field(name: str) -> Field[Any, Any]:
        found = AgentRun._meta.get_field(name)
        assert isinstance(found, Field)  # a column of the run row
        return found

    fields = {f.name: field(f.name) for f in FIELDS}
    sets = [f"{f.column} = {f.column} + %s::{f.db_type(db)}" for f in fields.values()]
    fields["checkpoint"] = field("checkpoint")
    sets.append("checkpoint = %s")
    if with_answer:
        sets += ["answer = %s", "answer_stored_at = %s"]
    sql = (
        f"UPDATE agents_agentrun SET {', '.join(sets)} "
        f"WHERE id = %s AND status = {literal(RunStatus.STARTED)}"
    )
    return sql, fields


def write_run_row(
    run_id: int, usage: Usage, checkpoint: dict[str, Any], answer: str | None, now: datetime
) -> None:
    """The step's usage, the checkpoint and the answer on the run row, in one statement; the
    caller's transaction proved the run holds its task, and AttemptLost if it is no longer
    started all the same."""
    sql, fields = _run_update(with_answer=answer is not None)
    params = [
        *(getattr(usage, f.name) for f in FIELDS),
        fields["checkpoint"].get_db_prep_save(checkpoint, db),
    ]
    if answer is not None:
        params += [answer, now]
    updated = fastsql.execute(sql, [*params, run_id]).rowcount
    if updated != 1:  # the fence proved it; a second look costs nothing here
        raise AttemptLost(f"run {run_id} is no longer started")
