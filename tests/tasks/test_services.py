import pytest
from django.utils import timezone

from agents.actions import task as person_task
from agents.engine.run import intake
from agents.models import AgentRun
from agents.states import RunStatus
from core.actors import Actor
from core.exceptions import (
    InvalidInput,
    NotPermitted,
    TransitionNotAllowed,
)
from tasks.models import Task
from tasks.states import ACTIONS, Action, TaskStatus
from tests.factories import AgentRunFactory, TaskFactory

pytestmark = pytest.mark.django_db


def test_pause_is_immediate_for_ready_and_cooperative_for_running(actor):
    ready = TaskFactory()
    running = TaskFactory(status=TaskStatus.IN_PROGRESS)
    assert person_task.task_pause(actor=actor, task_id=ready.pk).status == TaskStatus.PAUSED
    assert (
        person_task.task_pause(actor=actor, task_id=running.pk).status == TaskStatus.PAUSE_REQUESTED
    )
    assert (
        person_task.task_withdraw_pause(actor=actor, task_id=running.pk).status
        == TaskStatus.IN_PROGRESS
    )


def test_close_needs_review_and_the_permission(actor, outsider):
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    with pytest.raises(TransitionNotAllowed):
        person_task.task_close(actor=actor, task_id=task.pk)
    review = TaskFactory(status=TaskStatus.REVIEW)
    with pytest.raises(NotPermitted):
        person_task.task_close(actor=Actor.person(outsider), task_id=review.pk)
    with pytest.raises(TransitionNotAllowed):
        person_task.task_close(actor=Actor.worker("w1"), task_id=review.pk)
    assert person_task.task_close(actor=actor, task_id=review.pk).status == TaskStatus.DONE


def test_closing_the_last_dependency_promotes_the_dependant_in_the_same_transaction(actor):
    a = TaskFactory(status=TaskStatus.REVIEW)
    b = TaskFactory(status=TaskStatus.REVIEW)
    child = intake.task_create(actor=actor, title="C", instruction="I", depends_on=[a, b])
    person_task.task_close(actor=actor, task_id=a.pk)
    assert Task.objects.get(pk=child.pk).status == TaskStatus.BLOCKED
    person_task.task_close(actor=actor, task_id=b.pk)
    assert Task.objects.get(pk=child.pk).status == TaskStatus.READY


def test_reopen_needs_feedback_and_carries_it(actor):
    task = TaskFactory(status=TaskStatus.REVIEW)
    with pytest.raises(InvalidInput):
        person_task.task_reopen(actor=actor, task_id=task.pk, feedback=" ")
    task = person_task.task_reopen(actor=actor, task_id=task.pk, feedback="Cite sources.")
    assert task.status == TaskStatus.READY and task.feedback == "Cite sources."


def test_delete_only_settled_tasks(actor):
    open_task = TaskFactory(status=TaskStatus.REVIEW)
    with pytest.raises(TransitionNotAllowed):
        person_task.task_delete(actor=actor, task_id=open_task.pk)
    done = TaskFactory(status=TaskStatus.DONE)
    AgentRunFactory(task=done, status=RunStatus.SUCCEEDED, finished_at=timezone.now())
    person_task.task_delete(actor=actor, task_id=done.pk)
    assert not Task.objects.filter(pk=done.pk).exists()
    assert not AgentRun.objects.filter(task_id=done.pk).exists()


@pytest.mark.parametrize("status", TaskStatus.values)
def test_every_person_action_matches_the_actions_table(actor, status):
    """Each service accepts exactly the states the table lists for its action."""
    calls = {
        Action.PAUSE: lambda t: person_task.task_pause(actor=actor, task_id=t),
        Action.WITHDRAW_PAUSE: lambda t: person_task.task_withdraw_pause(actor=actor, task_id=t),
        Action.RESUME: lambda t: person_task.task_resume(actor=actor, task_id=t),
        Action.CANCEL: lambda t: person_task.task_cancel(actor=actor, task_id=t),
        Action.CLOSE: lambda t: person_task.task_close(actor=actor, task_id=t),
        Action.REOPEN: lambda t: person_task.task_reopen(actor=actor, task_id=t, feedback="f"),
        Action.RETRY: lambda t: person_task.task_retry(actor=actor, task_id=t),
        Action.DELETE: lambda t: person_task.task_delete(actor=actor, task_id=t),
    }
    for action, call in calls.items():
        task = TaskFactory(status=status)
        if action in ACTIONS[status]:
            call(task.pk)
        else:
            with pytest.raises(TransitionNotAllowed):
                call(task.pk)
            assert Task.objects.get(pk=task.pk).status == status
