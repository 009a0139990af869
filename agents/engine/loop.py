"""The agent loop: one run of a claimed task, from the saved state to an Outcome.

The run loads the task's saved state once (conversation, calls, plan, usage) and keeps it in
memory. Each step: run the tool calls of the last model turn that are still open, ask the model,
decide the new turn's calls (pure checks: on the task's list → plan first → arguments valid →
needs approval), and hand everything to the recorder, which writes the step in ONE fenced
transaction (`agents.engine.recorder`). No transaction is open while the model or a tool runs; the
loop
owns no SQL. The loop never changes the task's status: it returns an Outcome, and `finish`
records the last step together with it.

Prompt building and compaction: `agents.engine.prompting`. What an outcome does:
`agents.engine.outcomes`.
"""

from __future__ import annotations

import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils import timezone

from agents.catalogue.connections import provider_for
from agents.catalogue.eligibility import has_tools, model_refusal
from agents.catalogue.prices import turn_usage_fields
from agents.catalogue.providers import Completion, ProviderError, ToolCallRequest, ToolSpec
from agents.catalogue.providers.base import PERMANENT_CODES, CancelEvent, traced_name
from agents.catalogue.tools import (
    RecoveryClass,
    Tool,
    ToolContext,
    ToolError,
    all_tools,
    get_tool,
    operation_hash,
    usable_tool_names,
)
from agents.catalogue.tools.artifacts import stamp_fence
from agents.catalogue.tools.mcp import McpTool, RemoteTool
from agents.catalogue.tools.plan import ProposeTaskArgs
from agents.catalogue.tools.schemas import CheckStopped, stop_checks_when
from agents.engine import storable
from agents.engine.outcomes import Outcome, OutcomeKind, apply_outcome
from agents.engine.prompting import (
    DISCARDED_NOTE,
    History,
    feedback_message,
    result_for_model,
    system_prompt,
    task_message,
)
from agents.engine.recorder import (
    CallState,
    NewCall,
    NewTurn,
    Recorder,
    Result,
    SavedState,
    Step,
    TurnState,
    load_state,
)
from agents.engine.store import holds_now
from agents.engine.usage import Usage, first_reached, headroom, is_mcp_tool, remaining
from agents.states import TOOL_CALL_DONE, CostTier, FailureCode, Role
from agents.states import ToolCallStatus as TC
from approvals.services import ApprovalRequest
from approvals.states import ApprovalReason
from core import telemetry
from core.actors import Actor
from core.dbpool import release_connection
from core.exceptions import AttemptLost
from memory import services as memory_services
from tasks.limits import (
    BEFORE_A_MODEL_TURN,
    BEFORE_A_NETWORK_REQUEST,
    BEFORE_AN_MCP_CALL,
    CUMULATIVE,
)
from tasks.states import EventKind, TaskStatus, ToolPolicy
from tasks.workspace import artifacts_dir, workspace_dir

if TYPE_CHECKING:
    from pydantic import BaseModel

    from agents.engine.supervisor import SupervisorVerdict
    from core.telemetry import ToolSpan
    from tasks.models import Task

__all__ = ["AgentLoop", "Outcome", "RunSignals"]

log = logging.getLogger("acthelm.loop")
_NO_CAP = 2**31 - 1
#: Recovery classes from the most to the least freely replayed (an unknown one is the strictest).
_STRICTNESS: dict[str, int] = {
    RecoveryClass.READ_ONLY: 0,
    RecoveryClass.IDEMPOTENT: 1,
    RecoveryClass.EXTERNAL: 2,
}


@dataclass
class RunSignals:
    """Set by the worker's heartbeat and signal handlers; read at every safe point."""

    # attempt lost or cancelled; wakes a waiting model request itself (no polling)
    cancel: threading.Event = field(default_factory=CancelEvent)
    stop: threading.Event = field(default_factory=threading.Event)  # graceful shutdown
    pause: threading.Event = field(default_factory=threading.Event)  # a person asked to pause
    # the run is writing its end: a task the heartbeat no longer finds held has moved on with it
    ending: threading.Event = field(default_factory=threading.Event)


class _Stop(Exception):
    def __init__(self, outcome: Outcome):
        self.outcome = outcome


# What the run's failure message adds to a reason the task's model cannot run it.
_ADVICE = {
    FailureCode.MODEL_UNTESTED: "; run acthelm_connection test first",
    FailureCode.MODEL_NOT_TOOL_CAPABLE: ": resume or retry it on another model, or a person "
    "overrides the record (acthelm_connection test --override-tools)",
}


def _fail(code: str, message: str, *, retryable: bool = True, health: bool = False) -> _Stop:
    return _Stop(
        Outcome(Outcome.FAILED, code=code, message=message, retryable=retryable, health=health)
    )


