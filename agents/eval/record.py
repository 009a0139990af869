"""Read a settled task's stored record for the grader (a selector: reads only): what its runs
produced, read as the acceptance checks read it (`agents.engine.verdict.evidence.run_record`), and
what the grader also judges."""

from dataclasses import fields

from django.db.models import Sum

from agents.engine.verdict.evidence import RunRecord, run_record
from agents.eval.grading import ApprovalRecord, TaskRecord
from agents.models import AgentRun, Conversation
from approvals.models import Approval
from tasks.models import Task


def task_record(task_id: int) -> TaskRecord:
    """Final state, answer, artifacts (by name; their text is read when a check needs it), tool
    calls with their statuses, approvals, plan and usage of one task, as stored."""
    task = Task.objects.get(pk=task_id)
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
    run = run_record(task, answered if answered is not None else (newest.get("answer") or ""))
    usage = runs.aggregate(
        turns=Sum("model_turns"),
        tokens_in=Sum("input_tokens"),
        tokens_out=Sum("output_tokens"),
        seconds=Sum("active_seconds"),
    )
    approvals = tuple(
        ApprovalRecord(tool=a["tool"], target=a["target"], status=a["status"])
        for a in Approval.objects.filter(task_id=task_id)
        .order_by("id")
        .values("tool", "target", "status")
    )
    model_ids = tuple(runs.order_by("number").values_list("model_id", flat=True))
    plan = Conversation.objects.filter(task_id=task_id, plan__isnull=False).exists()
    return TaskRecord(
        **{f.name: getattr(run, f.name) for f in fields(RunRecord)},
        task_id=task.pk,
        state=task.status,
        failure_code=task.failure_code,
        last_error_code=newest.get("error_code") or "",
        approvals=approvals,
        plan=plan,
        model_turns=usage["turns"] or 0,
        input_tokens=usage["tokens_in"] or 0,
        output_tokens=usage["tokens_out"] or 0,
        active_seconds=float(usage["seconds"] or 0),
        model_ids=model_ids,
    )
