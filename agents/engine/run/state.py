"""A run's state in memory and the primitives every part of the run uses: the signals it stops
at (`RunSignals`, read at every safe point), the commit of its step (through the recorder), the
booking of its usage, the checkpoint, and the tools' context. The tool calls' rounds
(`agents.engine.run.rounds`) and the loop itself (`agents.engine.run.loop`) build on it."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.utils import timezone

from agents.catalogue.providers import Completion
from agents.catalogue.providers.base import CancelEvent
from agents.catalogue.tools import Tool, ToolContext
from agents.catalogue.tools.mcp import is_mcp_tool
from agents.engine.run.admission import Decision, task_tool_context
from agents.engine.run.prompting import History
from agents.engine.run.recorder import CallState, Recorder, SavedState, Step, TurnState
from agents.engine.run.usage import Usage, headroom, remaining
from agents.engine.store import holds_now
from agents.engine.verdict.outcomes import Outcome
from agents.states import TOOL_CALL_DONE
from core import fibers
from core.actors import Actor
from core.dbpool import release_connection
from core.exceptions import AttemptLost
from tasks import live
from tasks.limits import BEFORE_A_NETWORK_REQUEST
from tasks.states import TaskStatus

if TYPE_CHECKING:
    from tasks.models import Task

_NO_CAP = 2**31 - 1


@dataclass
class RunSignals:
    """Set by the worker's heartbeat and signal handlers; read at every safe point."""

    # attempt lost or cancelled; wakes a waiting model request itself (no polling)
    cancel: threading.Event = field(default_factory=CancelEvent)
    stop: threading.Event = field(default_factory=fibers.Event)  # graceful shutdown
    pause: threading.Event = field(default_factory=fibers.Event)  # a person asked to pause
    # the run is writing its end: a task the heartbeat no longer finds held has moved on with it
    ending: threading.Event = field(default_factory=fibers.Event)


class Stop(Exception):
    """The run ends here with ``outcome`` (raised anywhere in the run, caught by the loop)."""

    def __init__(self, outcome: Outcome):
        self.outcome = outcome


def fail(code: str, message: str, *, retryable: bool = True, health: bool = False) -> Stop:
    return Stop(
        Outcome(Outcome.FAILED, code=code, message=message, retryable=retryable, health=health)
    )