class CallVerdict(enum.StrEnum):
    """What the checks make of one tool call (`AgentLoop._admit`)."""

    RUN = "run"
    REFUSE = "refuse"
    ASK = "ask"  # a person approves it first


@dataclass(frozen=True)
class Decision:
    """What to do with one tool call: run it, refuse it, or ask a person. A refusal has a code
    and a message; a call to run or to ask about has its tool and parsed arguments."""

    verdict: CallVerdict
    tool: Tool[Any] | None = None
    args: BaseModel | None = None
    hash: str = ""
    canonical: dict[str, Any] | None = None
    code: str = ""
    message: str = ""
    reason: str = ""

    def operation(self) -> tuple[Tool[Any], BaseModel]:
        """The tool and its parsed arguments, which a decision to run or to ask has."""
        if self.tool is None or self.args is None:
            raise ValueError(f"a decision to {self.verdict} names no operation")
        return self.tool, self.args


def _refuse(code: str, message: str) -> Decision:
    return Decision(CallVerdict.REFUSE, code=code, message=message)


# -- the checks every call's arguments pass: a model's call, and a person's edit of one ----------
# (`agents.actions.decisions.approval_approve` with edited arguments calls these, not a copy)


def parse_operation(
    tool: Tool[Any],
    arguments: dict[str, Any] | None,
    *,
    should_stop: Callable[[], bool] | None = None,
) -> Decision:
    """The arguments valid against the tool's model or schema (an MCP tool's, offline, within
    its budget: ``arguments_too_costly`` past it), hashed as the approval binds them and in the
    order jsonb stores them: a decision to run, or a refusal. A schema check that
    ``should_stop`` stops raises ``CheckStopped``."""
    try:
        with stop_checks_when(should_stop):
            args = tool.parse(arguments)
        digest = operation_hash(tool.name, args)
        canonical = args.model_dump(mode="json")
    except ToolError as exc:
        return _refuse(exc.code, exc.message)
    except (ValueError, TypeError) as exc:  # e.g. NaN in the arguments: no hash, no jsonb
        return _refuse("invalid_arguments", f"the arguments cannot be used: {exc}")
    except RecursionError:  # arguments nested too deep to hash: a refusal, not a crash
        return _refuse("invalid_arguments", "the arguments are nested too deeply")
    return Decision(
        CallVerdict.RUN, tool=tool, args=args, hash=digest, canonical=jsonb_order(canonical)
    )


def approval_reason(task: Task, tool: Tool[Any], args: BaseModel, ctx: ToolContext) -> str | None:
    """Why a call needs a person first, or None: the task's policy for the tool, else the tool's
    own default (an MCP tool of an untrusted server asks); then the tool's own reason (a domain
    outside the task's allowed list)."""
    policy = task.tool_policies.get(tool.name) or getattr(tool, "default_policy", ToolPolicy.ALLOW)
    if policy == ToolPolicy.ASK:
        return ApprovalReason.POLICY_ASK
    if tool.approval_reason(args, ctx):
        return ApprovalReason.DOMAIN_NOT_ALLOWED
    return None


def task_tool_context(task: Task, **run: Any) -> ToolContext:
    """What a tool may touch for `task`: its folders, its domains, the egress settings, its
    artifact size; `run` adds what only a running attempt has (its fence, its cancel event)."""
    return ToolContext(
        workspace=workspace_dir(task.pk),
        artifacts_dir=artifacts_dir(task.pk),
        allowed_domains=tuple(task.allowed_domains),
        allow_private_network=settings.ACTHELM_FETCH_ALLOW_PRIVATE,
        allowed_endpoints=tuple(settings.ACTHELM_FETCH_ALLOW_ENDPOINTS),
        max_artifact_bytes=task.limit_artifact_bytes,
        **run,
    )


def pinned_tool(tool: Tool[Any], pins: dict[str, Any]) -> Tool[Any]:
    """An MCP tool as the task pinned it at first use (description, schema, annotations), so
    its arguments are checked against what the task's model read; any other tool as it is."""
    if isinstance(tool, McpTool) and tool.name in pins:
        return McpTool(tool.spec, RemoteTool.from_dict(pins[tool.name]))
    return tool


