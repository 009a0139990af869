"""A person's decisions on single operations, as Agent Inbox answers them: approve an operation
that waits for approval (as proposed, or with arguments the person edited), deny it (with a message
the model receives as the call's result); run again or skip one whose outcome is unknown. Each
decision carries the operation's hash; a stale or altered hash changes nothing. A decision touches
three apps in one transaction: the approval row (`approvals.services`), the tool call
(`agents.engine.store.runs`) and the task, which is queued again when its last open decision
is made (`tasks.transitions`).

An edit passes the checks a model's call passes, the engine's own (`agents.engine.run.admission`:
the arguments against the tool's model or an MCP tool's pinned schema, then the tool's preflight:
paths inside the workspace, addresses the egress policy allows, sizes) and is hashed as the engine
hashes it. The tool call's arguments and hash become the edit's under the row locks, and the
approval binds that hash: the next worker runs exactly the edit, after checking its hash again."""

import json
from typing import Any

from django.db import transaction
from django.db.models import QuerySet
from django.utils import timezone

from agents.catalogue.tools import ToolError, get_tool
from agents.engine.run.admission import (
    CallVerdict,
    Decision,
    approval_reason,
    parse_operation,
    pinned_tool,
    task_tool_context,
)
from agents.engine.store import set_call_status
from agents.models import Conversation, ToolCall
from agents.states import ToolCallStatus
from approvals.models import Approval, ReviewDecision
from approvals.permissions import DECIDE_APPROVAL
from approvals.services import decide_approval_row, decide_review_row
from approvals.states import ApprovalStatus, ReviewChoice
from core.actors import Actor
from core.exceptions import ErrorCode, InvalidInput, StaleDecision, TransitionNotAllowed
from tasks.models import Task
from tasks.states import EventKind, TaskStatus
from tasks.transitions import lock_task, record_event, set_status

DENIED_RESULT = "The operation was denied by a person. It was not run."
#: What the model receives when the person who denied the call wrote why.
DENIED_WITH_MESSAGE = "denied by a person: {message}\nThe operation was not run."
MESSAGE_MAX_CHARS = 2_000
#: An edit's JSON text (a file's content included); the tool's own limits apply after it.
EDIT_MAX_CHARS = 2_000_000
#: Arguments longer than this (as JSON) are named, not copied, in the event; the approval keeps
#: them whole.
EVENT_ARGUMENTS_CHARS = 20_000


SKIPPED_RESULT = (
    "The outcome of this operation is unknown: the worker stopped while it was in flight, "
    "and a person chose not to run it again. It may or may not have taken effect."
)


def denial_message(message: str | None) -> str:
    """A denial's message as stored and sent to the model: trimmed, bounded, printable."""
    text = (message or "").strip()
    if len(text) > MESSAGE_MAX_CHARS:
        raise InvalidInput(
            f"the message is {len(text)} characters; at most {MESSAGE_MAX_CHARS}",
            field="message",
        )
    if "\x00" in text:
        raise InvalidInput("the message contains a NUL character", field="message")
    return text


def edited_arguments(arguments: dict[str, Any] | str | None) -> dict[str, Any] | None:
    """A person's edit: a JSON object (as text from a form or the CLI, or parsed by the API);
    None means the operation as proposed (an emptied edit form is not that: it is refused)."""
    if arguments is None:
        return None
    if isinstance(arguments, str):
        text = arguments.strip()
        if not text:
            raise InvalidInput(
                "the edited arguments are empty: give a JSON object, or approve as proposed",
                code=ErrorCode.INVALID_ARGUMENTS,
                field="arguments",
            )
        if len(text) > EDIT_MAX_CHARS:
            raise InvalidInput(
                f"the edited arguments are {len(text)} characters; at most {EDIT_MAX_CHARS}",
                field="arguments",
            )
        try:
            value = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidInput(
                f"the edited arguments are not valid JSON: {exc.msg} "
                f"(line {exc.lineno}, column {exc.colno})",
                code=ErrorCode.INVALID_ARGUMENTS,
                field="arguments",
            ) from None
        except RecursionError:
            raise InvalidInput(
                "the edited arguments are nested too deeply",
                code=ErrorCode.INVALID_ARGUMENTS,
                field="arguments",
            ) from None
    else:
        value = arguments
    if not isinstance(value, dict):
        raise InvalidInput(
            f"the edited arguments must be a JSON object, not {type(value).__name__}",
            code=ErrorCode.INVALID_ARGUMENTS,
            field="arguments",
        )
    return value


