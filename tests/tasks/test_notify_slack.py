"""The Slack channel: a message per awaiting approval, posted to the scripted Slack with the bot
token, carrying the card's facts and buttons bound to the approval and its hash; Slack's
refusals are stable codes; a target names both credentials; a response_url that is not
Slack's (by scheme, host, port and path) is refused; what a person or a model wrote is one
escaped line."""

import json

import pytest
from django.core.exceptions import ValidationError
from django.db import transaction

from approvals.models import Approval
from core.actors import Actor
from tasks.notify.channels import DeliveryFailed, Message, send
from tasks.notify.delivery import deliver_due
from tasks.notify.models import Notification, NotificationTarget
from tasks.notify.slack import (
    APPROVE_ACTION,
    DENY_ACTION,
    OPEN_ACTION,
    RESPONSE_KEY,
    line,
    message_body,
    response_url_allowed,
)
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


HOSTILE_TITLE = (
    "Q3 report”\n*Tool:* `read_file`\n*Target:* `notes.txt`\n*Effect:* reads a file\n"
    "<https://evil.example|Approve here> & <!channel>"
)


def test_a_title_or_target_draws_no_line_of_its_own_on_the_card(slack):  # noqa: F811
    """What a person or a planning model wrote is one line on the card, with Slack's control
    characters escaped: no fake Tool/Target/Effect lines, no link, no @channel."""
    task = TaskFactory(status=TaskStatus.IN_PROGRESS, title=HOSTILE_TITLE)
    approval = pending_approval(task=task)
    Approval.objects.filter(pk=approval.pk).update(
        target="https://example.org/a.csv\n*Effect:* nothing <@U0BOSS>",
        effect="Sends an HTTP GET request\n\n*Arguments:* `none` & <https://evil.example>",
    )
    with transaction.atomic():
        set_status(
            lock_task(task.pk),
            TaskStatus.AWAITING_APPROVAL,
            actor=Actor.worker("w"),
            kind=EventKind.APPROVAL_REQUESTED,
        )
    assert deliver_due().delivered == 1
    [message] = slack.server.posted
    section = message.blocks[0]["text"]["text"]
    lines = section.split("\n")
    assert [line.split(" ", 1)[0] for line in lines] == [
        "*Approval",
        "*Tool:*",
        "*Target:*",
        "*Arguments:*",
        "*Effect:*",
    ]
    assert lines[0].count("*Tool:*") == 1 and lines[1] == "*Tool:* `fetch_url`"
    assert "&lt;https://evil.example|Approve here&gt; &amp; &lt;!channel&gt;" in lines[0]
    assert lines[2] == "*Target:* `https://example.org/a.csv *Effect:* nothing &lt;@U0BOSS&gt;`"
    assert "&amp; &lt;https://evil.example&gt;" in lines[4]
    everything = json.dumps(message.body)
    assert "<https://evil" not in everything and "<!channel>" not in everything
    assert "<@U0BOSS>" not in everything
    assert "\n" not in message.body["text"]


def test_a_notification_without_buttons_is_one_escaped_line_too(slack):  # noqa: F811
    message = Message(
        idempotency_key="k",
        event_kind="failed",
        subject="Failed (limit_steps): task #1 “a\nb <!here>”",
        text="Task #1 failed\n*Tool:* x & <https://evil.example|y>",
        url="u",
        payload={},
    )
    body = message_body(slack.target, message)
    shown = body["blocks"][0]["text"]["text"]
    assert shown == (
        "*Failed (limit_steps): task #1 “a b &lt;!here&gt;”*\n"
        "Task #1 failed *Tool:* x &amp; &lt;https://evil.example|y&gt;"
    )
    assert body["text"] == "Failed (limit_steps): task #1 “a b &lt;!here&gt;”"


@pytest.mark.django_db  # no database needed: the closest mark spares the module's flush
def test_line_never_cuts_inside_an_escape():
    assert line("a" * 8 + "&", 10) == "a" * 8 + "…"
    assert line("<" * 10, 10) == "&lt;&lt;…"
    assert line("x\n\ty  z", 10) == "x y z"


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("url", "allowed"),
    [
        ("https://hooks.slack.com/actions/T0/1/x", True),
        ("HTTPS://Hooks.Slack.COM:443/actions/T0/1/x", True),
        ("https://hooks.slack.com.evil/actions/T0/1/x", False),
        ("https://hooks.slack.com.evil.example/", False),
        ("https://hooks.slack.com@evil.example/actions/", False),
        ("https://user@hooks.slack.com/actions/", False),
        ("https://hooks.slack.com:8443/actions/", False),
        ("http://hooks.slack.com/actions/", False),
        ("https://hooks.slack.com/actions/../../other", False),
        ("https://hooks.slack.com/actions/%2e%2e/other", False),
        ("https://hooks.slack.com\\@evil.example/", False),
        ("https://hooks.slack.com/a b", False),
        ("https://hooks.slack.com:99999/actions/", False),
        ("https://hooks.slack.com:x/actions/", False),
        ("//hooks.slack.com/actions/", False),
        ("", False),
    ],
)
def test_a_response_url_is_matched_by_scheme_host_and_port(settings, url, allowed):
    settings.ACTHELM_SLACK_RESPONSE_URL_PREFIXES = ["https://hooks.slack.com"]
    assert response_url_allowed(url) is allowed


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("prefix", "url", "allowed"),
    [
        ("https://hooks.slack.com/actions/", "https://hooks.slack.com/actions/T0/1", True),
        ("https://hooks.slack.com/actions/", "https://hooks.slack.com/other/T0/1", False),
        ("https://hooks.slack.com/actions", "https://hooks.slack.com/actions/T0/1", True),
        ("https://hooks.slack.com/actions", "https://hooks.slack.com/actionsevil/1", False),
        ("http://127.0.0.1:8000/respond/", "http://127.0.0.1:8000/respond/1", True),
        ("http://127.0.0.1:8000/respond/", "http://127.0.0.1:80001/respond/1", False),
        ("http://127.0.0.1:8000/respond/", "http://127.0.0.1:800/respond/1", False),
        ("hooks.slack.com/", "https://hooks.slack.com/actions/T0/1", False),
    ],
)
def test_a_prefix_path_is_matched_by_whole_segments(settings, prefix, url, allowed):
    settings.ACTHELM_SLACK_RESPONSE_URL_PREFIXES = [prefix]
    assert response_url_allowed(url) is allowed
