"""Reads of the operations a person can decide now: pending approvals of tasks awaiting approval
and pending needs_review decisions of tasks that need review. Each carries what the deciding
commands need (the id and the arguments hash they are bound to).

"What a person can still decide" is defined here once (`decidable_approvals`,
`decidable_reviews`): the console inbox, the nav count, the API's approvals list and the
notifications all read it. An evaluation task's operations are decided by the evaluation runner,
never by a person, so they are not in it.
"""

from dataclasses import dataclass
from typing import Any, TypedDict

from django.db import connection
from django.db.models import Model, QuerySet

from approvals.models import Approval, ReviewDecision
from approvals.states import ApprovalStatus, ReviewChoice
from tasks.models import Task
from tasks.states import TaskStatus

#: The keys whose value names what an operation touches, for a decision without its own target.
_TARGET_KEYS = ("url", "path", "name", "title")


def _target_of(arguments: object) -> str:
    if isinstance(arguments, dict):
        for key in _TARGET_KEYS:
            value = arguments.get(key)
            if isinstance(value, str):
                return value
    return ""


def _command(action: str, task_id: int, op_id: int, arguments_hash: str) -> str:
    return f"manage.py acthelm_task {action} {task_id} {op_id} --hash {arguments_hash}"


def decidable_approvals() -> QuerySet[Approval]:
    """Pending approvals a person can still decide: the task waits for them, and it is not an
    evaluation task. Oldest first."""
    return (
        Approval.objects.filter(
            status=ApprovalStatus.PENDING,
            task__status=TaskStatus.AWAITING_APPROVAL,
            task__is_evaluation=False,
        )
        .select_related("task")
        .order_by("created_at", "id")
    )


def decidable_reviews() -> QuerySet[ReviewDecision]:
    """Pending needs_review decisions a person can still decide (as `decidable_approvals`),
    with their tool call (without its result). Oldest first."""
    return (
        ReviewDecision.objects.filter(
            choice=ReviewChoice.PENDING,
            task__status=TaskStatus.NEEDS_REVIEW,
            task__is_evaluation=False,
        )
        .select_related("task", "tool_call")
        .defer("tool_call__result", "tool_call__result_for_model")
        .order_by("created_at", "id")
    )


def _count_all(*querysets: QuerySet[Model]) -> list[int]:
    """How many rows each queryset has, in ONE statement (a scalar count per queryset)."""
    parts: list[str] = []
    params: list[Any] = []
    for qs in querysets:
        sql, qs_params = qs.order_by().values("id").query.sql_with_params()
        parts.append(f"(SELECT count(*) FROM ({sql}) AS q{len(parts)})")
        params.extend(qs_params)
    with connection.cursor() as cursor:
        cursor.execute("SELECT " + ", ".join(parts), params)
        return list(cursor.fetchone())


def decidable_counts() -> tuple[int, int]:
    """(approvals, unknown outcomes) a person can still decide, in one statement over the
    pending rows' partial indexes."""
    approvals, reviews = _count_all(decidable_approvals(), decidable_reviews())
    return approvals, reviews


@dataclass(frozen=True)
class NeedsMe:
    """What waits for a person, counted: decisions (approvals and unknown outcomes), tasks in
    review, failed tasks. Evaluation tasks are never counted."""

    approvals: int
    unknown: int
    review: int
    failed: int

    @property
    def decisions(self) -> int:
        return self.approvals + self.unknown

    @property
    def total(self) -> int:
        return self.decisions + self.review + self.failed


def needs_me_counts() -> NeedsMe:
    """Four small counts in one statement: the pending approvals and decisions (their partial
    indexes) and the tasks in review or failed (task_status_idx)."""
    work = Task.objects.filter(is_evaluation=False)
    return NeedsMe(
        *_count_all(
            decidable_approvals(),
            decidable_reviews(),
            work.filter(status=TaskStatus.REVIEW),
            work.filter(status=TaskStatus.FAILED),
        )
    )


class DecidedApproval(TypedDict):
    """A decided approval, as the CLI and the API answer a decision: the hash that was shown,
    and an edit's (the operation that runs) or a denial's message."""

    approval_id: int
    status: str
    arguments_hash: str
    edited_arguments: dict[str, Any] | None
    edited_arguments_hash: str
    message: str


