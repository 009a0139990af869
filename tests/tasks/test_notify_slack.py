"""The Slack channel: a message per awaiting approval, posted to the scripted Slack with the bot
token, carrying the card's facts and buttons bound to the approval and its hash; Slack's
refusals are stable codes; a target names both credentials; a response_url that is not
Slack's is refused."""

import json

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction

from core.actors import Actor
from tasks.notify.channels import DeliveryFailed, Message, send
from tasks.notify.delivery import deliver_due
from tasks.notify.models import Notification, NotificationTarget
from tasks.notify.slack import APPROVE_ACTION, DENY_ACTION, OPEN_ACTION, RESPONSE_KEY
from tasks.states import EventKind, TaskStatus
from tasks.transitions import lock_task, set_status
from tests.console.conftest import BOT_TOKEN, slack  # noqa: F401 - the fixture
from tests.console.scenes import pending_approval
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def task_waiting_for_two_approvals():
    task = TaskFactory(status=TaskStatus.IN_PROGRESS, title="Collect the Q3 reports")
    first = pending_approval(url="https://example.org/q3.txt", task=task)
    second = pending_approval(url="https://example.org/payroll.txt", task=task)
    with transaction.atomic():
        set_status(
            lock_task(task.pk),
            TaskStatus.AWAITING_APPROVAL,
            actor=Actor.worker("w"),
            kind=EventKind.APPROVAL_REQUESTED,
        )
    return task, first, second


def test_each_awaiting_approval_is_one_message_with_its_facts_and_buttons(slack):  # noqa: F811
    task, first, second = task_waiting_for_two_approvals()
    rows = list(Notification.objects.filter(task=task).order_by("part"))
    assert [r.part for r in rows] == [0, 1]
    report = deliver_due()
    assert report.delivered == 2
    posted = slack.server.posted
    assert len(posted) == 2
    assert {p.headers["authorization"] for p in posted} == {f"Bearer {BOT_TOKEN}"}
    by_target = {}
    for message in posted:
        assert message.body["channel"] == "C0APPROVALS"
        text = json.dumps(message.blocks)
        by_target["q3" if "q3.txt" in text else "payroll"] = message
    for approval, message in ((first, by_target["q3"]), (second, by_target["payroll"])):
        section = message.blocks[0]["text"]["text"]
        assert f"task #{task.pk} “Collect the Q3 reports”" in section
        assert "*Tool:* `fetch_url`" in section
        assert f"*Target:* `{approval.target}`" in section
        assert f"Sends an HTTP GET request to {approval.target}" in section
        assert f'url="{approval.target}"' in section  # the validated arguments, bounded
        buttons = message.buttons()
        assert set(buttons) == {APPROVE_ACTION, DENY_ACTION, OPEN_ACTION}
        for action in (APPROVE_ACTION, DENY_ACTION):
            assert json.loads(buttons[action]["value"]) == {
                "approval_id": approval.pk,
                "arguments_hash": approval.arguments_hash,
            }
        link = buttons[OPEN_ACTION]["url"]
        assert link.startswith("https://acthelm.example.org/decide/approval/")
        assert message.body["text"].startswith("Approval needed")


def test_a_wrong_token_is_a_stable_code_and_retried(slack, monkeypatch):  # noqa: F811
    monkeypatch.setenv("ACTHELM_KEY_SLACK_BOT", "xoxb-wrong")
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    pending_approval(task=task)
    with transaction.atomic():
        set_status(
            lock_task(task.pk),
            TaskStatus.AWAITING_APPROVAL,
            actor=Actor.worker("w"),
            kind=EventKind.APPROVAL_REQUESTED,
        )
    report = deliver_due()
    assert report.retrying == 1 and report.results[0]["code"] == "slack_invalid_auth"
    assert slack.server.posted == []


def test_a_slack_target_names_both_credentials_bound_to_slacks_api(slack, settings):  # noqa: F811
    target = NotificationTarget(name="x", kind="slack", address="C0X", events=["failed"])
    with pytest.raises(ValidationError) as refused:
        target.full_clean()
    assert set(refused.value.message_dict) == {"token_env", "secret_env"}
    target.address = "not a channel!"
    target.token_env, target.secret_env = "ACTHELM_KEY_SLACK_BOT", "ACTHELM_KEY_SLACK_SIGNING"
    with pytest.raises(ValidationError) as refused:
        target.full_clean()
    assert set(refused.value.message_dict) == {"address"}
    # A credential not allowed to Slack's API host is refused when the target is saved.
    settings.ACTHELM_SLACK_API_URL = "https://slack.com/api"
    target.address, target.token_env = "C0X", "ACTHELM_KEY_HOOK"
    with pytest.raises(ValidationError) as refused:
        target.full_clean()
    assert "token_env" in refused.value.message_dict


def test_a_response_url_that_is_not_slacks_is_refused(slack):  # noqa: F811
    message = Message(
        idempotency_key="k",
        event_kind="awaiting_approval",
        subject="s",
        text="t",
        url="u",
        payload={
            RESPONSE_KEY: {
                "response_url": "http://127.0.0.1:9/elsewhere",
                "text": "Approved",
                "replace_original": True,
            }
        },
    )
    with pytest.raises(DeliveryFailed) as refused:
        send(slack.target, message)
    assert refused.value.code == "invalid_target"
    assert slack.server.responses == []
