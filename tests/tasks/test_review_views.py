"""The console's review page (console.views.review): each row with its answer, verdict and
artifacts; search and filters; bulk close and reopen through the task services."""

import datetime

import pytest
from django.urls import reverse
from django.utils import timezone

from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.console.scenes import run_for
from tests.factories import ArtifactFactory, GoalFactory, ModelFactory, TaskFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def closer(client):
    client.force_login(UserFactory(perms=["tasks.view_task", "tasks.close_task"]))
    return client


def in_review(title, **kwargs):
    task = TaskFactory(status=TaskStatus.REVIEW, title=title, **kwargs)
    run_for(task, answer=f"The answer of {title}.", verdict="approved", verdict_reason="fine")
    return task


def test_each_row_has_its_answer_verdict_and_artifacts_and_evaluation_tasks_are_left_out(closer):
    task = in_review("Summarise the notes")
    artifact = ArtifactFactory(task=task, name="summary.md")
    in_review("[eval 1] plan_first", is_evaluation=True)
    TaskFactory(status=TaskStatus.READY, title="Not finished")
    page = closer.get(reverse("tasks:review")).content.decode()
    assert "The answer of Summarise the notes." in page and "approved" in page
    assert reverse("tasks:artifact_view", args=[task.pk, artifact.pk]) in page
    assert "plan_first" not in page and "Not finished" not in page


def test_search_and_filters(closer):
    goal, model = GoalFactory(title="Q3"), ModelFactory(name="qwen")
    wanted = in_review("Compare quotes", goal=goal, model=model, tags=["supplier"])
    other = in_review("Other work")
    Task.objects.filter(pk=other.pk).update(updated_at=timezone.now() - datetime.timedelta(days=9))

    def shown(**params):
        page = closer.get(reverse("tasks:review"), params).content.decode()
        return {t.pk for t in (wanted, other) if f'data-task="{t.pk}"' in page}

    assert shown() == {wanted.pk, other.pk}
    assert shown(q="answer of compare") == {wanted.pk}  # the answer is searched too
    assert shown(tag="supplier") == {wanted.pk}
    assert shown(goal=goal.pk) == {wanted.pk}
    assert shown(model=model.pk) == {wanted.pk}
    since = (timezone.now() - datetime.timedelta(days=2)).date().isoformat()
    assert shown(since=since) == {wanted.pk}
    assert shown(until=since) == {other.pk}
    assert shown(since="not a date") == {wanted.pk, other.pk}


def test_bulk_close_and_reopen_go_through_the_services(closer):
    first, second, third = in_review("A"), in_review("B"), in_review("C")
    ready = TaskFactory(status=TaskStatus.READY)
    response = closer.post(
        reverse("tasks:review_bulk"),
        {"action": "close", "task": [first.pk, second.pk, ready.pk], "next": "/review/?q=x"},
        follow=True,
    )
    assert response.redirect_chain[-1][0] == "/review/?q=x"
    page = response.content.decode()
    assert f"Closed 2 task(s): #{first.pk}, #{second.pk}." in page
    assert f"#{ready.pk}:" in page  # refused, and why
    assert Task.objects.get(pk=first.pk).status == TaskStatus.DONE
    assert TaskEvent.objects.filter(task=first, kind=EventKind.CLOSED).count() == 1
    assert Task.objects.get(pk=ready.pk).status == TaskStatus.READY

    closer.post(reverse("tasks:review_bulk"), {"action": "reopen", "task": [third.pk]})
    assert Task.objects.get(pk=third.pk).status == TaskStatus.REVIEW  # feedback is required
    closer.post(
        reverse("tasks:review_bulk"),
        {"action": "reopen", "task": [third.pk], "feedback": "Cite the notes."},
    )
    third.refresh_from_db()
    assert (third.status, third.feedback) == (TaskStatus.READY, "Cite the notes.")


def test_bulk_needs_the_close_permission_and_goes_back_only_to_this_site(client):
    task = in_review("A")
    client.force_login(UserFactory(perms=["tasks.view_task"]))
    assert (
        client.post(
            reverse("tasks:review_bulk"), {"action": "close", "task": [task.pk]}
        ).status_code
        == 403
    )
    page = client.get(reverse("tasks:review")).content.decode()
    assert 'name="task"' not in page  # no checkboxes without the permission
    client.force_login(UserFactory(perms=["tasks.view_task", "tasks.close_task"]))
    response = client.post(
        reverse("tasks:review_bulk"),
        {"action": "close", "task": [task.pk], "next": "https://evil.example/"},
    )
    assert response["Location"] == reverse("tasks:review")
