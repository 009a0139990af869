"""Writing the outbox: one row per target that wants the event, in the event's transaction.

`enqueue_for_event()` is called where the timeline event is written (`tasks.transitions.
record_event`). Because the row is written by the same transaction, a notification exists exactly
when its event committed: nothing is lost when a worker dies after the commit, and nothing is sent
for a transition that rolled back. The message is composed now, from the rows the transaction
sees, so a retry sends the same words and the same body.
"""

import functools
import json
import logging
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast

from django.conf import settings
from django.urls import reverse
from django.utils import timezone

from core import fastsql
from tasks.notify.channels import find_channel
from tasks.notify.links import LinkKind, decision_link
from tasks.notify.models import Notification, NotificationTarget
from tasks.notify.states import NotifyEvent
from tasks.states import EventKind, TaskStatus

if TYPE_CHECKING:
    from tasks.models import Task, TaskEvent

log = logging.getLogger("acthelm.notify")

# A task entering one of these states waits for a person.
STATE_EVENTS: dict[str, NotifyEvent] = {
    TaskStatus.AWAITING_APPROVAL: NotifyEvent.AWAITING_APPROVAL,
    TaskStatus.NEEDS_REVIEW: NotifyEvent.NEEDS_REVIEW,
    TaskStatus.REVIEW: NotifyEvent.REVIEW,
    TaskStatus.FAILED: NotifyEvent.FAILED,
}
# The cooldown event is also written for a task that met an already cooling connection; only the
# event that started the cooldown is news.
_ALREADY_COOLING = "provider_cooling_down"

SUMMARY_CHARS = 300
_SECRETISH = re.compile(r"(key|token|secret|passw|pwd|auth|credential|cookie|session)", re.I)
_SECRET_IN_TEXT = re.compile(
    r"((?:api[_-]?key|token|secret|password|passwd|pwd|auth|sig|signature|credential)"
    r"[\w-]*\s*[=:]\s*)([^\s&,;\"']+)",
    re.I,
)
_URL_USERINFO = re.compile(r"(://)[^/@\s]+@")
_BEARER = re.compile(r"\b(bearer|basic|token)\s+[\w.~+/=-]+", re.I)


# What is open on a task for a person to decide, by notification: each a function of the task
# returning dicts (id, tool, arguments as a summary, the inbox anchor; an approval also its
# target). The app that owns those decisions registers them (`approvals.apps`), so the ledger,
# below it, composes the message without importing it.
class OpenDecision(TypedDict):
    """One decision open on a task, as the app that owns it describes it."""

    id: int
    tool: str
    arguments: str  # argument_summary: short, secrets blanked
    anchor: str  # where the inbox shows it
    arguments_hash: str  # what a decision is bound to
    target: NotRequired[str]  # an approval's
    effect: NotRequired[str]  # an approval's


class LinkedDecision(TypedDict):
    """An OpenDecision in a notification's payload: the inbox's link in place of the anchor, and
    the signed link that opens this one decision (`tasks.notify.links`)."""

    id: int
    tool: str
    arguments: str
    arguments_hash: str
    url: str
    link: str
    target: NotRequired[str]
    effect: NotRequired[str]


type DescribeOpen = Callable[["Task"], list[OpenDecision]]

_open_decisions: dict[str, DescribeOpen] = {}


def describe_open_decisions(which: str, describe: DescribeOpen) -> None:
    _open_decisions[which] = describe


def _with_links(items: list[OpenDecision], inbox: str, kind: LinkKind) -> list[LinkedDecision]:
    return [
        # Every key but the anchor, and the links: mypy does not follow a dict comprehension.
        cast(
            LinkedDecision,
            {k: v for k, v in item.items() if k != "anchor"}
            | {
                "url": f"{inbox}#{item['anchor']}",
                "link": decision_link(kind, item["id"], item["arguments_hash"]),
            },
        )
        for item in items
    ]


class PayloadTask(TypedDict):
    id: int
    title: str
    status: str
    url: str
    created_by: str | None  # the username


class PayloadFailure(TypedDict):
    code: str
    message: str


class PayloadConnection(TypedDict):
    """The cooldown event's data, as it was recorded."""

    name: Any
    code: Any
    until: Any


