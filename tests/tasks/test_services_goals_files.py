"""The services moved out of the console views for the API (a task created with its files, a
retry that raises the limit first, a delete that removes the files) and the goal services."""

from pathlib import Path

import pytest

from agents.actions import goal as goal_actions
from agents.actions import task as person_task
from core.exceptions import (
    GoalNotFound,
    InvalidInput,
    LimitNotRaised,
    NotPermitted,
    TransitionNotAllowed,
)
from tasks.models import Goal, Task
from tasks.states import EventKind, TaskStatus
from tasks.workspace import task_dir, workspace_dir
from tests.console.scenes import run_for
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


def test_create_with_files_puts_them_in_the_workspace(actor, tmp_path):
    source = tmp_path / "notes.txt"
    source.write_text("from a path")
    task = person_task.task_create_with_files(
        actor=actor,
        title="T",
        instruction="I",
        files=[("notes.txt", source), ("data.csv", b"a,b\n")],
    )
    assert (workspace_dir(task.pk) / "notes.txt").read_text() == "from a path"
    assert (workspace_dir(task.pk) / "data.csv").read_bytes() == b"a,b\n"


@pytest.mark.parametrize(
    "files", [[("a b.txt", b"")], [(".env", b"")], [("a.txt", b"1"), ("a.txt", b"2")]]
)
def test_create_with_bad_file_names_creates_nothing(actor, files):
    with pytest.raises(InvalidInput) as refused:
        person_task.task_create_with_files(actor=actor, title="T", instruction="I", files=files)
    assert refused.value.field == "files"
    assert not Task.objects.exists()


def test_a_refused_task_leaves_no_files(actor, settings):
    with pytest.raises(InvalidInput) as refused:
        person_task.task_create_with_files(
            actor=actor, title="T", instruction="I", tools=["nope"], files=[("a.txt", b"1")]
        )
    assert refused.value.field == "tools"
    assert not Task.objects.exists()
    assert not (Path(settings.ACTHELM_MEDIA_ROOT) / "tasks").exists() or not any(
        (Path(settings.ACTHELM_MEDIA_ROOT) / "tasks").iterdir()
    )


def test_retry_raises_the_limit_and_retries_in_one_transaction(actor):
    task = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps", limit_turns=4)
    run_for(task, model_turns=4)
    with pytest.raises(LimitNotRaised):
        person_task.task_retry(actor=actor, task_id=task.pk, limits={"limit_turns": 4})
    person_task.task_retry(actor=actor, task_id=task.pk, limits={"limit_turns": 8})
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.limit_turns == 8
    changed = task.events.get(kind=EventKind.LIMITS_CHANGED)
    assert changed.data == {"before": {"limit_turns": 4}, "after": {"limit_turns": 8}}


def test_a_refused_retry_does_not_keep_the_raised_limit(actor):
    task = TaskFactory(status=TaskStatus.REVIEW, limit_turns=4)
    with pytest.raises(TransitionNotAllowed):
        person_task.task_retry(actor=actor, task_id=task.pk, limits={"limit_turns": 8})
    task.refresh_from_db()
    assert task.limit_turns == 4 and not task.events.exists()


def test_delete_removes_the_files_too(actor):
    task = TaskFactory(status=TaskStatus.DONE)
    (workspace_dir(task.pk) / "a.txt").write_text("x")
    person_task.task_delete(actor=actor, task_id=task.pk)
    assert not task_dir(task.pk).exists()


def test_a_refused_delete_keeps_the_files(actor):
    task = TaskFactory(status=TaskStatus.READY)
    (workspace_dir(task.pk) / "a.txt").write_text("x")
    with pytest.raises(TransitionNotAllowed):
        person_task.task_delete(actor=actor, task_id=task.pk)
    assert (workspace_dir(task.pk) / "a.txt").exists()


@pytest.fixture
def goal_keeper(db):
    from core.actors import Actor
    from tests.factories import UserFactory

    return Actor.person(
        UserFactory(username="keeper", perms=["tasks.add_goal", "tasks.change_goal"])
    )


def test_goal_create_and_deactivate(goal_keeper):
    goal = goal_actions.goal_create(actor=goal_keeper, title="  Launch  ", description=" soon ")
    assert (goal.title, goal.description, goal.active) == ("Launch", "soon", True)
    assert goal.created_by.username == "keeper"
    goal_actions.goal_deactivate(actor=goal_keeper, goal_id=goal.pk)
    assert Goal.objects.get(pk=goal.pk).active is False
    with pytest.raises(TransitionNotAllowed):
        goal_actions.goal_deactivate(actor=goal_keeper, goal_id=goal.pk)
    with pytest.raises(GoalNotFound):
        goal_actions.goal_deactivate(actor=goal_keeper, goal_id=999999)


def test_goal_services_need_their_permissions(outsider):
    from core.actors import Actor

    with pytest.raises(NotPermitted):
        goal_actions.goal_create(actor=Actor.person(outsider), title="G")
    goal = Goal.objects.create(title="G")
    with pytest.raises(NotPermitted):
        goal_actions.goal_deactivate(actor=Actor.person(outsider), goal_id=goal.pk)
    assert Goal.objects.get(pk=goal.pk).active


@pytest.mark.parametrize("title", ["", "   ", "x" * 201])
def test_a_goal_needs_a_title(goal_keeper, title):
    with pytest.raises(InvalidInput) as refused:
        goal_actions.goal_create(actor=goal_keeper, title=title)
    assert refused.value.field == "title"


def test_the_reconciler_no_longer_plans_a_deactivated_goal(goal_keeper):
    from agents.engine.runtime.reconciler import idle_goal_ids

    goal = goal_actions.goal_create(actor=goal_keeper, title="Plan me")
    assert goal.pk in idle_goal_ids()
    goal_actions.goal_deactivate(actor=goal_keeper, goal_id=goal.pk)
    assert goal.pk not in idle_goal_ids()
