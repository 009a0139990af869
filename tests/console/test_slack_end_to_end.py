# ruff: noqa: F811 - the worker fixtures of tests/agents/conftest.py are imported below
"""Deciding from Slack with real processes: a worker process reaches an approval, its outbox
posts the message to the scripted Slack on loopback (which checks the bot token and records the
blocks), a click signed exactly as Slack signs it reaches the console's endpoint, the operation
is approved, the worker runs it and the task reaches review; the worker's outbox then updates
the message through its response_url."""

import pytest

from approvals.models import Approval
from approvals.states import ApprovalStatus
from console.models import SlackIdentity
from tasks.models import Task, TaskEvent
from tasks.notify.slack import APPROVE_ACTION, OPEN_ACTION
from tasks.states import EventKind, TaskStatus
from tests.agents.conftest import spawn_worker, wait_for  # noqa: F401 - fixtures
from tests.agents.scripted import tool_task
from tests.console.conftest import BOT_TOKEN, SIGNING_SECRET
from tests.factories import UserFactory
from tests.fakes.http_target import HttpTarget
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls
from tests.fakes.slack_server import interaction

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PLAN = {"steps": [{"step": "Fetch the Q3 report", "status": "in_progress"}]}


def status_of(task) -> str:
    return Task.objects.values_list("status", flat=True).get(pk=task.pk)


def test_a_click_in_slack_approves_the_workers_operation_and_the_task_runs_on(
    slack, spawn_worker, client
):
    alice = UserFactory(username="alice", perms=["approvals.decide_approval", "tasks.view_task"])
    SlackIdentity.objects.create(user=alice, slack_user_id="U0ALICE")
    with HttpTarget() as target, ScriptedModelServer(flavor="openai") as server:
        target.route("/q3.txt", body=b"Q3 revenue: 1.2M")
        url = f"{target.url}/q3.txt"
        server.enqueue(
            reply_tool_calls([("update_plan", PLAN)]),
            reply_tool_calls([("fetch_url", {"url": url})], text="Fetching the report."),
            reply_text("Q3 revenue was 1.2M."),
        )
        task = tool_task(server, ["update_plan", "fetch_url"], title="Collect the Q3 report")
        spawn_worker(env={**slack.env, "ACTHELM_FETCH_ALLOW_PRIVATE": "true"})

        # The worker stops at the approval; its outbox posts the card to Slack.
        wait_for(lambda: slack.server.posted, timeout=60, message="the Slack message")
        assert status_of(task) == TaskStatus.AWAITING_APPROVAL
        approval = Approval.objects.get(task=task)
        [message] = slack.server.posted
        assert message.headers["authorization"] == f"Bearer {BOT_TOKEN}"
        assert url in message.blocks[0]["text"]["text"]
        buttons = message.buttons()
        assert "/decide/approval/" in buttons[OPEN_ACTION]["url"]
        assert target.counts.get("/q3.txt", 0) == 0

        body, headers = interaction(
            SIGNING_SECRET,
            user="U0ALICE",
            action_id=APPROVE_ACTION,
            value=buttons[APPROVE_ACTION]["value"],
            response_url=message.response_url,
        )
        response = client.post(
            "/decide/slack/interactivity/",
            data=body,
            content_type="application/x-www-form-urlencoded",
            headers=headers,
        )
        assert response.status_code == 200 and response.json()["code"] == "decided"
        approval.refresh_from_db()
        assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == alice

        # The worker picks the task up again, runs the approved fetch and finishes.
        wait_for(lambda: status_of(task) == TaskStatus.REVIEW, timeout=60, message="review")
        assert target.counts["/q3.txt"] == 1
        # The worker's outbox delivered the message's update.
        wait_for(lambda: slack.server.responses, timeout=30, message="the message's update")
    [(_path, update)] = slack.server.responses
    assert update["replace_original"] is True
    assert update["text"].startswith("Approved by alice (<@U0ALICE>): fetch_url")
    event = TaskEvent.objects.get(task=task, kind=EventKind.APPROVED)
    assert event.data["via"] == "slack" and event.actor_user == alice
    assert event.data["arguments_hash"] == approval.arguments_hash
