"""The evaluation page: pass rates per connection/model with their intervals, every case's
outcomes linked to the tasks that produced them, beside the model's real work."""

from django.contrib.auth.decorators import login_required, permission_required
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents.eval.report import eval_report


def _int(value) -> int | None:
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


@require_GET
@login_required
@permission_required("agents.view_agentrun", raise_exception=True)
def evaluation(request):
    run_id = _int(request.GET.get("run"))
    context = {"report": eval_report(run_id=run_id), "run_id": run_id}
    return render(request, "console/eval.html", context)
