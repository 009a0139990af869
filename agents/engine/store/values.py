"""What a run's step is, as values: the loop collects them in a `Step` (turns, tool calls in
their decided states, moves as `Result`s, events, usage, the answer) and the store writes it —
by one statement (`statement`) or in the fenced transaction (`writes`). The rows a step inserts
are built here once for both paths (`turn_row`, `new_call_row`, `conversation_values`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from agents.catalogue.tools import ArtifactWritten
from agents.engine.store.usage import ZERO, Usage
from agents.models import ToolCall
from agents.states import ToolCallStatus
from approvals.services import ApprovalRequest

if TYPE_CHECKING:
    from agents.catalogue.tools.plan import ProposeTaskArgs
    from memory.models import MemoryEntry

#: What remains of each limit and which operations are pending, for the run row (called inside
#: each transaction, after the step's rows exist).
Checkpoint = Callable[[], dict[str, Any]]


@dataclass(eq=False)
class CallState:
    """A tool call as the loop keeps it in memory (pk is None until the step is written)."""

    call_id: str
    tool: str
    arguments: dict[str, Any] | None
    arguments_raw: str
    recovery_class: str
    position: int
    status: str = ToolCallStatus.PENDING
    pk: int | None = None
    arguments_hash: str = ""
    result_for_model: str = ""
    error_code: str = ""
    compacted: bool = False
    run_count: int = 0

    @classmethod
    def from_row(cls, row: ToolCall) -> CallState:
        return cls(
            call_id=row.call_id,
            tool=row.tool,
            arguments=row.arguments,
            arguments_raw=row.arguments_raw,
            recovery_class=row.recovery_class,
            position=row.position,
            status=row.status,
            pk=row.pk,
            arguments_hash=row.arguments_hash,
            result_for_model=row.result_for_model,
            error_code=row.error_code,
            compacted=row.compacted,
            run_count=row.run_count,
        )

    @property
    def saved_pk(self) -> int:
        """The row's id, for a call that is written already (every call a `Result` moves)."""
        if self.pk is None:
            raise ValueError(f"tool call {self.call_id} is not written yet")
        return self.pk


@dataclass(frozen=True)
class TurnState:
    """A turn as the loop keeps it in memory: a saved one (`load_state`) or the last one."""

    role: str
    content: str
    discarded: bool = False
    calls: list[CallState] = field(default_factory=list)


@dataclass
class NewCall:
    """A call of a new turn in its decided state: pending (to run), refused or awaiting."""

    state: CallState
    result: str = ""
    approval: ApprovalRequest | None = None  # when it awaits a person


@dataclass
class NewTurn:
    index: int
    role: str
    content: str
    stop_reason: str = ""
    discarded: bool = False
    input_tokens: int = 0
    output_tokens: int = 0
    # agents.catalogue.prices.turn_usage_fields: cached input, cache writes, cost in US dollars (or
    # None)
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    cost: Decimal | None = None
    calls: list[NewCall] = field(default_factory=list)


@dataclass
class Result:
    """A call's move (a result, a refusal, awaiting a person, unknown) for the next commit."""

    call: CallState
    to: str
    result: str | None = None
    result_for_model: str | None = None
    error_code: str | None = None
    finished: bool = True
    runs: int = 0
    started: bool = False
    arguments: dict[str, Any] | None = None
    arguments_hash: str | None = None
    approval: ApprovalRequest | None = None
    unknown: bool = False


@dataclass
class Event:
    kind: str
    data: dict[str, Any]
    call: CallState | None = None  # its id goes into data["tool_call_id"] once known


@dataclass
class Step:
    """What the loop produced since the last commit."""

    # The run's memory: the entries chosen for the system prompt (recorded), or the earlier run
    # whose selection it repeats (copied).
    memory_chosen: list[tuple[MemoryEntry, float]] = field(default_factory=list)
    memory_from_run: int | None = None
    system_prompt: str | None = None
    # The system prompt is that of a conversation a person started over: the task's
    # conversation row exists, and is rewritten rather than inserted.
    restart: bool = False
    tool_pins: dict[str, Any] | None = None  # every MCP tool pinned so far, when one was added
    clear_feedback: bool = False
    turns: list[NewTurn] = field(default_factory=list)
    results: list[Result] = field(default_factory=list)
    artifacts: list[tuple[CallState, ArtifactWritten]] = field(default_factory=list)
    plan: dict[str, Any] | None = None
    proposals: list[tuple[CallState, ProposeTaskArgs]] = field(default_factory=list)
    compaction: tuple[list[CallState], int, int] | None = None  # chosen, tokens before, after
    events: list[Event] = field(default_factory=list)
    # What the step used (turns, tokens, time, requests, MCP starts, cost): added to the run row
    # in the step's own transaction, column by column (agents.engine.run.usage.Usage).
    usage: Usage = ZERO
    answer: str | None = None

    def event(self, kind: str, data: dict[str, Any], call: CallState | None = None) -> None:
        self.events.append(Event(kind, data, call))


def turn_row(task_id: int, run_id: int, t: NewTurn) -> dict[str, Any]:
    """A new turn's row (by field name), as either path inserts it."""
    return {
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
    }


def new_call_row(task_id: int, run_id: int, c: NewCall, now: datetime) -> dict[str, Any]:
    """A new call's row (by field name, without its turn) in its decided state, as either path
    inserts it: a refused call is finished."""
    s = c.state
    return {
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