class AgentLoop:
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
        self.recorder: Recorder | None = None
        # The new turn's first call as admitted when the turn was stored (nothing ran since):
        # run without a second admission, and for an external call with its intent already
        # committed together with the turn (`_intend_with_turn`).
        self.admitted: tuple[CallState, Decision] | None = None
        self.intended = False
        self.tool_context: ToolContext | None = None  # the fixed part, built at first use
        self.feedback_after_round = False  # the task's feedback waits for open calls to run

    # -- entry points ----------------------------------------------------------------------------

    def run(self) -> Outcome:
        try:
            self._load()
        except AttemptLost:
            return Outcome(Outcome.LOST)
        task = self.task
        with telemetry.invoke_agent(
            task_id=self.task_id,
            run_id=self.run_id,
            model=task.model.name if task.model is not None else "",
            provider_name=traced_name(task.connection.kind) if task.connection is not None else "",
        ) as span:
            outcome = self._run()
            span.set_attribute("acthelm.outcome", str(outcome.kind))
            if outcome.kind == OutcomeKind.FAILED and outcome.code:
                span.set_attribute("error.type", outcome.code)
            return outcome

    def _run(self) -> Outcome:
        try:
            self._validate()
            self._prepare()
            return self._loop()
        except _Stop as stop:
            return stop.outcome
        except AttemptLost:
            return Outcome(Outcome.LOST)

    def commit(self) -> None:
        """Write what the run produced since its last commit (one fenced transaction)."""
        assert self.recorder is not None  # set by _load, before anything commits
        self._book(Usage(active_seconds=self._elapsed()))
        self.recorder.commit(self.step, checkpoint=self._checkpoint)
        self.step = Step()

    def finish(self, outcome: Outcome, verdict: SupervisorVerdict | None = None) -> str | None:
        """Record the last step together with the run's outcome, in one fenced transaction.
        Returns the task's new status (None for a lost run: nothing is written)."""
        if outcome.kind == OutcomeKind.LOST:
            return None
        if self.recorder is None:  # the run never loaded its task
            return apply_outcome(
                task_id=self.task_id,
                run_id=self.run_id,
                worker_id=self.actor.label,
                outcome=outcome,
                verdict=verdict,
            )
        self._book(Usage(active_seconds=self._elapsed()))
        status = self.recorder.commit(
            self.step,
            checkpoint=self._checkpoint,
            outcome=outcome,
            verdict=verdict,
        )
        self.step = Step()
        return status

    # -- the saved state, read once ---------------------------------------------------------------

    def _load(self) -> None:
        saved, self.saved = self.saved or load_state(self.task_id, self.run_id), None
        self.task, self.claim_count = saved.task, saved.claim_count
        self.recorder = Recorder(
            task_id=self.task_id,
            run_id=self.run_id,
            actor=self.actor,
            connection_id=saved.connection_id,
            task=saved.task,
        )
        self.conversation = saved.conversation
        self.plan_exists = bool(self.conversation and self.conversation.plan is not None)
        self.next_index = saved.next_index
        self.history = History(self.conversation.system_prompt if self.conversation else "")
        self.calls: list[CallState] = []
        # The conversation has no turn yet: the task's first, or one a person started over
        # (`Conversation.first_turn`), whose system prompt this run builds anew.
        self.fresh_conversation = not saved.turns
        # Every call the task has made is in self.calls: no turn at all, before any conversation.
        self.started_fresh = saved.next_index == 0
        self.last: TurnState | None = None  # the last turn that was not discarded
        for turn in saved.turns:
            self.calls += turn.calls
            if turn.discarded:
                continue
            self.history.add_turn(turn.role, turn.content, turn.calls)
            self.last = turn
        self.approvals, self.run_again = saved.approvals, saved.run_again
        self.offered: list[str] | None = None  # set by _validate
        self.memory_from_run = saved.memory_from_run
        self.memory_to_rank = saved.memory_to_rank
        # Usage of the earlier runs, read once, and this run's own as _book adds it: one sum.
        self.used = saved.usage

    # -- 1. validate ------------------------------------------------------------------------------

    def _validate(self) -> None:
        task = self.task
        connection, model = task.connection, task.model  # read with the task (select_related)
        refusal = model_refusal(
            model if connection is not None else None,  # either missing: connection_missing
            with_tools=has_tools(task.tools),
            connection=connection,
            now=timezone.now(),
        )
        if refusal is not None:
            # Never a silent run without the tools the task was given; a cooldown is waited out.
            raise _fail(
                refusal.code,
                refusal.message + _ADVICE.get(refusal.code, ""),
                retryable=not refusal.code.is_final,
                health=refusal.code == FailureCode.PROVIDER_COOLING_DOWN,
            )
        assert connection is not None and model is not None  # else refused: connection_missing
        self.connection, self.model = connection, model
        self.provider = provider_for(connection)
        capable = model.supports_tools and self.provider.supports_tools
        use_tools = bool(task.tools) and capable
        offered = usable_tool_names(task.tools) if use_tools else []
        self.offered = offered
        # Resolved once: an MCP tool (SERVER__TOOL) is read from its server's recorded list.
        self.tools: dict[str, Tool[Any]] = {name: get_tool(name) for name in offered}
        self._pin_mcp_tools()
        self.specs = [
            ToolSpec(name=t.name, description=t.description, parameters=t.json_schema())
            for t in self.tools.values()
        ]
        if "write_artifact" in offered:
            # From now on, no older run of this task can replace an artifact file.

            stamp_fence(artifacts_dir(self.task_id), self.claim_count)

    def _pin_mcp_tools(self) -> None:
        """An MCP tool as the task first saw it: its description, schema and annotations are
        pinned on the conversation at first use, so that a re-test of its server mid-task (which
        records whatever the server lists now) cannot change what this task's model reads or what
        its arguments are checked against. How to reach the server and whether it is trusted
        are read now."""
        pins = dict(self.conversation.tool_pins or {}) if self.conversation else {}
        fresh = False
        for name, tool in self.tools.items():
            if not isinstance(tool, McpTool):
                continue
            if name not in pins:
                pins[name], fresh = storable.json(tool.remote.as_dict()), True
            self.tools[name] = pinned_tool(tool, pins)
        if fresh:
            self.step.tool_pins = pins

    # -- 2 + 3. memory and the system prompt, once per task ---------------------------------------

    def _prepare(self) -> None:
        step = self.step
        if self.fresh_conversation:
            # No active entry at the load: nothing to rank, and no statement to ask for it.
            chosen = (
                memory_services.rank_for_task(
                    self.task, budget_chars=settings.ACTHELM_MEMORY_BUDGET_CHARS
                )
                if self.memory_to_rank
                else []
            )
            assert self.offered is not None  # set by _validate
            prompt = system_prompt(
                offered=self.offered, memory=memory_services.render_memory(chosen)
            )
            step.memory_chosen = chosen
            step.system_prompt = prompt
            step.restart = self.conversation is not None
            self.history = History(prompt)
            self._user_turn(task_message(self.task.instruction))
        elif self.memory_from_run:
            step.memory_from_run = self.memory_from_run
        last = self.last
        if self.task.feedback:
            if (
                last is not None
                and last.role == Role.ASSISTANT
                and any(c.status not in TOOL_CALL_DONE for c in last.calls)
            ):
                # Calls of the last turn are still open (a person changed a paused task): they
                # run first, and the feedback follows their results (`_loop`).
                self.feedback_after_round = True
            else:
                self._give_feedback()

    def _give_feedback(self) -> None:
        self._user_turn(feedback_message(self.task.feedback))
        self.step.clear_feedback = True
        self.feedback_after_round = False

    def _user_turn(self, content: str) -> None:
        self.step.turns.append(NewTurn(index=self.next_index, role=Role.USER, content=content))
        self.next_index += 1
        self.history.add_turn(Role.USER, content)
        self.last = TurnState(Role.USER, content)

    # -- usage, time and the checkpoint -----------------------------------------------------------

    def _elapsed(self) -> float:
        """The seconds since the last commit (booked with the step that ends now)."""
        now = time.monotonic()
        delta, self._clock = now - self._clock, now
        return delta

    def usage(self) -> Usage:
        """The task's usage now: earlier runs, this run's booked usage, and the time since the
        last commit."""
        return self.used.plus_seconds(time.monotonic() - self._clock)

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
            raise _Stop(Outcome(Outcome.HANDED_BACK))
        if self.signals.pause.is_set():
            # The heartbeat saw a pause request; it may have been withdrawn since.
            assert self.recorder is not None  # set by _load, before the first safe point
            if self.recorder.status() == TaskStatus.PAUSE_REQUESTED:
                raise _Stop(Outcome(Outcome.PAUSED))
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

    def _loop(self) -> Outcome:
        while True:
            if not self.intended:  # a call whose intent committed runs before any safe point
                self._safe_point()
            if self.last is not None and self.last.role == Role.ASSISTANT:
                calls = self.last.calls
                if not calls:
                    # The answer was stored before anything else: never ask the model again.
                    return Outcome(Outcome.FINAL, answer=self.last.content)
                self._round(calls)
                self._safe_point()
                if self.feedback_after_round:
                    self._give_feedback()
            self._check_limits()
            self._model_turn()

    def _check_limits(self) -> None:
        if found := first_reached(BEFORE_A_MODEL_TURN, self.task, self.usage()):
            limit, message = found
            raise _fail(limit.failure_code, message, retryable=False)

    # -- one model turn ---------------------------------------------------------------------------

    def _model_turn(self) -> None:
        task, model = self.task, self.model
        window = model.context_window
        compaction = self.history.compact(
            window=window, reserve=min(task.limit_output_tokens, (window or 0) // 4)
        )
        if compaction is not None:
            self.step.compaction = compaction
            log.info(
                "loop.compacted",
                extra={
                    "task_id": self.task_id,
                    "run_id": self.run_id,
                    "replaced": len(compaction[0]),
                },
            )
        # The answer may use no more tokens than the budgets that count tokens leave.
        remaining_budget = headroom(CUMULATIVE, task, self.usage(), "tokens")
        if remaining_budget is not None:
            max_tokens = max(1, min(task.limit_output_tokens, remaining_budget))
        else:
            max_tokens = task.limit_output_tokens
        try:
            completion = self.provider.complete(
                model=model.name,
                messages=self.history.messages(),
                tools=self.specs,
                max_tokens=max_tokens,
                cancel_event=self.signals.cancel,
            )
        except ProviderError as exc:
            if exc.code == "provider_cancelled":
                raise AttemptLost("cancelled during the model request") from None
            raise _fail(
                exc.code,
                exc.message,
                health=exc.health,
                retryable=exc.code not in PERMANENT_CODES,
            ) from None
        completion, adjusted = _storable(completion)
        free = self.connection.cost_tier == CostTier.ZERO_COST
        usage = turn_usage_fields(model, completion, free=free)
        usage["cost"], cost_adjusted = storable.money(usage["cost"])
        if cost_adjusted:
            adjusted.append("cost")
        self._book_turn(completion, usage["cost"])
        self._store_turn(completion, usage, adjusted)

    def _store_turn(
        self, completion: Completion, usage: dict[str, Any], adjusted: list[str]
    ) -> None:
        discarded = completion.truncated_or_declined
        turn = NewTurn(
            index=self.next_index,
            role=Role.ASSISTANT,
            content=completion.text,
            stop_reason=completion.stop_reason,
            discarded=discarded,
            **usage,
        )
        self.next_index += 1
        self.step.turns.append(turn)
        self.step.event(
            EventKind.MODEL_TURN,
            {
                "turn": turn.index,
                "stop_reason": completion.stop_reason,
                "tool_calls": len(completion.tool_calls),
                "discarded": discarded,
                "tokens": completion.input_tokens + completion.output_tokens,
                **({"adjusted": adjusted} if adjusted else {}),
            },
        )
        plan = self.plan_exists
        calls: list[CallState] = []
        self.admitted = None
        for position, request in enumerate(completion.tool_calls):
            state = CallState(
                call_id=request.id or f"call_{turn.index}_{position}",
                tool=request.name[:100],
                arguments=jsonb_order(request.arguments),
                arguments_raw=request.arguments_raw,
                recovery_class=self._recovery_class(request.name),
                position=position,
            )
            new = NewCall(state)
            if discarded:
                state.status, state.error_code = TC.REFUSED, "turn_discarded"
            else:
                plan, decision = self._decide_new(new, plan)
                if position == 0 and decision.verdict == CallVerdict.RUN:
                    self.admitted = (state, decision)
            turn.calls.append(new)
            calls.append(state)
        self.calls += calls
        if discarded:
            self._user_turn(DISCARDED_NOTE.format(reason=completion.stop_reason))
            self.commit()
            return
        self.history.add_turn(Role.ASSISTANT, completion.text, calls)
        self.last = TurnState(Role.ASSISTANT, completion.text, calls=calls)
        if not calls:
            # A final answer: it is written with the verdict (or before a slow supervisor), or
            # with a hand-back or pause asked for meanwhile (then the next run uses it).
            self.step.answer = completion.text
            if self.step.results or self.step.artifacts:
                # The last round's tool results and artifacts are stored before the verdict:
                # the supervisor's acceptance checks read them (one commit per run, not per
                # step; a run without tools still writes its answer with the verdict).
                self.commit()
            self._safe_point()
            raise _Stop(Outcome(Outcome.FINAL, answer=completion.text))
        self._intend_with_turn()
        self.commit()

    def _intend_with_turn(self) -> None:
        """When the new turn's first call is external and runs now, its intent (running, before
        the request leaves) commits with the turn: one commit where there were two. Not when a
        stop, pause or cancel is signalled (the safe point before the call decides then), nor
        when a limit checked before an MCP call is reached (the call stays open)."""
        if self.admitted is None:
            return
        call, d = self.admitted
        signals = self.signals
        if (
            self._recovers_as(call) != RecoveryClass.EXTERNAL
            or signals.cancel.is_set()
            or signals.stop.is_set()
            or signals.pause.is_set()
            or (
                is_mcp_tool(call.tool)
                and first_reached(BEFORE_AN_MCP_CALL, self.task, self.usage())
            )
        ):
            return
        self._intend(call, d)
        self.intended = True

    def _intend(self, call: CallState, d: Decision) -> None:
        """An external call's intent for the next commit: recorded running before the request
        leaves, so that after a crash the call's outcome is unknown and a person decides (never
        replayed)."""
        call.arguments, call.arguments_hash = d.canonical, d.hash
        self.step.results.append(
            Result(
                call,
                TC.RUNNING,
                finished=False,
                runs=1,
                started=True,
                arguments=d.canonical,
                arguments_hash=d.hash,
            )
        )
        call.status = TC.RUNNING
        self._book_start(call)

    def _decide_new(self, new: NewCall, plan: bool) -> tuple[bool, Decision]:
        """Decide a new call in memory; returns whether a plan exists after it, and the
        decision."""
        state = new.state
        decision = self._admit(state, plan_exists=plan)
        if decision.verdict == CallVerdict.REFUSE:
            _span_outcome(state, "refused", decision.code)
            state.status, state.error_code = TC.REFUSED, decision.code
            new.result = f"{decision.code}: {decision.message}"
            state.result_for_model = f"Error ({decision.code}): {decision.message}"
            self.step.event(
                EventKind.TOOL_RESULT,
                {"tool": state.tool, "ok": False, "error": decision.code},
                call=state,
            )
            return plan, decision
        state.arguments, state.arguments_hash = decision.canonical, decision.hash
        if decision.verdict == CallVerdict.ASK:
            _span_outcome(state, "awaiting_approval")
            state.status = TC.AWAITING_APPROVAL
            new.approval = self._approval(decision)
            self._approval_event(decision)
            return plan, decision
        return plan or state.tool == "update_plan", decision

    # -- one path for every call: parse the arguments, then refuse, ask or run --------------------

    def _admit(self, call: CallState, *, plan_exists: bool) -> Decision:
        """The checks, in order: on the task's list → plan first → arguments valid → bound to
        the operation a person decided (when one did) → needs approval. Pure."""
        if call.tool not in self.tools:  # the tools offered, by name
            return _refuse(
                "tool_not_allowed", f"the tool {call.tool!r} is not available for this task"
            )
        fresh = call.status == TC.PENDING
        if fresh and call.tool != "update_plan" and "update_plan" in self.tools and not plan_exists:
            return _refuse("plan_required", "call update_plan with your plan first")
        try:
            # A cancel or a lost lease stops a long check of an MCP schema at its next poll.
            decision = parse_operation(
                self.tools[call.tool], call.arguments, should_stop=self.signals.cancel.is_set
            )
        except CheckStopped:
            raise AttemptLost("cancelled while the call's arguments were checked") from None
        if decision.verdict == CallVerdict.REFUSE:
            return decision
        tool, args = decision.operation()
        digest, canonical = decision.hash, decision.canonical
        if call.arguments_hash and call.arguments_hash != digest:
            return _refuse("approval_mismatch", "the operation's arguments changed")
        if call.status == TC.APPROVED:
            if not self._bound(call, digest):
                return _refuse(
                    "approval_mismatch", "the approval does not match this operation's arguments"
                )
            return decision
        if not fresh:  # a read-only or idempotent call found running after a crash
            return decision
        ctx = self._context()
        reason = approval_reason(self.task, tool, args, ctx)
        if reason:
            try:
                tool.preflight(args, ctx)
            except ToolError as exc:  # refuse what no approval could make valid
                return _refuse(exc.code, exc.message)
            return Decision(
                CallVerdict.ASK,
                tool=tool,
                args=args,
                hash=digest,
                canonical=canonical,
                reason=reason,
            )
        return decision

    def _bound(self, call: CallState, digest: str) -> bool:
        """A person approved this exact operation, or chose "run again" for it."""
        if call.pk in self.approvals:
            return self.approvals[call.pk] == digest
        return call.pk in self.run_again and call.arguments_hash == digest

    def _approval(self, d: Decision) -> ApprovalRequest:
        tool, args = d.operation()
        return {
            "tool": tool.name,
            "target": tool.target(args),
            "arguments": d.canonical,
            "arguments_hash": d.hash,
            "reason": d.reason,
            "effect": tool.describe_effect(args),
        }

    def _approval_event(self, d: Decision) -> None:
        tool, args = d.operation()
        self.step.event(
            EventKind.APPROVAL_REQUESTED,
            {"tool": tool.name, "target": tool.target(args), "reason": d.reason},
        )

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

    # -- a round: bring every open call of the last turn to a result, or stop for a person --------

    def _round(self, calls: list[CallState]) -> None:
        waiting = unknown = False
        admitted, self.admitted = self.admitted, None
        for call in calls:
            if call.status in TOOL_CALL_DONE:
                continue
            if admitted is not None and call is admitted[0]:
                # The first call of the turn just stored, admitted then: run as decided. Its
                # intent, when external, committed with the turn — no safe point in between.
                intended, self.intended = self.intended, False
                if intended:
                    release_connection()
                else:
                    self._safe_point()
                self._execute(call, admitted[1], intended=intended)
                continue
            self._safe_point()
            if call.status == TC.AWAITING_APPROVAL:
                waiting = True
            elif call.status == TC.UNKNOWN:
                unknown = True
            elif call.status == TC.RUNNING and self._recovers_as(call) == RecoveryClass.EXTERNAL:
                self._mark_unknown(call)  # in flight when a worker stopped: never replayed
                unknown = True
            else:
                waiting |= self._handle(call)
        self.history.touch_last()
        if unknown:
            raise _Stop(Outcome(Outcome.NEEDS_REVIEW))
        if waiting:
            raise _Stop(Outcome(Outcome.AWAITING_APPROVAL))

    def _handle(self, call: CallState) -> bool:
        """Refuse, ask about or run the call; returns whether it waits for a person."""
        d = self._admit(call, plan_exists=self.plan_exists)
        if d.verdict == CallVerdict.REFUSE:
            _span_outcome(call, "refused", d.code)
            self._result(call, TC.REFUSED, error=(d.code, d.message), runs=0)
            return False
        if d.verdict == CallVerdict.ASK:
            _span_outcome(call, "awaiting_approval")
            self.step.results.append(
                Result(
                    call,
                    TC.AWAITING_APPROVAL,
                    finished=False,
                    arguments=d.canonical,
                    arguments_hash=d.hash,
                    approval=self._approval(d),
                )
            )
            call.status = TC.AWAITING_APPROVAL
            self._approval_event(d)
            return True
        self._execute(call, d)
        return False

    def _execute(self, call: CallState, d: Decision, *, intended: bool = False) -> None:
        tool, _ = d.operation()
        mcp = is_mcp_tool(tool.name)
        if (
            not intended
            and mcp
            and (found := first_reached(BEFORE_AN_MCP_CALL, self.task, self.usage()))
        ):
            # Checked before the call starts: it stays open (nothing ran) for a run after the
            # limit is raised.
            limit, message = found
            _span_outcome(call, "refused", limit.failure_code)
            raise _fail(limit.failure_code, message, retryable=False)
        call.arguments, call.arguments_hash = d.canonical, d.hash
        with telemetry.execute_tool(
            tool=tool.name,
            call_id=call.call_id,
            arguments=d.canonical,
            recovery_class=str(tool.recovery_class),
        ) as span:
            self._execute_in_span(call, d, span, intended=intended)

    def _execute_in_span(
        self, call: CallState, d: Decision, span: ToolSpan, *, intended: bool
    ) -> None:
        tool, args = d.operation()
        counted = 0
        recovery = self._recovers_as(call)
        if intended:  # its intent committed with the turn that asked for it
            counted = 1
        elif recovery == RecoveryClass.EXTERNAL:
            # The intent commit: recorded running before the request leaves, so that after a
            # crash the call's outcome is unknown and a person decides (never replayed).
            self._intend(call, d)
            counted = 1
            self.commit()
            release_connection()
        elif recovery != RecoveryClass.READ_ONLY and not tool.internal:
            self._before_an_effect()
        if tool.internal:
            self._execute_internal(call, tool, args, counted)
            span.outcome("failed" if call.error_code else "succeeded", error_code=call.error_code)
            return
        error: ToolError | None = None
        try:
            result = tool.run(args, self._context())
            text, requests, artifact = result.text, result.network_requests, result.artifact
        except ToolError as exc:
            error, text, requests, artifact = exc, "", exc.network_requests, None
        if error is not None and error.code == "cancelled":
            span.outcome("cancelled")
            raise AttemptLost("cancelled while a tool ran")
        if requests:
            self._book(Usage(network_requests=requests))
        if artifact is not None:
            self.step.artifacts.append((call, artifact))
        if error is not None:
            span.outcome("failed", error_code=error.code)
            self._result(call, TC.FAILED, error=(error.code, error.message), runs=1 - counted)
        else:
            span.outcome("succeeded")
            self._result(call, TC.SUCCEEDED, text=text, runs=1 - counted)
        if counted:
            # An external call's result commits as soon as it returns: a crash during the next
            # model request must not turn a call that took effect into an unknown outcome
            # (whose "run again" would repeat it).
            self.commit()
        if error is not None and error.code == "network_limit":
            # A limit checked before a request stopped the tool: the first one reached (or,
            # had the tool counted a request the run did not book, the first one checked).
            usage = self.usage()
            found = first_reached(BEFORE_A_NETWORK_REQUEST, self.task, usage)
            limit = found[0] if found else BEFORE_A_NETWORK_REQUEST[0]
            granted, used = getattr(self.task, limit.field), getattr(usage, limit.counter)
            message = found[1] if found else limit.reached.format(granted=granted, used=used)
            raise _fail(limit.failure_code, message, retryable=False)

    def _execute_internal(
        self, call: CallState, tool: Tool[Any], args: BaseModel, counted: int
    ) -> None:
        result = tool.run(args, self._context())
        if tool.name == "update_plan":
            self.step.plan = result.data
            self.plan_exists = True
            self._result(call, TC.SUCCEEDED, text=result.text, runs=1 - counted)
            return
        # propose_task: the new task's id is part of the result the model gets, so the proposal
        # is written now (follow_up_create; proposing the same title again returns the first).
        assert isinstance(args, ProposeTaskArgs)  # the only other internal tool's arguments
        self.step.proposals.append((call, args))
        self.commit()

    def _result(
        self,
        call: CallState,
        to: str,
        *,
        text: str = "",
        error: tuple[str, str] | None = None,  # code, message
        runs: int,
    ) -> None:
        """A call's result (or refusal) for the next commit, with its tool_result event."""
        # What a tool returns is hostile: stored as the database can store it.
        text = storable.text(text)
        if error is not None:
            code, message = error[0], storable.text(error[1])
            full, for_model = f"{code}: {message}", f"Error ({code}): {message}"
        else:
            code, full = "", text
            for_model = result_for_model(text, self.task.limit_tool_output_chars)
        self.step.results.append(
            Result(
                call,
                to,
                result=full,
                result_for_model=for_model,
                error_code=code,
                runs=max(0, runs),
                started=runs > 0,
                arguments=call.arguments,
                arguments_hash=call.arguments_hash or None,
            )
        )
        if runs > 0:
            self._book_start(call)
        call.status, call.result_for_model, call.error_code = to, for_model, code
        data = {"tool": call.tool, "ok": error is None, "error": code or None}
        if to != TC.REFUSED:
            data["chars"] = len(full)
        self.step.event(EventKind.TOOL_RESULT, data, call=call)

    def _recovery_class(self, name: str) -> str:
        """Read from the tool object: a tool declares what recovery may do with it. A name the
        task does not offer is refused before it runs; an unknown MCP name counts as external."""
        tool = self.tools.get(name) or all_tools().get(name)
        if tool is not None:
            return str(tool.recovery_class)
        return RecoveryClass.EXTERNAL if is_mcp_tool(name) else RecoveryClass.READ_ONLY

    def _recovers_as(self, call: CallState) -> str:
        """The class a call is run and recovered by: for an MCP tool the stricter of the one
        stored when the model asked for it and the one its tool has now. A call recorded as
        external (its server untrusted then) keeps its intent commit and is never replayed after
        a crash although a person has since trusted the server; a call of a server no longer
        trusted is external now."""
        stored = call.recovery_class
        if not is_mcp_tool(call.tool):
            return stored
        current = self._recovery_class(call.tool)
        return max(stored, current, key=lambda c: _STRICTNESS.get(c, len(_STRICTNESS)))

    def _mark_unknown(self, call: CallState) -> None:
        self.step.results.append(Result(call, TC.UNKNOWN, finished=False, unknown=True))
        call.status = TC.UNKNOWN
        # The request may have reached the server before the crash: it counts against the
        # task's network limit like any other request (an MCP call counts as one when it starts).
        if not is_mcp_tool(call.tool):
            self._book(Usage(network_requests=1))
        self.step.event(EventKind.NEEDS_REVIEW, {"tool": call.tool}, call=call)


def _storable(completion: Completion) -> tuple[Completion, list[str]]:
    """The provider's answer as the database can store it (`agents.engine.storable`): text and call
    arguments escaped, counts in their columns' range; returns what was changed, by name."""
    adjusted: list[str] = []
    fields: dict[str, Any] = {}
    for name in ("input_tokens", "cached_input_tokens", "cache_write_tokens", "output_tokens"):
        value, changed = storable.count(getattr(completion, name))
        if changed:
            adjusted.append(name)
            fields[name] = value
    content = storable.text(completion.text)
    if content != completion.text:
        adjusted.append("text")
        fields["text"] = content
    calls: list[ToolCallRequest] = []
    calls_adjusted = False
    for position, request in enumerate(completion.tool_calls):
        safe = {
            "id": storable.text(request.id)[:200],
            "name": storable.text(request.name),
            "arguments": storable.json(request.arguments),
            "arguments_raw": storable.text(request.arguments_raw),
        }
        if any(safe[k] != getattr(request, k) for k in safe):
            adjusted.append(f"tool_call:{position}")
            calls_adjusted = True
        calls.append(request.model_copy(update=safe))
    if calls_adjusted:
        fields["tool_calls"] = calls
    if not adjusted:
        return completion, adjusted
    return completion.model_copy(update=fields), adjusted


def jsonb_order(value: Any) -> Any:
    """`value` with its keys in the order PostgreSQL's jsonb keeps them (shorter keys first),
    so that the history this run keeps in memory is sent exactly as a later run, reading it
    back from the database, sends it."""
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: jsonb_order(value[k]) for k in keys}
    if isinstance(value, list):
        return [jsonb_order(v) for v in value]
    return value


def _span_outcome(call: CallState, outcome: str, error_code: str = "") -> None:
    """An execute_tool span for a call that does not run now (refused, or waiting for a
    person); the arguments go to the span only when the setting allows it."""
    with telemetry.execute_tool(
        tool=call.tool,
        call_id=call.call_id,
        arguments=call.arguments,
        recovery_class=call.recovery_class,
    ) as span:
        span.outcome(outcome, error_code=error_code)
