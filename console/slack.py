"""Decisions from Slack's buttons: the interactivity request, checked, mapped to a person and
decided through the console's own services.

`handle_interaction()` is everything the endpoint does, in order:

1. the timestamp is seconds since 1970 in ASCII digits (anything else is a 401, never an
   error of ours) at most `TOLERANCE_SECONDS` old, and the signature is Slack's `v0`
   (HMAC-SHA256 of ``v0:{timestamp}:{body}``) under the signing secret of an enabled Slack
   target (compared in constant time);
2. the signature was never seen before (`SlackRequestSeen`, written in the decision's
   transaction): a replayed or duplicated request decides nothing, whatever it carries;
3. the Slack user is a person by the id an operator stored (`SlackIdentity`), never by a name,
   and holds the permission the console asks for;
4. the decision is `approval_approve` / `approval_deny` with the hash of the button's value, in
   one transaction with the queued update of the message (an outbox row), so the answer to
   Slack does not wait for any call to Slack.

Every refusal says why and changes nothing. A refused click on an operation that still waits
(a stale hash) is answered to the clicker alone and leaves the card and its buttons; the card of
an operation decided elsewhere gives way to who decided it. What a model or a person wrote is
one escaped line in every answer (`tasks.notify.slack.line`). The answer is JSON for people
reading logs and tests; Slack itself only needs the 200.
"""

import hashlib
import hmac
import json
import logging
import re
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qs

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.urls import reverse
from django.utils import timezone

from agents.actions.decisions import approval_approve, approval_deny
from approvals.models import Approval
from approvals.permissions import DECIDE_APPROVAL
from approvals.states import ApprovalStatus
from console.models import SlackIdentity, SlackRequestSeen
from core.actors import Actor, Via
from core.credentials import CredentialRefused, credential_for
from core.exceptions import ActhelmError
from tasks.notify.models import NotificationTarget
from tasks.notify.outbox import console_url, enqueue_reply
from tasks.notify.slack import (
    APPROVE_ACTION,
    DENY_ACTION,
    RESPONSE_KEY,
    SlackChannel,
    line,
    response_url_allowed,
)

log = logging.getLogger("acthelm.slack")

TOLERANCE_SECONDS = 300  # Slack's documented window
MAX_BODY_BYTES = 256 * 1024
# Seconds since the epoch, as Slack sends them: ASCII digits only (`str.isdigit` also passes
# "²" and other digits int() refuses), at most 12 of them, so that int() and the float
# arithmetic of the window always succeed.
_TIMESTAMP = re.compile(r"[0-9]{1,12}")


@dataclass(frozen=True)
class Answer:
    """What the endpoint answers: an HTTP status, a stable code and a sentence."""

    status: int
    code: str
    text: str
    decided: bool = False

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.decided, "code": self.code, "text": self.text}


def expected_signature(secret: str, timestamp: str, body: bytes) -> str:
    base = b"v0:" + timestamp.encode() + b":" + body
    return "v0=" + hmac.new(secret.encode(), base, hashlib.sha256).hexdigest()


def _signing_target(timestamp: str, body: bytes, signature: str) -> NotificationTarget | None:
    """The enabled Slack target whose signing secret signed the request, if any."""
    targets = NotificationTarget.objects.filter(kind=SlackChannel.kind, enabled=True).exclude(
        secret_env=""
    )
    for target in targets:
        try:
            secret = credential_for(target.secret_env, SlackChannel.credential_destination(""))
        except CredentialRefused as exc:
            log.warning("slack.secret_refused", extra={"target": target.name, "code": exc.code})
            continue
        if secret and hmac.compare_digest(
            expected_signature(secret, timestamp, body).encode(), signature.encode()
        ):
            return target
    return None


def _first_seen(signature: str) -> bool:
    """Record the request's signature; False when it was already there (a replay)."""
    SlackRequestSeen.objects.filter(
        seen_at__lt=timezone.now() - timedelta(seconds=TOLERANCE_SECONDS * 2)
    ).delete()
    try:
        with transaction.atomic():
            SlackRequestSeen.objects.create(signature=signature)
    except IntegrityError:
        return False
    return True


@dataclass(frozen=True)
class Click:
    slack_user: str
    action: str
    response_url: str
    approval_id: int = 0
    arguments_hash: str = ""


def _parse(body: bytes) -> Click | None:
    """The one button a `block_actions` payload reports; None for anything else."""
    try:
        fields = parse_qs(body.decode(), max_num_fields=5)
        payload = json.loads(fields["payload"][0])
        user = payload["user"]["id"]
        action = payload["actions"][0]
        action_id = action["action_id"]
        response_url = payload.get("response_url", "")
    except (KeyError, IndexError, TypeError, ValueError, UnicodeDecodeError):
        return None
    if payload.get("type") != "block_actions" or not isinstance(user, str):
        return None
    if not isinstance(action_id, str) or not isinstance(response_url, str):
        return None
    if action_id not in (APPROVE_ACTION, DENY_ACTION):
        return Click(user, action_id, response_url)
    try:
        value = json.loads(action["value"])
        approval_id, arguments_hash = value["approval_id"], value["arguments_hash"]
    except (KeyError, TypeError, ValueError):
        return None
    if not isinstance(approval_id, int) or not isinstance(arguments_hash, str):
        return None
    return Click(user, action_id, response_url, approval_id, arguments_hash)