class Payload(TypedDict):
    """A notification's JSON (`Notification.payload`; a webhook's body adds its id and key)."""

    event: str
    occurred_at: str
    task: PayloadTask
    approvals: NotRequired[list[LinkedDecision]]  # awaiting_approval
    link: NotRequired[str]  # review: the signed link to the task's close-or-reopen decision
    operations: NotRequired[list[LinkedDecision]]  # needs_review
    failure: NotRequired[PayloadFailure]  # failed
    connection: NotRequired[PayloadConnection]  # cooldown
    # Always there: written last, once the event's kind has said what they are.
    url: NotRequired[str]
    subject: NotRequired[str]
    text: NotRequired[str]


class Composed(TypedDict):
    """A notification's words, its link and its payload (the outbox row's columns)."""

    subject: str
    text: str
    url: str
    payload: Payload


def notify_event_of(event: "TaskEvent") -> str | None:
    """Which notification an event is, if any (no query)."""
    return notification_of(event.kind, event.data, event.from_status, event.to_status)


def notification_of(
    kind: str, data: dict[str, Any], from_status: str = "", to_status: str = ""
) -> str | None:
    """Which notification an event of this kind, data and move would be, if any (what
    `notify_event_of` decides, for an event not built yet)."""
    if to_status and to_status != from_status:
        return STATE_EVENTS.get(to_status)
    if kind == EventKind.PROVIDER_COOLDOWN and data.get("code") != _ALREADY_COOLING:
        return NotifyEvent.COOLDOWN
    return None


@functools.cache
def _targets(which: str) -> fastsql.Select[NotificationTarget]:
    """The enabled targets that want `which`: compiled once per event kind (a worker asks at
    the end of every run that reaches review)."""
    return fastsql.Select(
        lambda: NotificationTarget.objects.filter(enabled=True, events__contains=[which])
    )


def enqueue_for_event(event: "TaskEvent") -> list[Notification]:
    """Write the outbox rows for `event` (inside its transaction); nothing for other events, and
    nothing for an evaluation task's."""
    which = notify_event_of(event)
    if which is None:
        return []
    # The evaluation runner decides and grades its own tasks: nothing for a person (issue 21).
    if event.task.is_evaluation:
        return []
    targets = _targets(which).rows()
    if not targets:
        return []
    message = compose(event, which)
    now = timezone.now()
    rows = Notification.objects.bulk_create(
        [
            Notification(
                target=target,
                target_name=target.name,
                channel=target.kind,
                task_id=event.task_id,
                event=event,
                event_kind=which,
                part=part,
                subject=message["subject"],
                text=message["text"],
                url=message["url"],
                payload=payload,
                next_attempt_at=now,
            )
            for target in targets
            for part, payload in enumerate(_parts(target, message["payload"]))
        ]
    )
    log.info(
        "notify.enqueued",
        extra={"task_id": event.task_id, "event": str(which), "targets": len(rows)},
    )
    return rows


def enqueue_reply(
    target: NotificationTarget,
    *,
    task_id: int | None,
    subject: str,
    payload: dict[str, Any],
) -> Notification:
    """One outbox row that answers a target (Slack: the update of a message a person decided
    from), in the caller's transaction: delivered with the outbox's deadline and retries, so the
    request that asked for it is answered at once."""
    return Notification.objects.create(
        target=target,
        target_name=target.name,
        channel=target.kind,
        task_id=task_id,
        event=None,
        event_kind=NotifyEvent.AWAITING_APPROVAL,
        subject=clip(subject, 300),
        text=subject,
        url=console_url(reverse("approvals:inbox")),
        payload=payload,
        next_attempt_at=timezone.now(),
    )


def _parts(target: NotificationTarget, payload: Payload) -> list[Payload]:
    """The payloads of one event for one target: one, or, for a channel that posts a message per
    decision (Slack: each with its own buttons), one per open approval."""
    channel = find_channel(target.kind)
    approvals = payload.get("approvals") or []
    if channel is None or not channel.message_per_decision or len(approvals) < 2:
        return [payload]
    return [payload | {"approvals": [approval], "url": approval["link"]} for approval in approvals]


# --- Composing the message -----------------------------------------------------------------------


def console_url(path: str) -> str:
    return settings.ACTHELM_BASE_URL.rstrip("/") + path


def redact(text: str) -> str:
    """Blank what looks like a credential in a line meant for a chat or a mailbox."""
    text = _URL_USERINFO.sub(r"\1***@", text)
    text = _BEARER.sub(r"\1 ***", text)
    return _SECRET_IN_TEXT.sub(r"\1***", text)


