"""The evaluation page: pass rates per connection/model with their intervals, every case's
outcomes linked to the tasks that produced them, beside the model's real work."""

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents.eval.report import eval_report
from agents.permissions import VIEW_AGENTRUN
from console.http import AuthenticatedHttpRequest
from console.shared import console_view, positive_int


@require_GET
@console_view(VIEW_AGENTRUN)
def evaluation(request: AuthenticatedHttpRequest) -> HttpResponse:
    run_id = positive_int(request.GET.get("run"))
    context = {"report": eval_report(run_id=run_id), "run_id": run_id}
    return render(request, "console/eval.html", context)
