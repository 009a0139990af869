"""Evaluation tasks are run like any task but kept out of what a person works through: the task
list's default view, the review queue, the approvals inbox and its badge, and the scorecard's
real-work figures."""

import pytest
from django.utils import timezone

from agents.engine.run.intake import task_create
from agents.scorecard import model_scorecard, scorecard_window
from agents.states import RunStatus
from console.context_processors import pending_decisions_count
from core.actors import Actor
from tasks.models import TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.factories import (
    AgentRunFactory,
    ApprovalFactory,
    ModelFactory,
    TaskEventFactory,
    TaskFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def founder(client):
    user = UserFactory(
        username="founder",
        is_superuser=True,
        perms=["tasks.view_task", "approvals.decide_approval", "agents.view_agentrun"],
    )
    client.force_login(user)
    return user


def test_task_create_marks_an_evaluation_task_and_says_so_in_its_timeline():
    task = task_create(
        actor=Actor.system("acthelm_eval"), title="t", instruction="i", evaluation=True
    )
    assert task.is_evaluation
    assert TaskEvent.objects.get(task=task, kind=EventKind.CREATED).data["evaluation"] is True
    plain = task_create(actor=Actor.system("x"), title="t", instruction="i")
    assert not plain.is_evaluation


def test_the_task_list_shows_work_by_default_and_evaluation_tasks_on_request(client, founder):
    work = TaskFactory(title="Real work")
    evaluation = TaskFactory(title="[eval 1] files_list", is_evaluation=True)
    html = client.get("/").content.decode()
    assert work.title in html and evaluation.title not in html
    html = client.get("/?evaluation=1").content.decode()
    assert evaluation.title in html and work.title not in html
    html = client.get("/?evaluation=1&status=ready").content.decode()
    assert evaluation.title in html


def test_the_review_queue_leaves_evaluation_tasks_out(client, founder):
    TaskFactory(title="Close me", status=TaskStatus.REVIEW)
    TaskFactory(title="[eval 1] plan_first", status=TaskStatus.REVIEW, is_evaluation=True)
    html = client.get("/").content.decode()
    assert 'href="/review/"' in html  # the nav's review page (the console's, issue 24 item 5)
    queue = client.get("/review/").content.decode()
    assert "Close me" in queue and "[eval 1] plan_first" not in queue
    admin = client.get("/admin/tasks/task/?status__exact=review&is_evaluation__exact=0")
    assert "[eval 1] plan_first" not in admin.content.decode()


def test_the_inbox_and_its_badge_leave_evaluation_approvals_to_the_runner(client, founder):
    mine = ApprovalFactory(
        tool_call__task=TaskFactory(status=TaskStatus.AWAITING_APPROVAL),
        target="https://example.com/mine",
    )
    ApprovalFactory(
        tool_call__task=TaskFactory(status=TaskStatus.AWAITING_APPROVAL, is_evaluation=True),
        target="https://example.com/eval",
    )
    assert pending_decisions_count() == 1
    html = client.get("/approvals/").content.decode()
    assert mine.target in html and "https://example.com/eval" not in html


def test_the_scorecard_counts_real_work_only():
    model = ModelFactory()
    for evaluation in (False, True):
        task = TaskFactory(status=TaskStatus.DONE, model=model, is_evaluation=evaluation)
        AgentRunFactory(
            task=task,
            model=model,
            status=RunStatus.SUCCEEDED,
            finished_at=timezone.now(),
            input_tokens=100,
        )
        TaskEventFactory(task=task, kind=EventKind.CLOSED)
    card = model_scorecard(window=scorecard_window(period="day"))
    [score] = card.models
    assert (score.runs, score.closed, score.input_tokens) == (1, 1, 100)
    assert card.totals.runs == 1


def test_acthelm_task_list_leaves_evaluation_tasks_out_unless_asked(capsys):
    import json

    from django.core.management import call_command

    TaskFactory(title="Real work")
    TaskFactory(title="[eval 1] files_list", is_evaluation=True)
    call_command("acthelm_task", "--json", "list")
    rows = json.loads(capsys.readouterr().out)
    assert [(r["title"], r["is_evaluation"]) for r in rows] == [("Real work", False)]
    call_command("acthelm_task", "--json", "list", "--evaluation")
    rows = json.loads(capsys.readouterr().out)
    assert [(r["title"], r["is_evaluation"]) for r in rows] == [("[eval 1] files_list", True)]
