"""Reads for the API: a task with its transcript, runs, pending operations and timeline; the
open operations of the approvals inbox. Each read makes a fixed number of queries. The task, its
runs, artifacts and events are the serializers the CLI's --json reads too (`tasks.selectors`,
`agents.selectors`)."""

from datetime import datetime
from typing import TYPE_CHECKING, Any, TypedDict, cast

from agents.models import ToolCall
from agents.selectors import artifact_as_dict, run_as_dict, task_read
from approvals.models import Approval, ReviewDecision
from approvals.selectors import decidable_approvals, decidable_reviews
from tasks.selectors import blocking_reason, event_as_dict, task_as_dict


class ApprovalDict(TypedDict):
    id: int
    task_id: int
    tool_call_id: int
    tool: str
    target: str
    arguments: Any
    arguments_hash: str
    reason: str
    effect: str
    status: str
    created_at: str


class ReviewDict(TypedDict):
    id: int
    task_id: int
    tool_call_id: int
    tool: str
    arguments: Any
    arguments_hash: str
    choice: str
    created_at: str


class ToolCallDict(TypedDict):
    id: int
    position: int
    tool: str
    arguments: Any
    arguments_raw: str | None
    arguments_hash: str | None
    recovery_class: str
    status: str
    error_code: str | None
    result: str
    result_chars: int
    result_truncated: bool
    compacted: bool
    run_count: int


class PendingOperations(TypedDict):
    approvals: list[ApprovalDict]
    reviews: list[ReviewDict]
    more: bool


class ModelDict(TypedDict):
    id: int
    name: str
    context_window: int | None
    supports_tools: bool
    test_status: str
    test_message: str
    tested_at: datetime | None
    #: Whether the server streams its answers, by the last test (None: unknown).
    streams: bool | None


class ConnectionDict(TypedDict):
    id: int
    name: str
    kind: str
    base_url: str
    program: str | None
    credential_env: str
    cost_tier: str
    priority: int
    enabled: bool
    cooldown_until: datetime | None
    cooling: bool
    last_error_code: str | None
    models: list[ModelDict]


class _ResultHead(TypedDict):
    """What the task's read annotates on each tool call instead of loading its whole result."""

    result_head: str
    full_result_chars: int


if TYPE_CHECKING:  # django_stubs_ext is a development dependency
    from django_stubs_ext import WithAnnotations

    ToolCallHead = WithAnnotations[ToolCall, _ResultHead]


def approval_as_dict(approval: Approval) -> ApprovalDict:
    return {
        "id": approval.pk,
        "task_id": approval.task_id,
        "tool_call_id": approval.tool_call_id,
        "tool": approval.tool,
        "target": approval.target,
        "arguments": approval.arguments,
        "arguments_hash": approval.arguments_hash,
        "reason": approval.reason,
        "effect": approval.effect,
        "status": approval.status,
        "created_at": approval.created_at.isoformat(),
    }


def review_as_dict(decision: ReviewDecision, call: ToolCall) -> ReviewDict:
    return {
        "id": decision.pk,
        "task_id": decision.task_id,
        "tool_call_id": call.pk,
        "tool": call.tool,
        "arguments": call.arguments,
        "arguments_hash": call.arguments_hash,
        "choice": decision.choice,
        "created_at": decision.created_at.isoformat(),
    }


def _call_as_dict(call: "ToolCallHead") -> ToolCallDict:
    result = call.result_head or ""
    return {
        "id": call.pk,
        "position": call.position,
        "tool": call.tool,
        "arguments": call.arguments,
        "arguments_raw": call.arguments_raw if call.arguments is None else None,
        "arguments_hash": call.arguments_hash or None,
        "recovery_class": call.recovery_class,
        "status": call.status,
        "error_code": call.error_code or None,
        "result": result,
        "result_chars": call.full_result_chars,
        "result_truncated": call.full_result_chars > len(result),
        "compacted": call.compacted,
        "run_count": call.run_count,
    }


def task_detail(
    task_id: int,
    *,
    all_turns: bool = False,
    turns_before: int | None = None,
    events_before: int | None = None,
) -> dict[str, Any] | None:
    """Everything the task page shows, as data (`agents.selectors.task_read`); None for an
    unknown task. The transcript is the newest 100 turns (500 with `all_turns`) below
    `turns_before`, the timeline the newest 200 events below `events_before`; `older_turns` /
    `older_events` are the cursors of the next older pages."""
    read = task_read(
        task_id, all_turns=all_turns, turns_before=turns_before, events_before=events_before
    )
    if read is None:
        return None
    task = read.task
    data = task_as_dict(task)
    data["blocking_reason"] = blocking_reason(task)
    numbers = {facts.run.pk: facts.run.number for facts in read.runs}
    data["runs"] = [run_as_dict(facts) for facts in read.runs]
    data["transcript"] = [
        {
            "index": turn.index,
            "run_number": numbers.get(turn.run_id),
            "role": turn.role,
            "content": turn.content,
            "stop_reason": turn.stop_reason or None,
            "discarded": turn.discarded,
            "input_tokens": turn.input_tokens,
            "output_tokens": turn.output_tokens,
            # The read's transcript annotates each call with its result's head.
            "tool_calls": [
                _call_as_dict(cast("ToolCallHead", call)) for call in turn.tool_calls.all()
            ],
            "at": turn.created_at.isoformat(),
        }
        for turn in read.turns
    ]
    data["earlier_turns"] = read.older_turns is not None
    data["older_turns"] = read.older_turns
    data["pending_approvals"] = [approval_as_dict(a) for a in read.pending_approvals]
    data["pending_reviews"] = [review_as_dict(d, d.tool_call) for d in read.pending_reviews]
    data["plan"] = read.plan
    data["usage"] = {
        "model_turns": read.usage.model_turns,
        "tokens": read.usage.tokens,
        "active_seconds": read.usage.active_seconds,
        "network_requests": read.usage.network_requests,
    }
    data["input_files"] = read.input_files
    data["artifacts"] = [artifact_as_dict(a) for a in read.artifacts]
    data["rejection"] = read.rejection.as_dict() if read.rejection else None
    data["earlier_events"] = read.older_events is not None
    data["older_events"] = read.older_events
    data["events"] = [event_as_dict(e) for e in read.events]
    return data


def pending_operations(limit: int) -> PendingOperations:
    """The approvals inbox: what a person can still decide (`approvals.selectors`; never an
    evaluation task's), oldest first."""
    approvals, reviews = decidable_approvals(), decidable_reviews()
    a_rows = list(approvals[: limit + 1])
    r_rows = list(reviews[: limit + 1])
    return {
        "approvals": [approval_as_dict(a) for a in a_rows[:limit]],
        "reviews": [review_as_dict(d, d.tool_call) for d in r_rows[:limit]],
        "more": len(a_rows) > limit or len(r_rows) > limit,
    }
