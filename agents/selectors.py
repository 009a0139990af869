"""Reads for the console, the CLI and the API that reach past the ledger into runs and turns."""

from django.db.models import DecimalField, OuterRef, Subquery, Sum

from agents.limits import task_usage
from agents.models import Turn
from tasks.selectors import event_as_dict, task_as_dict


def task_cost_subquery() -> Subquery:
    """The sum of a task's turn costs, for ``.annotate()`` on a page of tasks: one query for
    the page, whatever its size (turns are found through the (task, index) unique index).
    None when no turn has a known cost."""
    total = (
        Turn.objects.filter(task=OuterRef("pk"), cost__isnull=False)
        .order_by()
        .values("task")
        .annotate(total=Sum("cost"))
        .values("total")
    )
    return Subquery(total, output_field=DecimalField(max_digits=16, decimal_places=8))


def task_with_history(task) -> dict:
    """`task_as_dict` with what the task used, its timeline and its runs (`acthelm_task show`)."""
    data = task_as_dict(task)
    usage = task_usage(task.pk)
    data["cost"] = str(usage.cost)
    data["usage"] = usage.as_dict()
    data["events"] = [event_as_dict(e) for e in task.events.order_by("id")]
    data["runs"] = [
        {
            "id": r.pk,
            "number": r.number,
            "status": r.status,
            "worker_id": r.worker_id,
            "verdict": r.verdict or None,
            "verdict_reason": r.verdict_reason or None,
            "error_code": r.error_code or None,
            "answer": r.answer or None,
        }
        for r in task.runs.order_by("number")
    ]
    return data
