"""Read a settled task's stored record for the grader (a selector: reads only)."""

from pathlib import Path

from django.db.models import Sum

from agents.eval.grading import ApprovalRecord, CallRecord, TaskRecord
from agents.models import AgentRun, Artifact, Conversation, ToolCall
from approvals.models import Approval
from tasks.models import Task

MAX_ARTIFACT_CHARS = 1_000_000


def _artifact_text(path: str) -> str | None:
    try:
        data = Path(path).read_bytes()[: MAX_ARTIFACT_CHARS * 4]
        return data.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def task_record(task_id: int) -> TaskRecord:
    """Final state, answer, artifacts (with their text), tool calls with their statuses,
    approvals, plan and usage of one task, as stored."""
    task = Task.objects.only("id", "status", "failure_code").get(pk=task_id)
    runs = AgentRun.objects.filter(task_id=task_id)
    newest = runs.order_by("-number").values("answer", "error_code").first() or {
        "answer": "",
        "error_code": "",
    }
    answered = (
        runs.filter(answer_stored_at__isnull=False)
        .order_by("-number")
        .values_list("answer", flat=True)
        .first()
    )
    usage = runs.aggregate(
        turns=Sum("model_turns"),
        tokens_in=Sum("input_tokens"),
        tokens_out=Sum("output_tokens"),
        seconds=Sum("active_seconds"),
    )
    calls = tuple(
        CallRecord(tool=c["tool"], status=c["status"], error_code=c["error_code"], run_count=n)
        for c in ToolCall.objects.filter(task_id=task_id)
        .order_by("turn__index", "position")
        .values("tool", "status", "error_code", "run_count")
        for n in [c["run_count"]]
    )
    approvals = tuple(
        ApprovalRecord(tool=a["tool"], target=a["target"], status=a["status"])
        for a in Approval.objects.filter(task_id=task_id)
        .order_by("id")
        .values("tool", "target", "status")
    )
    artifacts = {
        a.name: _artifact_text(a.path)
        for a in Artifact.objects.filter(task_id=task_id).only("name", "path")
    }
    model_ids = tuple(runs.order_by("number").values_list("model_id", flat=True))
    plan = Conversation.objects.filter(task_id=task_id, plan__isnull=False).exists()
    return TaskRecord(
        task_id=task.pk,
        state=task.status,
        failure_code=task.failure_code,
        last_error_code=newest.get("error_code") or "",
        answer=answered if answered is not None else (newest.get("answer") or ""),
        artifacts=artifacts,
        calls=calls,
        approvals=approvals,
        plan=plan,
        model_turns=usage["turns"] or 0,
        input_tokens=usage["tokens_in"] or 0,
        output_tokens=usage["tokens_out"] or 0,
        active_seconds=float(usage["seconds"] or 0),
        model_ids=model_ids,
    )
