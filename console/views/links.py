"""The page a notification's decision link opens: behind login (the login page returns here),
the inbox's card and buttons for that one decision, or why there is nothing to decide."""

from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET

from approvals.permissions import DECIDE_APPROVAL
from console.actions import decision_buttons
from console.http import AuthenticatedHttpRequest
from console.links import link_state
from console.shared import OUTCOME_UNKNOWN, login_required, pretty_json, show, show_approval
from console.views.approvals import may_view_inbox
from tasks.notify.links import LinkKind, LinkRefused, read_link
from tasks.permissions import VIEW_TASK


@require_GET
@login_required
def decision_link(request: AuthenticatedHttpRequest, kind: str, token: str) -> HttpResponseBase:
    try:
        target = read_link(kind, token)
    except LinkRefused as exc:
        refused: dict[str, object] = {"refused": exc}
        return render(request, "console/decision_link.html", refused, status=exc.http_status)
    if target.kind == LinkKind.TASK:
        if not request.user.has_perm(VIEW_TASK):
            raise PermissionDenied
    elif not may_view_inbox(request.user):
        raise PermissionDenied
    state = link_state(target)
    if state.open and state.task is not None:  # a task in review: its page has the buttons
        messages.info(request, "Opened from a notification: close the task or reopen it.")
        return redirect("tasks:detail", pk=state.task.pk)
    if state.approval is not None:
        show_approval(state.approval)
    if state.decision is not None:
        show(state.decision, arguments_pretty=pretty_json(state.decision.tool_call.arguments))
    context = {
        "state": state,
        "approval": state.approval,
        "decision": state.decision,
        "can_decide": request.user.has_perm(DECIDE_APPROVAL),
        "decision_buttons": decision_buttons(),
        "outcome_unknown": OUTCOME_UNKNOWN,
        "decision_link": f"{kind}/{token}",
    }
    return render(request, "console/decision_link.html", context, status=200 if state.open else 409)
