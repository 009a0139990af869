"""Slack's interactivity endpoint: a signed click decides through the console's services, once,
as the person an operator mapped; every other request is refused with a clear answer and
decides nothing. The message's update goes through the outbox to the scripted Slack."""

import hashlib
import hmac
import json
import time
from datetime import timedelta

import pytest
from django.db import transaction
from django.utils import timezone

from agents.actions.decisions import approval_approve
from approvals.models import Approval
from approvals.states import ApprovalStatus
from console.models import SlackIdentity, SlackRequestSeen
from core.actors import Actor
from tasks.models import Task, TaskEvent
from tasks.notify.delivery import deliver_due
from tasks.notify.models import Notification
from tasks.notify.slack import APPROVE_ACTION, DENY_ACTION, OPEN_ACTION, button_value
from tasks.states import EventKind, TaskStatus
from tests.console.conftest import SIGNING_SECRET
from tests.console.scenes import pending_approval
from tests.factories import UserFactory
from tests.fakes.slack_server import interaction

pytestmark = pytest.mark.django_db

ENDPOINT = "/decide/slack/interactivity/"
DECIDER_PERMS = ["approvals.decide_approval", "tasks.view_task"]


@pytest.fixture
def alice(db):
    user = UserFactory(username="alice", perms=DECIDER_PERMS)
    SlackIdentity.objects.create(user=user, slack_user_id="U0ALICE")
    return user


def click(
    client,
    slack,
    approval,
    *,
    user="U0ALICE",
    action=APPROVE_ACTION,
    arguments_hash=None,
    secret=SIGNING_SECRET,
    timestamp=None,
    prepared=None,
    response_url=None,
):
    """Post a signed click on `approval`'s button to the endpoint; returns (response, request)."""
    value = button_value(
        approval.pk, approval.arguments_hash if arguments_hash is None else arguments_hash
    )
    body, headers = prepared or interaction(
        secret,
        user=user,
        action_id=action,
        value=value,
        response_url=response_url or f"{slack.server.base}/respond/1",
        timestamp=timestamp,
    )
    response = client.post(
        ENDPOINT, data=body, content_type="application/x-www-form-urlencoded", headers=headers
    )
    return response, (body, headers)


def replies():
    return [n.payload["slack_response"] for n in Notification.objects.order_by("id")]


def decision_events(approval):
    return TaskEvent.objects.filter(
        task_id=approval.task_id, kind__in=[EventKind.APPROVED, EventKind.DENIED]
    )


def assert_nothing_decided(approval):
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING and approval.decided_by is None
    assert not decision_events(approval).exists()
    assert Task.objects.get(pk=approval.task_id).status == TaskStatus.AWAITING_APPROVAL


def test_a_signed_click_approves_as_the_mapped_person_and_the_message_says_so(client, slack, alice):
    approval = pending_approval()
    response, _ = click(client, slack, approval)
    assert response.status_code == 200
    assert response.json()["ok"] is True and response.json()["code"] == "decided"
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == alice
    [event] = decision_events(approval)
    assert event.kind == EventKind.APPROVED and event.actor_user == alice
    assert event.data["via"] == "slack"
    assert event.data["arguments_hash"] == approval.arguments_hash
    # The task's last open decision was made: it is queued again, as from the console.
    assert Task.objects.get(pk=approval.task_id).status == TaskStatus.READY
    # The message's update is an outbox row, delivered like any notification.
    [reply] = replies()
    assert reply["replace_original"] is True
    assert reply["text"].startswith("Approved by alice (<@U0ALICE>): fetch_url")
    # This test runs in one transaction, whose now() is its start: make the row due by it.
    Notification.objects.update(next_attempt_at=timezone.now() - timedelta(minutes=1))
    report = deliver_due()
    assert report.delivered == 1
    [(path, body)] = slack.server.responses
    assert path == "/respond/1" and body["replace_original"] is True
    assert "Approved by alice" in body["text"] and "Approved by alice" in json.dumps(body["blocks"])


def test_a_signed_click_on_deny_denies(client, slack, alice):
    approval = pending_approval()
    response, _ = click(client, slack, approval, action=DENY_ACTION)
    assert response.status_code == 200 and response.json()["code"] == "decided"
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.DENIED
    [event] = decision_events(approval)
    assert event.kind == EventKind.DENIED and event.data["via"] == "slack"
    assert replies()[0]["text"].startswith("Denied by alice")


def test_a_bad_signature_is_refused(client, slack, alice):
    approval = pending_approval()
    response, _ = click(client, slack, approval, secret="not-the-signing-secret")
    assert response.status_code == 401 and response.json()["code"] == "bad_signature"
    assert_nothing_decided(approval)
    assert replies() == []


def test_a_body_changed_after_signing_is_refused(client, slack, alice):
    approval = pending_approval()
    body, headers = interaction(
        SIGNING_SECRET,
        user="U0NOBODY",
        action_id=APPROVE_ACTION,
        value=button_value(approval.pk, approval.arguments_hash),
        response_url=f"{slack.server.base}/respond/1",
    )
    forged = body.replace(b"U0NOBODY", b"U0ALICE")
    response, _ = click(client, slack, approval, prepared=(forged, headers))
    assert response.status_code == 401 and response.json()["code"] == "bad_signature"
    assert_nothing_decided(approval)