class RunState:
    """One run's state in memory, read once at its start (`AgentLoop._load`), and what every part
    of the run does with it. Slots, not a dict: a run keeps this for its whole life, waits
    included, and a dict of its ~36 attributes cost ~1.5 KB (the subclasses add none)."""

    __slots__ = (
        "_clock",
        "_queued",
        "actor",
        "admitted",
        "approvals",
        "calls",
        "claim_count",
        "connection",
        "conversation",
        "feedback_after_round",
        "fresh_conversation",
        "history",
        "intended",
        "last",
        "live_turn",
        "memory_from_run",
        "memory_to_rank",
        "model",
        "next_index",
        "offered",
        "outcome",
        "plan_exists",
        "provider",
        "recorder",
        "run_again",
        "run_id",
        "saved",
        "signals",
        "specs",
        "started_fresh",
        "step",
        "task",
        "task_id",
        "tool_context",
        "tools",
        "used",
    )

    task: Task
    claim_count: int
    tools: dict[str, Tool[Any]]  # the tools offered, resolved once (`AgentLoop._validate`)
    approvals: dict[int, str]  # approved call -> the hash a person approved
    run_again: set[int]  # calls a person chose to run again
    plan_exists: bool
    history: History
    calls: list[CallState]
    last: TurnState | None  # the last turn that was not discarded
    started_fresh: bool  # the task had no turn when the run started
    next_index: int  # the index the run's next stored turn takes
    offered: list[str] | None
    used: Usage

    def __init__(
        self,
        *,
        task_id: int,
        run_id: int,
        worker_id: str,
        signals: RunSignals,
        saved: SavedState | None = None,
    ) -> None:
        self.task_id = task_id
        self.saved = saved  # the state read with the claim (`load_starts`), else read at the start
        self.run_id = run_id
        self.actor = Actor.worker(worker_id)
        self.signals = signals
        self.step = Step()
        self._clock = time.monotonic()
        self._queued = fibers.queued_seconds()  # time ready but waiting for a step thread
        self.recorder: Recorder | None = None
        # The new turn's first call as admitted when the turn was stored (nothing ran since):
        # run without a second admission, and for an external call with its intent already
        # committed together with the turn (`_intend_with_turn`).
        self.admitted: tuple[CallState, Decision] | None = None
        self.intended = False
        self.tool_context: ToolContext | None = None  # the fixed part, built at first use
        self.feedback_after_round = False  # the task's feedback waits for open calls to run
        # The index of the model turn published on the live channel (`tasks.live`) whose "end"
        # is not sent yet, else None.
        self.live_turn: int | None = None

    def commit(self) -> None:
        """Write what the run produced since its last commit (one fenced transaction)."""
        assert self.recorder is not None  # set by _load, before anything commits
        self._book(Usage(active_seconds=self._elapsed()))
        self.recorder.commit(self.step, checkpoint=self._checkpoint)
        self.step = Step()
        self._live_end(stored=True)

    # -- the live channel: the turn being written, for whoever watches ------------------------

    def _live_start(self) -> None:
        """A model turn starts: a viewer clears the last one's text. Stored, it is the turn
        `next_index` (nothing is stored between the request and the answer's turn)."""
        self.live_turn = self.next_index
        live.publish(self.task_id, self.run_id, "turn", {})

    def _live_delta(self, kind: str, data: dict[str, Any]) -> None:
        """A piece of the turn as the provider hands it over (on the request's loop thread;
        `live.publish` only takes its lock)."""
        live.publish(self.task_id, self.run_id, kind, data)

    def _live_end(self, *, stored: bool) -> None:
        """The turn published is over: stored (after the commit that wrote it) or discarded."""
        if self.live_turn is not None:
            data = {"stored": True, "turn": self.live_turn} if stored else {"stored": False}
            self.live_turn = None
            live.publish(self.task_id, self.run_id, "end", data)

    # -- usage, time and the checkpoint -----------------------------------------------------------

    def _elapsed(self) -> float:
        """The seconds since the last commit (booked with the step that ends now), less the
        time the run spent queued in its worker for a step thread: a busy worker makes a run
        later, never closer to its runtime limit."""
        now, queued = time.monotonic(), fibers.queued_seconds()
        delta = (now - self._clock) - (queued - self._queued)
        self._clock, self._queued = now, queued
        return max(0.0, delta)

    def usage(self) -> Usage:
        """The task's usage now: earlier runs, this run's booked usage, and the time since the
        last commit (less the time queued, as `_elapsed`)."""
        queued = fibers.queued_seconds() - self._queued
        return self.used.plus_seconds(max(0.0, time.monotonic() - self._clock - queued))

    def _book(self, delta: Usage) -> None:
        """The one place usage is booked: in memory (for the limits) and in the step (for the
        run row, written with the step)."""
        self.used += delta
        self.step.usage += delta

    def _book_turn(self, completion: Completion, cost: Decimal | None) -> None:
        """A model turn's usage; its cost is stored on the turn itself too (`NewTurn.cost`)."""
        self._book(
            Usage(
                model_turns=1,
                input_tokens=completion.input_tokens,
                output_tokens=completion.output_tokens,
                cost=cost or Decimal(0),
            )
        )

    def _book_start(self, call: CallState) -> None:
        """A call starts (its Result raises run_count): an MCP call is booked in the same step,
        so that the run's mcp_calls commits with the call's run_count (a crash loses neither)."""
        if is_mcp_tool(call.tool):
            self._book(Usage(mcp_calls=1))

    def no_calls(self) -> bool:
        """The task has made no tool call: none in this run, and it had no turn when the run
        started (a run holds its task: no one else adds one meanwhile). Hence no artifact either:
        only a call writes one. The verdict then has nothing to read (`supervise(no_calls=)`)."""
        return self.started_fresh and not self.calls

    def open_operations(self) -> list[CallState]:
        return [c for c in self.calls if c.status not in TOOL_CALL_DONE]

    def _checkpoint(self) -> dict[str, Any]:
        """After each round: what remains of each limit and which operations are pending."""
        usage = self.usage()
        last_calls = self.last.calls if self.last else []
        return {
            "at": timezone.now().isoformat(),
            "remaining": remaining(self.task, usage),
            "usage": usage.as_dict(),
            "pending_operations": [
                {"id": c.pk, "tool": c.tool, "status": str(c.status)}
                for c in self.open_operations()
            ],
            "turn_calls": [c.pk for c in last_calls],
        } | (
            # The tools this run offered the model (empty: a run without tools, said on the
            # page); absent when the run stopped before it offered any (validation failed).
            {"tools_offered": list(self.offered)} if self.offered is not None else {}
        )

    # -- the loop ---------------------------------------------------------------------------------

    def _safe_point(self) -> None:
        """Before every model request and between any two tool calls: a cancel, a shutdown or a
        pause request (delivered by the worker's heartbeat, at once through NOTIFY) stops the run
        here. Then the run gives its database connection back: it holds none while it waits for
        the model or a tool."""
        if self.signals.cancel.is_set():
            raise AttemptLost("the run was cancelled or lost its lease")
        if self.signals.stop.is_set():
            raise Stop(Outcome(Outcome.HANDED_BACK))
        if self.signals.pause.is_set():
            # The heartbeat saw a pause request; it may have been withdrawn since.
            assert self.recorder is not None  # set by _load, before the first safe point
            if self.recorder.status() == TaskStatus.PAUSE_REQUESTED:
                raise Stop(Outcome(Outcome.PAUSED))
            self.signals.pause.clear()
        release_connection()

    def _before_an_effect(self) -> None:
        """Just before a tool with an effect starts: the fence's checks as one read, so that no
        such tool starts after a person's cancel has committed, whatever the NOTIFY's timing (an
        external call's intent commit is fenced already)."""
        status = holds_now(task_id=self.task_id, run_id=self.run_id)
        if status == TaskStatus.PAUSE_REQUESTED:
            self.signals.pause.set()
        self._safe_point()

    def _requests_left(self) -> int:
        """What the limits checked before a network request leave (no such limit: no cap)."""
        left = headroom(BEFORE_A_NETWORK_REQUEST, self.task, self.usage())
        return _NO_CAP if left is None else left

    def _context(self) -> ToolContext:
        """The tools' context: its folders (made once, when the run first needs them), domains
        and fence fixed for the run; what network requests remain, counted now."""
        if self.tool_context is None:
            self.tool_context = task_tool_context(
                self.task,
                network_requests_remaining=_NO_CAP,
                cancel_event=self.signals.cancel,
                fence_token=self.claim_count,
            )
        return replace(self.tool_context, network_requests_remaining=self._requests_left())
