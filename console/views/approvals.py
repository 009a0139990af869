"""The approvals inbox: every pending operation and every needs_review decision, decided by hash.

A decision posts back the operation's arguments_hash; approvals.services refuses a stale one
(StaleDecision) and changes nothing, and the page says so.
"""

import logging

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.http.response import HttpResponseBase
from django.shortcuts import redirect, render
from django.views.decorators.http import require_GET, require_POST

from approvals.models import Approval, ReviewDecision
from approvals.permissions import DECIDE_APPROVAL, INBOX_PERMS
from approvals.selectors import decidable_approvals, decidable_reviews
from console.actions import REGISTRY, decision_buttons
from console.http import AuthenticatedHttpRequest
from console.links import link_for_decision
from console.shared import (
    ARGUMENT_FIELD,
    OUTCOME_UNKNOWN,
    edited_arguments,
    login_required,
    positive_int,
    pretty_json,
    show,
    show_approval,
)
from console.views.tasks import render_task_page
from core.actors import Actor, Via
from core.exceptions import ActhelmError, InvalidInput, NotPermitted
from tasks.permissions import VIEW_TASK

log = logging.getLogger("acthelm.console")

INBOX_SIZE = 50  # a page a person can work through; the badge counts them all


def may_view_inbox(user: User) -> bool:
    return any(user.has_perm(perm) for perm in INBOX_PERMS)


# What a person can still decide (approvals.selectors); the hostile tests import these names.
pending_approvals = decidable_approvals
pending_reviews = decidable_reviews


def _render_card(
    request: AuthenticatedHttpRequest,
    pk: int,
    *,
    error: ActhelmError,
    posted: dict[str, str],
    status: int,
    as_text: bool = False,
) -> HttpResponse:
    """An approval's card again, with why an answer was refused and what the person typed."""
    approval = pending_approvals().filter(pk=pk).select_related("task").first()
    if approval is None:
        context = {"kind": "approval", "pk": pk, "error": error}
        return render(request, "console/_decided.html", context, status=status)
    show_approval(approval, edited=posted.get("arguments"), as_text=as_text)
    context = {
        "approval": approval,
        "from_task": None,
        "can_decide": True,
        "decision_buttons": decision_buttons(),
        "card_error": error,
    }
    return render(request, "console/_approval.html", context, status=status)


@require_GET
@login_required
def inbox(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Oldest first; the oldest INBOX_SIZE of each kind (the badge counts them all)."""
    if not may_view_inbox(request.user):
        raise PermissionDenied
    return _render_inbox(request)


def _render_inbox(
    request: AuthenticatedHttpRequest, *, error: ActhelmError | None = None, status: int = 200
) -> HttpResponse:
    approvals = list(pending_approvals()[: INBOX_SIZE + 1])
    reviews = list(pending_reviews()[: INBOX_SIZE + 1])
    for approval in approvals:
        show_approval(approval)
    for decision in reviews:
        show(decision, arguments_pretty=pretty_json(decision.tool_call.arguments))
    context = {
        "approvals": approvals[:INBOX_SIZE],
        "reviews": reviews[:INBOX_SIZE],
        "more": len(approvals) > INBOX_SIZE or len(reviews) > INBOX_SIZE,
        "can_decide": request.user.has_perm(DECIDE_APPROVAL),
        "decision_buttons": decision_buttons(),
        "outcome_unknown": OUTCOME_UNKNOWN,
        "error": error,
    }
    # The inbox refreshes itself: a poll asks for the decisions only.
    template = (
        "console/inbox.html#decisions" if request.htmx and not error else "console/inbox.html"
    )
    return render(request, template, context, status=status)


@require_POST
@login_required
def decide(request: AuthenticatedHttpRequest, pk: int, action: str) -> HttpResponseBase:
    """Every decision on one operation (console.actions): call its service with the
    posted hash; answer for the page the form was on."""
    entry = REGISTRY[action]
    kind = entry.target
    if not request.user.has_perm(entry.perm):
        raise PermissionDenied
    arguments_hash = request.POST.get("arguments_hash", "")
    # Decided from a task page: answer with that page (for people who may see it).
    task_id = positive_int(request.POST.get("task")) if request.user.has_perm(VIEW_TASK) else None
    # An approval's answers: edited arguments (JSON text) to approve, a message with a denial.
    inputs = {i.name: request.POST[i.name] for i in entry.inputs if i.name in request.POST}
    # Approve with edits: string arguments come as text fields, the rest as JSON.
    texts = {
        key.removeprefix(ARGUMENT_FIELD): request.POST[key]
        for key in request.POST
        if key.startswith(ARGUMENT_FIELD) and key != ARGUMENT_FIELD
    }
    if texts and any(i.name == "arguments" for i in entry.inputs):
        inputs["arguments"] = edited_arguments(inputs.get("arguments"), texts) or ""
    # Decided from a notification's link: the link is checked again and answers the decision.
    link = request.POST.get("decision_link", "")
    try:
        if link:
            link_for_decision(link, kind=kind, pk=pk, arguments_hash=arguments_hash)
        decided: Approval | ReviewDecision = entry.call(
            actor=Actor.person(request.user, via=Via.EMAIL_LINK if link else Via.CONSOLE),
            target_id=pk,
            arguments_hash=arguments_hash,
            **inputs,
        )
    except NotPermitted:
        raise PermissionDenied from None
    except ActhelmError as exc:
        log.info(
            "console.decision_refused",
            extra={"kind": kind, "id": pk, "code": exc.code, "task_id": task_id},
        )
        status = exc.http_status
        if task_id:
            return render_task_page(request, task_id, error=exc, status=status)
        if request.htmx:
            # A refused edit keeps the card (the edit and the proposal) with the reason.
            if isinstance(exc, InvalidInput) and kind == "approval":
                return _render_card(
                    request, pk, error=exc, posted=inputs, status=status, as_text=bool(texts)
                )
            context = {"kind": kind, "pk": pk, "error": exc}
            return render(request, "console/_decided.html", context, status=status)
        return _render_inbox(request, error=exc, status=status)
    verb = entry.success
    log.info(
        "console.decision",
        extra={"kind": kind, "id": pk, "verb": verb, "actor": request.user.get_username()},
    )
    text = f"{verb}: {decided} (task #{decided.task_id})."
    if isinstance(decided, Approval) and decided.edited_arguments_hash:
        text = (
            f"Approved with edited arguments: {decided.tool} (task #{decided.task_id}). "
            f"The operation that runs has the hash {decided.edited_arguments_hash}."
        )
    if task_id == decided.task_id:
        messages.success(request, text)
        if request.htmx:
            return render_task_page(request, task_id)
        return redirect("tasks:detail", pk=task_id)
    if request.htmx:
        context = {"kind": kind, "pk": pk, "text": text, "task_id": decided.task_id}
        if isinstance(decided, Approval):
            show(decided, edited_pretty=pretty_json(decided.edited_arguments))
            context["approval"] = decided
        return render(request, "console/_decided.html", context)
    messages.success(request, text)
    if link:  # back to the link's page, which now says who decided what
        kind_, _, token = link.partition("/")
        return redirect("decisions:link", kind=kind_, token=token)
    return redirect("approvals:inbox")
