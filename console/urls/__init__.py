"""Every page of the console, each group under its own namespace (tasks, agents, approvals, needs,
scorecard, notify, eval, schedules, decisions, ops). Included at / by the site's URLconf."""

from django.urls import include, path

urlpatterns = [
    path("", include("console.urls.ops")),
    path("approvals/", include("console.urls.approvals")),
    path("needs-me/", include("console.urls.needs")),
    path("scorecard/", include("console.urls.scorecard")),
    path("notifications/", include("console.urls.notify")),
    path("eval/", include("console.urls.eval")),
    path("schedules/", include("console.urls.schedules")),
    path("decide/", include("console.urls.decisions")),
    path("", include("console.urls.tasks")),
]