def _check_edit(task: Task, approval: Approval, edit: dict[str, Any]) -> Decision:
    """The edit as the engine would admit a model's call of this tool for this task, or
    InvalidInput naming what is wrong (nothing is decided)."""
    if approval.tool not in task.tools:
        raise InvalidInput(
            f"the tool {approval.tool!r} is no longer on the task's list",
            code=ErrorCode.TOOL_NOT_ALLOWED,
            field="arguments",
        )
    try:
        tool = get_tool(approval.tool)
    except ToolError as exc:
        raise InvalidInput.passing(exc.message, code=exc.code, field="arguments") from None
    pins = Conversation.objects.filter(task=task).values_list("tool_pins", flat=True).first()
    decision = parse_operation(pinned_tool(tool, pins or {}), edit)
    if decision.verdict == CallVerdict.REFUSE:
        raise _refused(decision.code, decision.message)
    tool, args = decision.operation()
    try:
        tool.preflight(args, task_tool_context(task))
    except ToolError as exc:  # what no approval could make valid
        raise _refused(exc.code, exc.message) from None
    return decision


def _refused(code: str, message: str) -> InvalidInput:
    return InvalidInput.passing(
        f"the edited arguments are refused ({code}): {message}", code=code, field="arguments"
    )


def _for_event(arguments: dict[str, Any] | None) -> Any:
    """Arguments as the event keeps them: whole, or named by size when they are long."""
    size = len(json.dumps(arguments, ensure_ascii=False))
    if size <= EVENT_ARGUMENTS_CHARS:
        return arguments
    return {"omitted": f"{size} characters; the approval keeps them"}


def _release_call(call: ToolCall, **edit: object) -> None:
    """A person let the operation run (with the edited `arguments` and `arguments_hash`, when
    they edited it): the next worker runs it, after checking the hash again."""
    set_call_status(call, ToolCallStatus.APPROVED, **edit)


def _settle_call(call: ToolCall, status: str, result: str, code: str) -> None:
    """A person decided the operation does not run: the model gets `result` as its outcome."""
    set_call_status(
        call,
        status,
        result=result,
        result_for_model=result,
        error_code=code,
        finished_at=timezone.now(),
    )


def _lock_with_task[D: (Approval, ReviewDecision)](
    model: type[D], pk: int, what: str
) -> tuple[Task, D]:
    """Lock the decision's task, then the decision row (the order every writer keeps)."""
    task_id = model.objects.filter(pk=pk).values_list("task_id", flat=True).first()
    if task_id is None:
        raise StaleDecision(f"{what} {pk} does not exist")
    return lock_task(task_id), model.objects.select_for_update().get(pk=pk)


def _queue_when_settled(
    task: Task,
    actor: Actor,
    still_open: QuerySet[Approval] | QuerySet[ReviewDecision],
    *,
    after: str,
) -> None:
    """The task's last open decision was made: it is queued again."""
    if not still_open.exists():
        set_status(
            task, TaskStatus.READY, actor=actor, kind=EventKind.RESUMED, data={"after": after}
        )


def _decide_approval(
    *,
    actor: Actor,
    approval_id: int,
    arguments_hash: str,
    approve: bool,
    arguments: dict[str, Any] | str | None = None,
    message: str = "",
) -> Approval:
    actor.require(DECIDE_APPROVAL)
    edit = edited_arguments(arguments) if approve else None
    message = "" if approve else denial_message(message)
    with transaction.atomic():
        task, approval = _lock_with_task(Approval, approval_id, "approval")
        if task.status != TaskStatus.AWAITING_APPROVAL:
            raise StaleDecision(f"task {task.pk} is {task.status}, not awaiting approval")
        if approval.status != ApprovalStatus.PENDING:
            raise StaleDecision(f"this operation was already {approval.status}")
        if not arguments_hash or arguments_hash != approval.arguments_hash:
            raise StaleDecision(
                "the decision does not match the operation's hash: the operation changed"
            )
        call = ToolCall.objects.select_for_update().get(pk=approval.tool_call_id)
        if call.arguments_hash != approval.arguments_hash:
            raise StaleDecision("the operation's arguments no longer match the approval")
        checked = _check_edit(task, approval, edit) if edit is not None else None
        if checked is not None and checked.hash == approval.arguments_hash:
            checked = None  # the edit changed nothing: approved as proposed
        data: dict[str, Any] = {
            "approval_id": approval.pk,
            "tool": approval.tool,
            "target": approval.target,
            "arguments_hash": approval.arguments_hash,
        }
        if approve and checked is not None:
            tool, args = checked.operation()
            decide_approval_row(
                approval,
                ApprovalStatus.APPROVED,
                actor,
                edited_arguments=checked.canonical,
                edited_arguments_hash=checked.hash,
            )
            # The worker runs the call's arguments after hashing them again: from now on the
            # edit's, bound to the hash the approval holds.
            _release_call(call, arguments=checked.canonical, arguments_hash=checked.hash)
            data |= {
                "edited": True,
                "original_arguments": _for_event(approval.arguments),
                "edited_arguments": _for_event(checked.canonical),
                "edited_arguments_hash": checked.hash,
                "edited_target": tool.target(args),
            }
            reason = approval_reason(task, tool, args, task_tool_context(task))
            if reason:  # what a model's call like it would have asked a person for
                data["edited_reason"] = reason
        elif approve:
            decide_approval_row(approval, ApprovalStatus.APPROVED, actor)
            _release_call(call)
        else:
            decide_approval_row(approval, ApprovalStatus.DENIED, actor, message=message)
            result = DENIED_WITH_MESSAGE.format(message=message) if message else DENIED_RESULT
            _settle_call(call, ToolCallStatus.DENIED, result, "denied")
            if message:
                data["message"] = message
        record_event(
            task,
            actor=actor,
            kind=EventKind.APPROVED if approve else EventKind.DENIED,
            data=data,
        )
        still_open = Approval.objects.filter(task=task, status=ApprovalStatus.PENDING)
        _queue_when_settled(task, actor, still_open, after="approvals decided")
        return approval