def clip(text: str, limit: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def argument_summary(arguments: object) -> str:
    """`name="report.md", content="# Hello…"`: short, one line, secrets blanked."""
    if not isinstance(arguments, dict):
        return clip(redact(json.dumps(arguments, default=str)), SUMMARY_CHARS)
    parts: list[str] = []
    for key, value in arguments.items():
        if _SECRETISH.search(str(key)):
            shown = "***"
        else:
            shown = clip(redact(json.dumps(value, ensure_ascii=False, default=str)), 60)
        parts.append(f"{key}={shown}")
    return clip(", ".join(parts), SUMMARY_CHARS)


def _upper_first(text: str) -> str:
    return text[:1].upper() + text[1:]


def _whose(task: "Task") -> str:
    user = task.created_by
    return f" (created by {user.get_username()})" if user else ""


def compose(event: "TaskEvent", which: str) -> Composed:
    """Subject, one readable line (`text`), the console link and the JSON payload."""
    task = event.task
    task_url = console_url(reverse("tasks:detail", args=[task.pk]))
    inbox = console_url(reverse("approvals:inbox"))
    name = f"task #{task.pk} “{clip(task.title, 80)}”"
    payload: Payload = {
        "event": str(which),
        "occurred_at": event.created_at.isoformat(),
        "task": {
            "id": task.pk,
            "title": task.title,
            "status": task.status,
            "url": task_url,
            "created_by": task.created_by.get_username() if task.created_by else None,
        },
    }
    url = task_url
    if which == NotifyEvent.AWAITING_APPROVAL:
        payload["approvals"] = _with_links(_open_decisions[which](task), inbox, LinkKind.APPROVAL)
        pending = payload["approvals"]
        if pending:
            url = pending[0]["link"]
        ops = "; ".join(
            f"{a['tool']} {a['target']} ({a['arguments']})"
            + (f" {a['link']}" if len(pending) > 1 else "")
            for a in pending
        )
        subject = f"Approval needed: {name}"
        text = (
            f"{_upper_first(name)} waits for a person who may decide operations{_whose(task)}: "
            f"{ops or 'an operation'}. Approve or deny: {url}"
        )
    elif which == NotifyEvent.NEEDS_REVIEW:
        payload["operations"] = _with_links(_open_decisions[which](task), inbox, LinkKind.REVIEW)
        pending = payload["operations"]
        if pending:
            url = pending[0]["link"]
        ops = "; ".join(
            f"{o['tool']} ({o['arguments']})" + (f" {o['link']}" if len(pending) > 1 else "")
            for o in pending
        )
        subject = f"Decision needed: {name} has an operation with an unknown outcome"
        text = (
            f"{_upper_first(name)} waits for a person who may decide operations{_whose(task)}: "
            f"the outcome of {ops or 'an operation'} is unknown. Run it again or skip it: {url}"
        )
    elif which == NotifyEvent.REVIEW:
        # Bound to the event that put the task in review: reopened and reviewed again, the task
        # has a new one and an old link opens nothing.
        url = payload["link"] = decision_link(LinkKind.TASK, task.pk, str(event.pk))
        subject = f"Ready for review: {name}"
        text = (
            f"{_upper_first(name)} finished and the supervisor approved it; it waits for a person "
            f"who may close tasks{_whose(task)}. Close it or reopen with feedback: {url}"
        )
    elif which == NotifyEvent.FAILED:
        code = task.failure_code or event.data.get("code", "")
        message = clip(redact(task.failure_message or event.data.get("message", "")), 200)
        payload["failure"] = {"code": code, "message": message}
        subject = f"Failed ({code}): {name}"
        text = (
            f"{_upper_first(name)} failed with {code}: {message} It waits for a person who may "
            f"operate tasks{_whose(task)}: retry from the last checkpoint or delete it: {url}"
        )
    else:  # cooldown
        data = event.data
        payload["connection"] = {
            "name": data.get("connection"),
            "code": data.get("code"),
            "until": data.get("until"),
        }
        url = console_url(reverse("agents:connections"))
        subject = f"Connection {data.get('connection')} is cooling down ({data.get('code')})"
        text = (
            f"Connection {data.get('connection')} is cooling down until {data.get('until')} "
            f"after {data.get('code')} on {name}; its tasks move to another zero-cost connection "
            f"or wait. A person who manages connections can check it: {url}"
        )
    payload["url"] = url
    payload["subject"] = subject
    payload["text"] = text
    return {"subject": clip(subject, 300), "text": text, "url": url, "payload": payload}