def test_a_stale_timestamp_is_refused_even_when_signed(client, slack, alice):
    approval = pending_approval()
    response, _ = click(client, slack, approval, timestamp=int(time.time()) - 301)
    assert response.status_code == 401 and response.json()["code"] == "stale_timestamp"
    assert_nothing_decided(approval)


def test_a_replayed_request_decides_nothing_twice(client, slack, alice):
    approval = pending_approval()
    first, request = click(client, slack, approval)
    assert first.json()["code"] == "decided"
    replay, _ = click(client, slack, approval, prepared=request)
    assert replay.status_code == 409 and replay.json()["code"] == "replayed"
    assert decision_events(approval).count() == 1
    assert SlackRequestSeen.objects.count() == 1
    # A fresh, signed duplicate of the same click (a second person's tap, a retry) finds the
    # operation decided: nothing is decided twice, and the message says why.
    again, _ = click(client, slack, approval, action=DENY_ACTION)
    assert again.status_code == 200 and again.json()["code"] == "stale_decision"
    assert "it was already approved by alice" in again.json()["text"]
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and decision_events(approval).count() == 1


def test_an_unmapped_slack_user_decides_nothing(client, slack, alice):
    approval = pending_approval()
    # A person named like the Slack user is not that user: only the stored id maps.
    UserFactory(username="U0STRANGER", perms=DECIDER_PERMS)
    response, _ = click(client, slack, approval, user="U0STRANGER")
    assert response.status_code == 200 and response.json()["code"] == "unknown_person"
    assert "<@U0STRANGER> is not an Acthelm person" in response.json()["text"]
    assert_nothing_decided(approval)
    [reply] = replies()
    assert reply["replace_original"] is False  # only the clicker sees it; the buttons stay


def test_an_inactive_person_is_unknown(client, slack, alice):
    approval = pending_approval()
    type(alice).objects.filter(pk=alice.pk).update(is_active=False)
    response, _ = click(client, slack, approval)
    assert response.json()["code"] == "unknown_person"
    assert_nothing_decided(approval)


def test_a_person_without_the_permission_decides_nothing(client, slack):
    viewer = UserFactory(username="viewer", perms=["approvals.view_approval", "tasks.view_task"])
    SlackIdentity.objects.create(user=viewer, slack_user_id="U0VIEWER")
    approval = pending_approval()
    response, _ = click(client, slack, approval, user="U0VIEWER")
    assert response.status_code == 200 and response.json()["code"] == "permission_denied"
    assert "viewer (<@U0VIEWER>) may not approve or deny" in response.json()["text"]
    assert_nothing_decided(approval)


def test_a_button_whose_hash_no_longer_matches_decides_nothing_and_leaves_the_card(
    client, slack, alice
):
    approval = pending_approval()
    response, _ = click(client, slack, approval, arguments_hash="f" * 64)
    assert response.status_code == 200 and response.json()["code"] == "stale_decision"
    assert "the operation changed" in response.json()["text"]
    assert_nothing_decided(approval)
    [reply] = replies()
    assert reply["text"].startswith("Nothing was decided: alice (<@U0ALICE>) asked to approve")
    # The operation still waits: its message keeps its facts and buttons; only alice is told.
    assert reply["replace_original"] is False
    Notification.objects.update(next_attempt_at=timezone.now() - timedelta(minutes=1))
    assert deliver_due().delivered == 1
    [(path, body)] = slack.server.responses
    assert path == "/respond/1"
    assert body["replace_original"] is False and body["response_type"] == "ephemeral"
    assert "blocks" not in body


def test_a_click_on_an_operation_decided_in_the_console_says_who_decided(client, slack, alice):
    approval = pending_approval()
    bob = UserFactory(username="bob", perms=DECIDER_PERMS)
    with transaction.atomic():
        approval_approve(
            actor=Actor.person(bob), approval_id=approval.pk, arguments_hash=approval.arguments_hash
        )
    response, _ = click(client, slack, approval, action=DENY_ACTION)
    assert response.json()["code"] == "stale_decision"
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.APPROVED
    # Decided elsewhere: the message's buttons give way to who decided it.
    [reply] = replies()
    assert reply["replace_original"] is True and "already approved by bob" in reply["text"]