def approval_approve(
    *,
    actor: Actor,
    approval_id: int,
    arguments_hash: str,
    arguments: dict[str, Any] | str | None = None,
) -> Approval:
    """Let the operation run: as proposed, or with `arguments` (a JSON object, or its text) in
    place of the model's, validated and hashed as a model's call is. `arguments_hash` is the
    proposal's, as the person saw it; the edit's hash is the approval's `edited_arguments_hash`."""
    return _decide_approval(
        actor=actor,
        approval_id=approval_id,
        arguments_hash=arguments_hash,
        approve=True,
        arguments=arguments,
    )


def approval_deny(
    *, actor: Actor, approval_id: int, arguments_hash: str, message: str = ""
) -> Approval:
    """Refuse the operation; the model receives `message` as the call's result ("denied by a
    person: …"), or a fixed text when there is none, and carries on without it."""
    return _decide_approval(
        actor=actor,
        approval_id=approval_id,
        arguments_hash=arguments_hash,
        approve=False,
        message=message,
    )


def _decide_review(
    *, actor: Actor, decision_id: int, arguments_hash: str, choice: str
) -> ReviewDecision:
    actor.require(DECIDE_APPROVAL)
    with transaction.atomic():
        task, decision = _lock_with_task(ReviewDecision, decision_id, "decision")
        if task.status != TaskStatus.NEEDS_REVIEW:
            raise StaleDecision(f"task {task.pk} is {task.status}, not needs_review")
        if decision.choice != ReviewChoice.PENDING:
            raise StaleDecision(f"this operation was already decided: {decision.choice}")
        call = ToolCall.objects.select_for_update().get(pk=decision.tool_call_id)
        if not arguments_hash or arguments_hash != call.arguments_hash:
            raise StaleDecision("the decision does not match the operation's hash")
        if call.status != ToolCallStatus.UNKNOWN:
            raise TransitionNotAllowed(f"the operation is {call.status}, not of unknown outcome")
        decide_review_row(decision, choice, actor)
        if choice == ReviewChoice.RUN_AGAIN:
            _release_call(call)
        else:
            _settle_call(call, ToolCallStatus.SKIPPED, SKIPPED_RESULT, "outcome_unknown")
        record_event(
            task,
            actor=actor,
            kind=EventKind.RUN_AGAIN if choice == ReviewChoice.RUN_AGAIN else EventKind.SKIPPED,
            data={
                "tool_call_id": call.pk,
                "tool": call.tool,
                "arguments_hash": call.arguments_hash,
            },
        )
        still_open = ReviewDecision.objects.filter(task=task, choice=ReviewChoice.PENDING)
        _queue_when_settled(task, actor, still_open, after="needs_review decided")
        return decision


def review_run_again(*, actor: Actor, decision_id: int, arguments_hash: str) -> ReviewDecision:
    return _decide_review(
        actor=actor,
        decision_id=decision_id,
        arguments_hash=arguments_hash,
        choice=ReviewChoice.RUN_AGAIN,
    )


def review_skip(*, actor: Actor, decision_id: int, arguments_hash: str) -> ReviewDecision:
    return _decide_review(
        actor=actor,
        decision_id=decision_id,
        arguments_hash=arguments_hash,
        choice=ReviewChoice.SKIP,
    )
