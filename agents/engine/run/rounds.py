"""A run's tool calls: each new call decided as the model's turn is stored (`_decide_new`), then
every open call of the last turn brought to a result in a round, or stopped for a person. One path
for every call: the admission rules (`agents.engine.run.admission`), then refuse, ask or run; an
external call's intent commits before its request leaves, and its result as soon as it returns."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from agents.catalogue.tools import RecoveryClass, Tool, ToolError, ToolResult, all_tools
from agents.catalogue.tools.mcp import is_mcp_tool
from agents.catalogue.tools.plan import ProposeTaskArgs
from agents.catalogue.tools.schemas import CheckStopped
from agents.engine.run.admission import (
    CallVerdict,
    Decision,
    approval_reason,
    approval_request,
    parse_operation,
    refuse,
)
from agents.engine.run.prompting import result_for_model
from agents.engine.run.recorder import CallState, NewCall, Result
from agents.engine.run.state import RunState, Stop, fail
from agents.engine.run.usage import Usage, first_reached
from agents.engine.store import storable
from agents.engine.verdict.outcomes import Outcome
from agents.states import TOOL_CALL_DONE
from agents.states import ToolCallStatus as TC
from core import fibers, telemetry
from core.dbpool import release_connection
from core.exceptions import AttemptLost
from tasks.limits import BEFORE_A_NETWORK_REQUEST, BEFORE_AN_MCP_CALL
from tasks.states import EventKind

if TYPE_CHECKING:
    from pydantic import BaseModel

    from core.telemetry import ToolSpan

#: Recovery classes from the most to the least freely replayed (an unknown one is the strictest).
_STRICTNESS: dict[str, int] = {
    RecoveryClass.READ_ONLY: 0,
    RecoveryClass.IDEMPOTENT: 1,
    RecoveryClass.EXTERNAL: 2,
}


class ToolRounds(RunState):
    """The tool calls of a run (`AgentLoop` is one)."""

    __slots__ = ()

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
            span_outcome(state, "refused", decision.code)
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
            span_outcome(state, "awaiting_approval")
            state.status = TC.AWAITING_APPROVAL
            new.approval = approval_request(decision)
            self._approval_event(decision)
            return plan, decision
        return plan or state.tool == "update_plan", decision

    # -- one path for every call: parse the arguments, then refuse, ask or run --------------------

    def _admit(self, call: CallState, *, plan_exists: bool) -> Decision:
        """The checks, in order: on the task's list → plan first → arguments valid → bound to
        the operation a person decided (when one did) → needs approval. Pure."""
        if call.tool not in self.tools:  # the tools offered, by name
            return refuse(
                "tool_not_allowed", f"the tool {call.tool!r} is not available for this task"
            )
        fresh = call.status == TC.PENDING
        if fresh and call.tool != "update_plan" and "update_plan" in self.tools and not plan_exists:
            return refuse("plan_required", "call update_plan with your plan first")
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
            return refuse("approval_mismatch", "the operation's arguments changed")
        if call.status == TC.APPROVED:
            if not self._bound(call, digest):
                return refuse(
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
                return refuse(exc.code, exc.message)
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

    def _approval_event(self, d: Decision) -> None:
        tool, args = d.operation()
        self.step.event(
            EventKind.APPROVAL_REQUESTED,
            {"tool": tool.name, "target": tool.target(args), "reason": d.reason},
        )

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
            raise Stop(Outcome(Outcome.NEEDS_REVIEW))
        if waiting:
            raise Stop(Outcome(Outcome.AWAITING_APPROVAL))

    def _handle(self, call: CallState) -> bool:
        """Refuse, ask about or run the call; returns whether it waits for a person."""
        d = self._admit(call, plan_exists=self.plan_exists)
        if d.verdict == CallVerdict.REFUSE:
            span_outcome(call, "refused", d.code)
            self._result(call, TC.REFUSED, error=(d.code, d.message), runs=0)
            return False
        if d.verdict == CallVerdict.ASK:
            span_outcome(call, "awaiting_approval")
            self.step.results.append(
                Result(
                    call,
                    TC.AWAITING_APPROVAL,
                    finished=False,
                    arguments=d.canonical,
                    arguments_hash=d.hash,
                    approval=approval_request(d),
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
            span_outcome(call, "refused", limit.failure_code)
            raise fail(limit.failure_code, message, retryable=False)
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
            result = self._run_tool(tool, args)
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
            raise fail(limit.failure_code, message, retryable=False)

    def _run_tool(self, tool: Tool[Any], args: BaseModel) -> ToolResult:
        """The tool's work. In a worker's fiber, a tool that waits on the network with a
        blocking client (a fetch) runs on the blocking pool, so that it holds no step thread;
        an MCP call waits on the process's loop by itself; the others are the step's CPU
        (`core.fibers`)."""
        if tool.waits_on_network:
            return fibers.blocking(tool.run, args, self._context())
        return tool.run(args, self._context())

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


def span_outcome(call: CallState, outcome: str, error_code: str = "") -> None:
    """An execute_tool span for a call that does not run now (refused, or waiting for a
    person); the arguments go to the span only when the setting allows it."""
    with telemetry.execute_tool(
        tool=call.tool,
        call_id=call.call_id,
        arguments=call.arguments,
        recovery_class=call.recovery_class,
    ) as span:
        span.outcome(outcome, error_code=error_code)
