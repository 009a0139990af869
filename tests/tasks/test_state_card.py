"""The task page's state card says why (issue 24 item 6): the unfinished dependencies of a
blocked task as links, a scheduled retry's reason with "Retry now", a cooling connection's end,
the goal, parent and follow-ups as links; who decided each operation at its tool call; a run that
stopped for an approval is not shown as a failure; the goal page lists its tasks."""

from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from agents.actions.task import task_retry_now
from agents.states import ToolCallStatus
from approvals.states import ApprovalStatus
from core.actors import Actor
from core.exceptions import TransitionNotAllowed
from tasks.models import Task, TaskDependency, TaskEvent
from tasks.states import EventKind, TaskKind, TaskStatus
from tests.factories import (
    AgentRunFactory,
    ApprovalFactory,
    ConnectionFactory,
    GoalFactory,
    TaskEventFactory,
    TaskFactory,
    ToolCallFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def operator(db):
    return UserFactory(username="ops", perms=["tasks.view_task", "tasks.operate_task"])


@pytest.fixture
def page(client, operator):
    client.force_login(operator)
    return lambda task: client.get(reverse("tasks:detail", args=[task.pk])).content.decode()


def _card(html: str) -> str:
    return html[
        html.index('<section class="card state">') : html.index(
            "</section>", html.index('<section class="card state">')
        )
    ]


def test_a_blocked_task_links_the_tasks_it_waits_for(page):
    first = TaskFactory(title="Gather the numbers", status=TaskStatus.IN_PROGRESS)
    done = TaskFactory(title="Already done", status=TaskStatus.DONE)
    blocked = TaskFactory(title="Write the report", status=TaskStatus.BLOCKED)
    for dep in (first, done):
        TaskDependency.objects.create(task=blocked, depends_on=dep)
    card = _card(page(blocked))
    assert f'<a href="/tasks/{first.pk}/">#{first.pk} Gather the numbers</a>' in card
    assert "Already done" not in card


def test_a_scheduled_retry_says_why_and_retry_now_drops_the_wait(client, page, operator):
    task = TaskFactory(
        status=TaskStatus.READY,
        not_before=timezone.now() + timedelta(minutes=5),
        failed_attempts=2,
    )
    TaskEventFactory(
        task=task,
        kind=EventKind.RETRY_SCHEDULED,
        data={
            "attempt": 2,
            "of": 3,
            "delay_seconds": 300,
            "code": "provider_error",
            "message": "HTTP 502",
        },
    )
    card = _card(page(task))
    # One count of attempts: two of the three failed, the third is scheduled.
    assert '<span class="muted" id="task-attempts">2 of 3 attempts failed</span>' in card
    assert "Attempt 3 of 3 scheduled after <code>provider_error</code>" in card
    assert "HTTP 502" in card and 'data-action="retry_now"' in card
    response = client.post(reverse("tasks:retry_now", args=[task.pk]), follow=True)
    assert "its retry wait was dropped" in response.content.decode()
    task.refresh_from_db()
    assert task.not_before is None and task.status == TaskStatus.READY
    event = TaskEvent.objects.filter(task=task, kind=EventKind.RETRIED).get()
    assert event.data["retry_now"] is True and event.actor_user == operator
    with pytest.raises(TransitionNotAllowed):
        task_retry_now(actor=Actor.person(operator), task_id=task.pk)  # no wait left
    viewer = UserFactory(perms=["tasks.view_task"])
    client.force_login(viewer)
    assert client.post(reverse("tasks:retry_now", args=[task.pk])).status_code == 403


def test_a_cooling_connection_says_until_when(page):
    until = timezone.now() + timedelta(minutes=30)
    conn = ConnectionFactory(
        cooldown_until=until, last_error_code="rate_limited", last_error_message="429"
    )
    task = TaskFactory(status=TaskStatus.READY, connection=conn)
    card = _card(page(task))
    assert (
        f'datetime="{until.isoformat(timespec="microseconds")}' in card.replace("+00:00", "+00:00")
        or until.strftime("%Y-%m-%d %H:%M") in card
    )
    assert "rate_limited" in card and "(in " in card


def test_goal_parent_and_follow_ups_are_links_and_the_goal_page_lists_its_tasks(client, page):
    goal = GoalFactory(title="Launch in April")
    parent = TaskFactory(
        title="Plan the launch", goal=goal, status=TaskStatus.DONE, kind=TaskKind.PLANNING
    )
    child = TaskFactory(title="Book the venue", goal=goal, spawned_by=parent)
    card = _card(page(parent))
    assert f'href="/goals/{goal.pk}/"' in card and f"#{child.pk} Book the venue" in card
    card = _card(page(child))
    assert f'Follow-up of <a href="/tasks/{parent.pk}/">#{parent.pk} Plan the launch</a>' in card
    html = client.get(reverse("tasks:goal", args=[goal.pk])).content.decode()
    assert "Launch in April" in html and "Plan the launch" in html and "Book the venue" in html


def test_who_decided_is_shown_at_the_tool_call_and_a_stop_for_approval_is_not_red(page):
    alice = UserFactory(username="alice")
    task = TaskFactory(status=TaskStatus.READY)
    AgentRunFactory(
        task=task,
        number=1,
        status="cancelled",
        error_code="awaiting_approval",
        finished_at=timezone.now(),
    )
    call = ToolCallFactory(
        task=task, turn__task=task, turn__run=task.runs.get(), status=ToolCallStatus.SUCCEEDED
    )
    ApprovalFactory(
        tool_call=call,
        status=ApprovalStatus.APPROVED,
        decided_by=alice,
        decided_at=timezone.now(),
    )
    html = page(task)
    call_html = html[html.index(f'id="call-{call.pk}"') :][:3000]
    assert "approved by <strong>alice</strong>" in call_html
    runs = html[html.index('class="card runs-card"') :][:2000]
    assert "stopped for an approval" in runs and "Cancelled" not in runs
    assert Task.objects.get(pk=task.pk).status == TaskStatus.READY


def test_a_task_failed_in_an_error_loop_reads_as_one_sentence(page):
    task = TaskFactory(
        status=TaskStatus.FAILED,
        failed_attempts=3,
        failure_code="error_loop",
        failure_message="All 3 attempts failed with the same error (provider_timeout): slow",
    )
    card = _card(page(task))
    assert '<span class="muted" id="task-attempts">all 3 attempts failed</span>' in card
    assert (
        "<code>error_loop</code> All 3 attempts failed with the same error (provider_timeout): "
        "slow" in card
    )
    assert "every attempt" not in card and "a loop:" not in card
