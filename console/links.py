"""What a notification's decision link opens now (`tasks.notify.links` signs and reads it).

A link still open shows the decision's card; one whose operation was decided, changed (another
hash) or no longer waits says so, and decides nothing. A decision posted from the page carries
the link, which `link_for_decision` checks again: a decision through a link is recorded with
`via: email_link`.
"""

from collections.abc import Iterable
from dataclasses import dataclass

from django.contrib.auth.models import User

from approvals.models import Approval, ReviewDecision
from approvals.permissions import DECIDE_APPROVAL
from approvals.selectors import decidable_approvals, decidable_reviews
from approvals.states import ApprovalStatus, ReviewChoice
from core.exceptions import StaleDecision
from tasks.models import Task, TaskEvent
from tasks.notify.links import (
    LinkExpired,
    LinkKind,
    LinkRefused,
    LinkTarget,
    link_parts,
    read_link,
)
from tasks.notify.models import Notification
from tasks.permissions import CLOSE_TASK
from tasks.states import TaskStatus

# Who may be shown a decision link: a person who may take the decision it opens. A link only
# finds a decision (opening it needs a signed-in person, the buttons check the permission), but
# it is not shown where it could be passed on by someone who could not use it.
LINK_PERMISSION = {
    LinkKind.APPROVAL: DECIDE_APPROVAL,
    LinkKind.REVIEW: DECIDE_APPROVAL,
    LinkKind.TASK: CLOSE_TASK,
}


@dataclass(frozen=True)
class LinkState:
    """The decision a link points at as it is now: `open` (decide it here), or why not."""

    target: LinkTarget
    open: bool
    reason: str = ""  # "decided" | "changed" | "gone" | "not_waiting"
    text: str = ""
    approval: Approval | None = None
    decision: ReviewDecision | None = None
    task: Task | None = None


def _decided_text(what: str, choice: str, by: object, at: object) -> str:
    who = f" by {by}" if by else ""
    return f"This {what} was already decided: {choice}{who} ({at:%Y-%m-%d %H:%M} UTC)."


def link_state(target: LinkTarget) -> LinkState:
    if target.kind == LinkKind.APPROVAL:
        return _approval_state(target)
    if target.kind == LinkKind.REVIEW:
        return _review_state(target)
    return _task_state(target)


def _approval_state(target: LinkTarget) -> LinkState:
    approval = Approval.objects.select_related("task", "decided_by").filter(pk=target.id).first()
    if approval is None:
        return LinkState(target, False, "gone", "This operation no longer exists.")
    if approval.status != ApprovalStatus.PENDING:
        text = _decided_text(
            "operation", approval.get_status_display(), approval.decided_by, approval.decided_at
        )
        return LinkState(target, False, "decided", text, approval=approval)
    if approval.arguments_hash != target.bound_to:
        text = "This operation changed since the message was sent (its hash differs)."
        return LinkState(target, False, "changed", text, approval=approval)
    if not decidable_approvals().filter(pk=approval.pk).exists():
        text = f"Task #{approval.task_id} no longer waits for this operation."
        return LinkState(target, False, "not_waiting", text, approval=approval)
    return LinkState(target, True, approval=approval)


def _review_state(target: LinkTarget) -> LinkState:
    decision = (
        ReviewDecision.objects.select_related("task", "tool_call", "decided_by")
        .defer("tool_call__result", "tool_call__result_for_model")
        .filter(pk=target.id)
        .first()
    )
    if decision is None:
        return LinkState(target, False, "gone", "This operation no longer exists.")
    if decision.choice != ReviewChoice.PENDING:
        text = _decided_text(
            "operation", decision.get_choice_display(), decision.decided_by, decision.decided_at
        )
        return LinkState(target, False, "decided", text, decision=decision)
    if decision.tool_call.arguments_hash != target.bound_to:
        text = "This operation changed since the message was sent (its hash differs)."
        return LinkState(target, False, "changed", text, decision=decision)
    if not decidable_reviews().filter(pk=decision.pk).exists():
        text = f"Task #{decision.task_id} no longer waits for this decision."
        return LinkState(target, False, "not_waiting", text, decision=decision)
    return LinkState(target, True, decision=decision)


def _task_state(target: LinkTarget) -> LinkState:
    task = Task.objects.filter(pk=target.id, is_evaluation=False).first()
    if task is None:
        return LinkState(target, False, "gone", "This task no longer exists.")
    if task.status != TaskStatus.REVIEW:
        text = f"Task #{task.pk} is no longer in review: it is {task.get_status_display()}."
        return LinkState(target, False, "decided", text, task=task)
    entered = (
        TaskEvent.objects.filter(task=task, to_status=TaskStatus.REVIEW)
        .order_by("-id")
        .values_list("id", flat=True)
        .first()
    )
    if str(entered) != target.bound_to:
        text = f"Task #{task.pk} was reopened and reviewed again since this message was sent."
        return LinkState(target, False, "changed", text, task=task)
    return LinkState(target, True, task=task)


def link_for_decision(value: str, *, kind: str, pk: int, arguments_hash: str) -> LinkTarget:
    """The link a decision was posted with (``kind/token``), checked: signed, unexpired, for
    this very operation and hash. Raises LinkRefused (or StaleDecision for another hash)."""
    link_kind, _, token = value.partition("/")
    target = read_link(link_kind, token)
    if target.kind != kind or target.id != pk:
        raise LinkRefused("this link is for another decision")
    if target.bound_to != arguments_hash:
        raise StaleDecision("the operation changed since the link was sent: its hash differs")
    return target


@dataclass(frozen=True)
class ShownLink:
    """A link of a notification as the Notifications page shows it to one person."""

    url: str
    kind: LinkKind | None  # None: not a decision link (a task page, the connections page)
    state: str = ""  # "" | "expired" | "invalid" (signed with another key)


@dataclass(frozen=True)
class NotificationLinks:
    shown: list[ShownLink]
    hidden: int  # decision links this person may not see (cannot take the decision)


def _urls_of(note: Notification) -> list[str]:
    """Every link a notification carried, in order, once each: its own (`url`), each open
    decision's, a task in review's."""
    payload = note.payload if isinstance(note.payload, dict) else {}
    urls = [note.url]
    for key in ("approvals", "operations"):
        items = payload.get(key)
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and isinstance(item.get("link"), str):
                urls.append(item["link"])
    if isinstance(payload.get("link"), str):
        urls.append(payload["link"])
    return list(dict.fromkeys(u for u in urls if u))


def _link_state(kind: LinkKind, token: str) -> str:
    try:
        read_link(kind, token)
    except LinkExpired:
        return "expired"
    except LinkRefused:
        return "invalid"
    return ""


def notification_links(notes: Iterable[Notification], user: User) -> dict[int, NotificationLinks]:
    """The links of each notification that `user` may be shown (by notification id): a
    decision link only to a person who may take that decision, marked when it has expired."""
    out = {}
    for note in notes:
        shown, hidden = [], 0
        for url in _urls_of(note):
            parts = link_parts(url)
            if parts is None:
                shown.append(ShownLink(url, None))
            elif user.has_perm(LINK_PERMISSION[parts[0]]):
                shown.append(ShownLink(url, parts[0], _link_state(*parts)))
            else:
                hidden += 1
        out[note.pk] = NotificationLinks(shown, hidden)
    return out