def _person(slack_user: str) -> User | None:
    identity = (
        SlackIdentity.objects.select_related("user")
        .filter(slack_user_id=slack_user, user__is_active=True)
        .first()
    )
    return identity.user if identity else None


def _reply(
    target: NotificationTarget,
    click: Click,
    text: str,
    *,
    task_id: int | None,
    replace: bool,
) -> None:
    """Queue the update of the clicked message (or a note only the clicker sees)."""
    if not response_url_allowed(click.response_url):
        log.warning("slack.response_url_refused", extra={"target": target.name})
        return
    enqueue_reply(
        target,
        task_id=task_id,
        subject=text,
        payload={
            RESPONSE_KEY: {
                "response_url": click.response_url,
                "text": text,
                "replace_original": replace,
            }
        },
    )


def _operation(approval_id: int) -> tuple[int | None, str]:
    """The approval's task and the operation in a person's words (a model's target: one line,
    Slack's control characters escaped)."""
    approval = Approval.objects.filter(pk=approval_id).first()
    if approval is None:
        return None, f"operation {approval_id}"
    return (
        approval.task_id,
        f"{line(approval.tool, 100)} {line(approval.target, 200)} (task #{approval.task_id})",
    )


def _why_not(approval: Approval | None, exc: ActhelmError) -> str:
    """A refusal in a person's words: who decided it already, or the service's reason."""
    if approval is not None and approval.status != ApprovalStatus.PENDING:
        by = f" by {line(approval.decided_by.get_username(), 150)}" if approval.decided_by else ""
        return f"it was already {approval.status}{by}"
    return line(exc.message, 600)


def handle_interaction(*, body: bytes, timestamp: str, signature: str) -> Answer:
    if len(body) > MAX_BODY_BYTES:
        return Answer(413, "too_large", "the request is too large")
    if not _TIMESTAMP.fullmatch(timestamp):
        return Answer(
            401, "bad_timestamp", "X-Slack-Request-Timestamp is missing or not seconds since 1970"
        )
    if abs(time.time() - int(timestamp)) > TOLERANCE_SECONDS:
        return Answer(401, "stale_timestamp", f"the request is more than {TOLERANCE_SECONDS} s old")
    target = _signing_target(timestamp, body, signature)
    if target is None:
        return Answer(401, "bad_signature", "the request's signature is not valid")
    # The signature is recorded in the decision's transaction: a request that fails on our
    # side leaves no trace and may come again; two copies at once meet at the unique index.
    with transaction.atomic():
        if not _first_seen(signature):
            log.warning("slack.replay", extra={"target": target.name})
            return Answer(409, "replayed", "this request was already received: nothing was decided")
        click = _parse(body)
        if click is None:
            return Answer(400, "bad_payload", "not a button of an Acthelm message")
        if click.action not in (APPROVE_ACTION, DENY_ACTION):
            return Answer(200, "ignored", "nothing to decide")
        return _decide(target, click)


def _decide(target: NotificationTarget, click: Click) -> Answer:
    task_id, what = _operation(click.approval_id)
    verb = "approve" if click.action == APPROVE_ACTION else "deny"
    inbox = console_url(reverse("approvals:inbox"))
    who = f"<@{line(click.slack_user, 40)}>"
    with transaction.atomic():
        person = _person(click.slack_user)
        if person is None:
            text = (
                f"Nothing was decided: {who} is not an Acthelm person. An operator sets the "
                f"Slack user id on the person's page in the admin."
            )
            _reply(target, click, text, task_id=task_id, replace=False)
            return Answer(200, "unknown_person", text)
        name = person.get_username()
        shown = line(name, 150)
        if not person.has_perm(DECIDE_APPROVAL):
            text = f"Nothing was decided: {shown} ({who}) may not approve or deny operations."
            _reply(target, click, text, task_id=task_id, replace=False)
            return Answer(200, "permission_denied", text)
        service = approval_approve if click.action == APPROVE_ACTION else approval_deny
        try:
            service(
                actor=Actor.person(person, via=Via.SLACK),
                approval_id=click.approval_id,
                arguments_hash=click.arguments_hash,
            )
        except ActhelmError as exc:
            approval = (
                Approval.objects.select_related("decided_by").filter(pk=click.approval_id).first()
            )
            text = (
                f"Nothing was decided: {shown} ({who}) asked to {verb} {what}, but "
                f"{_why_not(approval, exc)}. The inbox shows it as it is now: {inbox}"
            )
            # A decided operation's message says so in place of its buttons; one that still
            # waits (a stale hash, a refused state) keeps its card: only the clicker is told.
            still_open = approval is not None and approval.status == ApprovalStatus.PENDING
            _reply(target, click, text, task_id=task_id, replace=not still_open)
            log.info("slack.refused", extra={"code": exc.code, "approval_id": click.approval_id})
            return Answer(200, exc.code, text)
        done = "Approved" if click.action == APPROVE_ACTION else "Denied"
        text = f"{done} by {shown} ({who}): {what}."
        _reply(target, click, text, task_id=task_id, replace=True)
    log.info(
        "slack.decision",
        extra={"approval_id": click.approval_id, "verb": verb, "actor": name},
    )
    return Answer(200, "decided", text, decided=True)
