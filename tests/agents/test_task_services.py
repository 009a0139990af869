"""A task's services that reach past the ledger: create (tools, model, limits), cancel, resume
and retry."""

import pytest
from django.utils import timezone

from agents import task_services
from agents.states import RunStatus
from tasks import services
from tasks.exceptions import (
    InvalidInput,
    LimitNotRaised,
    ModelCheckFailed,
    TransitionNotAllowed,
)
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.factories import AgentRunFactory, ModelFactory, TaskFactory

pytestmark = pytest.mark.django_db


def test_create_copies_limit_defaults_and_is_ready(actor, settings):
    settings.ACTHELM_LIMIT_TURNS = 7
    task = task_services.task_create(actor=actor, title="T", instruction="I")
    assert task.status == TaskStatus.READY
    assert task.limit_turns == 7 and task.limit_network_requests == 8
    assert task.created_by == actor.user
    event = TaskEvent.objects.get(task=task)
    assert event.kind == EventKind.CREATED and event.actor_label == "founder"


def test_create_with_an_unfinished_dependency_is_blocked(actor):
    dep = TaskFactory(status=TaskStatus.REVIEW)
    task = task_services.task_create(actor=actor, title="T", instruction="I", depends_on=[dep])
    assert task.status == TaskStatus.BLOCKED


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"title": ""}, "title"),
        ({"instruction": "  "}, "instruction"),
        ({"tools": ["rm_rf"]}, "unknown tools"),
        ({"tool_policies": {"read_file": "maybe"}}, "allow or ask"),
        ({"limits": {"limit_turns": 0}}, "positive"),
        ({"limits": {"limit_turns": "many"}}, "whole number"),
        ({"limits": {"limit_coffee": 3}}, "unknown limit"),
    ],
)
def test_create_refuses_bad_input_clearly(actor, kwargs, message):
    base = {"title": "T", "instruction": "I"}
    with pytest.raises(InvalidInput, match=message):
        task_services.task_create(actor=actor, **(base | kwargs))
    assert not Task.objects.exists()


def test_cancel_ends_the_running_attempt(actor):
    run = AgentRunFactory()
    task_services.task_cancel(actor=actor, task_id=run.task_id)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.finished_at
    assert Task.objects.get(pk=run.task_id).status == TaskStatus.CANCELLED


def test_a_cancelled_task_cannot_be_resumed(actor):
    task = TaskFactory(status=TaskStatus.CANCELLED)
    with pytest.raises(TransitionNotAllowed):
        task_services.task_resume(actor=actor, task_id=task.pk)


def test_retry_after_a_limit_needs_the_limit_raised(actor):
    task = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps", limit_turns=3)
    AgentRunFactory(task=task, status=RunStatus.FAILED, model_turns=3, finished_at=timezone.now())
    with pytest.raises(LimitNotRaised):
        task_services.task_retry(actor=actor, task_id=task.pk)
    services.task_set_limits(actor=actor, task_id=task.pk, limit_turns=10)
    assert task_services.task_retry(actor=actor, task_id=task.pk).status == TaskStatus.READY


def test_resume_on_another_model_runs_the_checks(actor):
    task = TaskFactory(status=TaskStatus.PAUSED)
    untested = ModelFactory(test_status="failed")
    with pytest.raises(ModelCheckFailed, match="has not passed its test"):
        task_services.task_resume(actor=actor, task_id=task.pk, model=untested)
    no_tools = ModelFactory(supports_tools=False)
    with pytest.raises(ModelCheckFailed, match="tool calling"):
        task_services.task_resume(actor=actor, task_id=task.pk, model=no_tools)
    small = ModelFactory(context_window=1)
    with pytest.raises(ModelCheckFailed, match="context window"):
        task_services.task_resume(actor=actor, task_id=task.pk, model=small)
    unknown = ModelFactory(context_window=None)
    task_services.task_resume(actor=actor, task_id=task.pk, model=unknown)
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.model == unknown
    event = TaskEvent.objects.filter(task=task, kind=EventKind.RESUMED).get()
    assert "could not be made" in event.data["check"]["notes"][0]