def decided_as_dict(approval: Approval) -> DecidedApproval:
    return {
        "approval_id": approval.pk,
        "status": approval.status,
        "arguments_hash": approval.arguments_hash,
        "edited_arguments": approval.edited_arguments,
        "edited_arguments_hash": approval.edited_arguments_hash,
        "message": approval.message,
    }


class OpenOperation(TypedDict):
    """An operation a person can decide now, as the API and the CLI show it."""

    kind: str  # "approval" or "review"
    id: int  # the Approval's or the ReviewDecision's
    task_id: int
    task_title: str
    tool: str
    target: str
    arguments: Any  # the tool call's arguments, as the model gave them (JSON)
    arguments_hash: str
    reason: str
    effect: str
    created_at: str
    decide: dict[str, str]  # action → the command that decides it


def open_operations(*, task_id: int | None = None, limit: int | None = None) -> list[OpenOperation]:
    """Every operation a person can decide now, oldest first (of one task with ``task_id``)."""
    if task_id is not None:  # one task's, an evaluation task's too (`acthelm_task show`)
        approvals = (
            Approval.objects.filter(
                status=ApprovalStatus.PENDING,
                task__status=TaskStatus.AWAITING_APPROVAL,
                task_id=task_id,
            )
            .select_related("task")
            .order_by("created_at", "id")
        )
        reviews = (
            ReviewDecision.objects.filter(
                choice=ReviewChoice.PENDING, task__status=TaskStatus.NEEDS_REVIEW, task_id=task_id
            )
            .select_related("task", "tool_call")
            .defer("tool_call__result", "tool_call__result_for_model")
            .order_by("created_at", "id")
        )
    else:
        approvals, reviews = decidable_approvals(), decidable_reviews()
    if limit is not None:
        approvals, reviews = approvals[:limit], reviews[:limit]
    rows: list[OpenOperation] = [
        {
            "kind": "approval",
            "id": a.pk,
            "task_id": a.task_id,
            "task_title": a.task.title,
            "tool": a.tool,
            "target": a.target,
            "arguments": a.arguments,
            "arguments_hash": a.arguments_hash,
            "reason": a.reason,
            "effect": a.effect,
            "created_at": a.created_at.isoformat(),
            "decide": {
                action: _command(action, a.task_id, a.pk, a.arguments_hash)
                for action in ("approve", "deny")
            },
        }
        for a in approvals
    ]
    for d in reviews:
        call = d.tool_call
        rows.append(
            {
                "kind": "review",
                "id": d.pk,
                "task_id": d.task_id,
                "task_title": d.task.title,
                "tool": call.tool,
                "target": _target_of(call.arguments),
                "arguments": call.arguments,
                "arguments_hash": call.arguments_hash,
                "reason": "outcome_unknown",
                "effect": "the call may or may not have run before a worker was lost",
                "created_at": d.created_at.isoformat(),
                "decide": {
                    action: _command(action, d.task_id, d.pk, call.arguments_hash)
                    for action in ("run-again", "skip")
                },
            }
        )
    rows.sort(key=lambda row: (row["created_at"], row["kind"], row["id"]))
    return rows[:limit] if limit is not None else rows


def operations_as_text(rows: list[OpenOperation]) -> str:
    """The operations for a terminal: what, on which target, with which arguments, and how to
    decide (the printed commands carry the id and the hash)."""
    import json

    if not rows:
        return "no open operations"
    lines: list[str] = []
    for row in rows:
        lines.append(
            f"{row['kind']} {row['id']}  task {row['task_id']} ({row['task_title']})  "
            f"{row['tool']}  {row['target'] or '-'}  [{row['reason']}]"
        )
        arguments = json.dumps(row["arguments"], sort_keys=True, ensure_ascii=False)
        lines.append(f"  arguments: {arguments}")
        lines.append(f"  hash: {row['arguments_hash']}")
        for command in row["decide"].values():
            lines.append(f"  decide: {command}")
    return "\n".join(lines)
