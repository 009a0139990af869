from django.urls import path

from console.actions import decision_actions
from console.views import approvals as views

app_name = "approvals"

# approve/deny: /approvals/<id>/approve/; run again/skip: /approvals/review/<id>/run-again/.
_PREFIX = {"approval": "", "review": "review/"}

urlpatterns = [
    path("", views.inbox, name="inbox"),
    *(
        path(
            f"{_PREFIX[target]}<int:pk>/{action.slug}/",
            views.decide,
            {"action": action.name},
            name=action.name,
        )
        for target in _PREFIX
        for action in decision_actions(target)
    ),
]
