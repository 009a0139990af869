"""A goal's page in the console: the goal and its tasks, newest first, with counts by state."""

from django.http import HttpResponse
from django.shortcuts import get_object_or_404, render
from django.views.decorators.http import require_GET

from agents.engine.verdict.acceptance import check_text
from console.http import AuthenticatedHttpRequest
from console.shared import console_view
from tasks.models import Goal, Task
from tasks.selectors import goal_as_dict

GOAL_TASKS = 200


@require_GET
@console_view()
def goal_detail(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    goal = get_object_or_404(Goal, pk=pk)
    data = goal_as_dict(goal)
    tasks = list(
        Task.objects.filter(goal=goal)
        .only("id", "title", "status", "failure_code", "is_evaluation", "updated_at")
        .order_by("-id")[: GOAL_TASKS + 1]
    )
    context = {
        "goal": goal,
        "counts": sorted(data["task_counts"].items()),
        "open_tasks": data["open_tasks"],
        "acceptance_checks": [check_text(c) for c in data["acceptance_checks"]],
        "tasks": tasks[:GOAL_TASKS],
        "more": len(tasks) > GOAL_TASKS,
    }
    return render(request, "console/goal.html", context)