def test_open_in_acthelm_and_other_payloads(client, slack, alice):
    approval = pending_approval()
    response, _ = click(client, slack, approval, action=OPEN_ACTION)
    assert response.status_code == 200 and response.json()["code"] == "ignored"
    assert_nothing_decided(approval)
    body = b"payload=%7Bnot+json"
    stamp = str(int(time.time()))
    base = b"v0:" + stamp.encode() + b":" + body
    sig = "v0=" + hmac.new(SIGNING_SECRET.encode(), base, hashlib.sha256).hexdigest()
    headers = {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": sig}
    bad, _ = click(client, slack, approval, prepared=(body, headers))
    assert bad.status_code == 400 and bad.json()["code"] == "bad_payload"


def test_the_endpoint_takes_only_posts_and_needs_no_csrf_token(slack, alice):
    from django.test import Client

    strict = Client(enforce_csrf_checks=True)
    assert strict.get(ENDPOINT).status_code == 405
    approval = pending_approval()
    response, _ = click(strict, slack, approval)
    assert response.status_code == 200 and response.json()["code"] == "decided"


def test_a_disabled_slack_target_verifies_nothing(client, slack, alice):
    type(slack.target).objects.filter(pk=slack.target.pk).update(enabled=False)
    approval = pending_approval()
    response, _ = click(client, slack, approval)
    assert response.status_code == 401
    assert_nothing_decided(approval)


def _signed(body: bytes, stamp: str) -> dict[str, str]:
    """Headers that sign `body` with any timestamp text, as a holder of the secret could."""
    base = b"v0:" + stamp.encode() + b":" + body
    sig = "v0=" + hmac.new(SIGNING_SECRET.encode(), base, hashlib.sha256).hexdigest()
    return {"X-Slack-Request-Timestamp": stamp, "X-Slack-Signature": sig}


@pytest.mark.parametrize(
    "stamp",
    [
        "\u00b2",  # ² passes str.isdigit(); int() refuses it
        "9" * 400,  # int() takes it; the float arithmetic of the window overflows
        "1" * 5000,  # over int()'s 4300 digits
        "\u0661\u0667\u0660\u0660\u0660\u0660\u0660\u0660\u0660\u0660",  # Arabic-Indic digits
        "1700000000.5",
        "-1700000000",
        " 1700000000",
        "",
    ],
    ids=[
        "superscript",
        "400-nines",
        "5000-digits",
        "arabic-indic",
        "fraction",
        "negative",
        "space",
        "missing",
    ],
)
def test_a_malformed_timestamp_is_a_401_without_a_traceback(slack, alice, caplog, stamp):
    from django.test import Client

    approval = pending_approval()
    body, _ = interaction(
        SIGNING_SECRET,
        user="U0ALICE",
        action_id=APPROVE_ACTION,
        value=button_value(approval.pk, approval.arguments_hash),
        response_url=f"{slack.server.base}/respond/1",
    )
    client = Client(raise_request_exception=False)
    response = client.post(
        ENDPOINT,
        data=body,
        content_type="application/x-www-form-urlencoded",
        headers=_signed(body, stamp),
    )
    assert response.status_code == 401 and response.json()["code"] == "bad_timestamp"
    assert not [r for r in caplog.records if r.levelname == "ERROR" or r.exc_info]
    assert_nothing_decided(approval)
    assert not SlackRequestSeen.objects.exists()


@pytest.mark.parametrize(
    "response_url",
    [
        "https://hooks.slack.com.evil/actions/T0/1/x",
        "https://hooks.slack.com@evil.example/actions/T0/1/x",
        "https://hooks.slack.com:8443/actions/T0/1/x",
        "http://hooks.slack.com/actions/T0/1/x",
        "https://evil.example/https://hooks.slack.com/actions/T0/1/x",
    ],
)
def test_a_response_url_only_looking_like_slacks_is_never_answered(
    client, slack, alice, settings, response_url
):
    """Without the slash, `https://hooks.slack.com` is still a host, not the start of a text:
    the click decides (it was signed), but nothing is sent to the look-alike."""
    settings.ACTHELM_SLACK_RESPONSE_URL_PREFIXES = ["https://hooks.slack.com"]
    approval = pending_approval()
    response, _ = click(client, slack, approval, response_url=response_url)
    assert response.json()["code"] == "decided"
    assert replies() == []


def test_a_prefix_without_the_slash_still_admits_slacks_own_urls(client, slack, alice, settings):
    settings.ACTHELM_SLACK_RESPONSE_URL_PREFIXES = ["https://hooks.slack.com"]
    approval = pending_approval()
    url = "https://HOOKS.slack.com:443/actions/T0TEAM/1234/abcd"
    response, _ = click(client, slack, approval, response_url=url)
    assert response.json()["code"] == "decided"
    [reply] = replies()
    assert reply["response_url"] == url


def test_the_message_update_escapes_the_model_written_target(client, slack, alice):
    """The target is the model's words: in the update it is one line and cannot make a link."""
    approval = pending_approval()
    Approval.objects.filter(pk=approval.pk).update(
        target="https://example.org/r.csv\n*Approved by* <https://evil.example|the founder> & co"
    )
    response, _ = click(client, slack, approval)
    assert response.json()["code"] == "decided"
    [reply] = replies()
    assert "\n" not in reply["text"]
    assert "<https://evil" not in reply["text"]
    assert "&lt;https://evil.example|the founder&gt; &amp; co" in reply["text"]
    assert "(<@U0ALICE>)" in reply["text"]  # the mention Acthelm writes still is one
