"""The agent loop: one run of a claimed task, from the saved state to an Outcome.

The run loads the task's saved state once (conversation, calls, plan, usage) and keeps it in
memory (`agents.engine.run.state`). Each step: run the tool calls of the last model turn that are
still open (`agents.engine.run.rounds`), ask the model, decide the new turn's calls (the admission
rules, `agents.engine.run.admission`: on the task's list → plan first → arguments valid → needs
approval), and hand everything to the recorder, which writes the step in ONE fenced transaction
(`agents.engine.run.recorder`). No transaction is open while the model or a tool runs; the loop
owns no SQL. The loop never changes the task's status: it returns an Outcome, and `finish`
records the last step together with it.

Prompt building and compaction: `agents.engine.run.prompting`. What an outcome does:
`agents.engine.verdict.outcomes`.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.conf import settings
from django.utils import timezone

from agents.catalogue.connections import provider_for
from agents.catalogue.eligibility import has_tools, model_refusal
from agents.catalogue.prices import turn_usage_fields
from agents.catalogue.providers import Completion, ProviderError, ToolCallRequest
from agents.catalogue.providers.base import PERMANENT_CODES, traced_name
from agents.catalogue.tools import (
    RecoveryClass,
    Tool,
    get_tool,
    usable_tool_names,
)
from agents.catalogue.tools.artifacts import stamp_fence
from agents.catalogue.tools.mcp import McpTool, is_mcp_tool
from agents.engine.run.admission import CallVerdict, jsonb_order, offered_spec, pinned_tool
from agents.engine.run.prompting import (
    DISCARDED_NOTE,
    History,
    feedback_message,
    system_prompt,
    task_message,
)
from agents.engine.run.recorder import (
    CallState,
    NewCall,
    NewTurn,
    Recorder,
    Step,
    TurnState,
    load_state,
)
from agents.engine.run.rounds import ToolRounds
from agents.engine.run.state import RunSignals, Stop, fail
from agents.engine.run.usage import Usage, first_reached, headroom
from agents.engine.store import storable
from agents.engine.verdict.outcomes import Outcome, OutcomeKind, apply_outcome
from agents.states import TOOL_CALL_DONE, CostTier, FailureCode, Role
from agents.states import ToolCallStatus as TC
from core import telemetry
from core.exceptions import AttemptLost
from memory import services as memory_services
from tasks.limits import (
    BEFORE_A_MODEL_TURN,
    BEFORE_AN_MCP_CALL,
    CUMULATIVE,
)
from tasks.states import EventKind
from tasks.workspace import artifacts_dir

if TYPE_CHECKING:
    from agents.engine.verdict.supervisor import SupervisorVerdict

__all__ = ["AgentLoop", "Outcome", "RunSignals"]

log = logging.getLogger("acthelm.loop")

# What the run's failure message adds to a reason the task's model cannot run it.
_ADVICE = {
    FailureCode.MODEL_UNTESTED: "; run acthelm_connection test first",
    FailureCode.MODEL_NOT_TOOL_CAPABLE: ": resume or retry it on another model, or a person "
    "overrides the record (acthelm_connection test --override-tools)",
}


class AgentLoop(ToolRounds):
    """One run of a claimed task, from its saved state to an Outcome."""

    __slots__ = ()

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
        except Stop as stop:
            return stop.outcome
        except AttemptLost:
            return Outcome(Outcome.LOST)

    def finish(self, outcome: Outcome, verdict: SupervisorVerdict | None = None) -> str | None:
        """Record the last step together with the run's outcome, in one fenced transaction.
        Returns the task's new status (None for a lost run: nothing is written)."""
        if outcome.kind == OutcomeKind.LOST:
            self._live_end(stored=False)  # nothing of the run is written
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
        self._live_end(stored=True)
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
            raise fail(
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
        self.specs = [offered_spec(t) for t in self.tools.values()]
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
            raise fail(limit.failure_code, message, retryable=False)

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
        # The turn is published as it is written (`tasks.live`: nothing is sent while nobody
        # watches); its "end" follows the commit that stores it. A model whose test found that
        # its server does not stream is asked for whole answers (no refused attempt first).
        stream = settings.ACTHELM_STREAM_TURNS and model.streams is not False
        self._live_start()
        try:
            completion = self.provider.complete(
                model=model.name,
                messages=self.history.messages(),
                tools=self.specs,
                max_tokens=max_tokens,
                cancel_event=self.signals.cancel,
                on_delta=self._live_delta if stream else None,
            )
        except ProviderError as exc:
            self._live_end(stored=False)  # cut off, refused, cancelled: nothing of it is kept
            if exc.code == "provider_cancelled":
                raise AttemptLost("cancelled during the model request") from None
            raise fail(
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
            self._live_end(stored=False)  # truncated or declined: a viewer drops what it showed
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
            raise Stop(Outcome(Outcome.FINAL, answer=completion.text))
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


def _storable(completion: Completion) -> tuple[Completion, list[str]]:
    """The provider's answer as the database can store it (`agents.engine.store.storable`): text and
    call
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
