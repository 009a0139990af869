"""AUTO_CLOSE_GOAL_NO_WORK: the only path to done without a person, and only for a reconciler's
approved planning task that produced a follow-up. Everything else stays in review."""

import pytest
from django.db import transaction
from django.utils import timezone

from agents.engine.verdict.policies import AUTO_CLOSE_GOAL_NO_WORK, auto_close_if_allowed
from agents.states import RunStatus, Verdict
from core.actors import Actor
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskKind, TaskOrigin, TaskStatus
from tasks.transitions import lock_task
from tests.factories import AgentRunFactory, GoalFactory, TaskFactory

pytestmark = pytest.mark.django_db

WORKER = Actor.worker("w-policy")


@pytest.fixture
def policy_on(settings):
    settings.ACTHELM_AUTO_CLOSE_GOAL_NO_WORK = True


def planning_in_review(
    *, kind=TaskKind.PLANNING, origin=TaskOrigin.RECONCILER, follow_ups=1, verdict=Verdict.APPROVED
):
    task = TaskFactory(status=TaskStatus.REVIEW, kind=kind, origin=origin, goal=GoalFactory())
    run = AgentRunFactory(
        task=task, status=RunStatus.SUCCEEDED, verdict=verdict, finished_at=timezone.now()
    )
    children = [TaskFactory(spawned_by=task, goal=task.goal) for _ in range(follow_ups)]
    return task, run, children


def apply(task, run) -> bool:
    with transaction.atomic():
        return auto_close_if_allowed(lock_task(task.pk), run, actor=WORKER)


def test_closes_an_approved_reconciler_planning_task_with_follow_ups(policy_on):
    task, run, children = planning_in_review(follow_ups=2)
    waiting = TaskFactory(status=TaskStatus.BLOCKED)
    waiting.dependency_links.create(depends_on=task)

    assert apply(task, run) is True

    task.refresh_from_db()
    assert task.status == TaskStatus.DONE
    event = TaskEvent.objects.get(task=task, kind=EventKind.AUTO_CLOSED)
    assert event.data == {
        "policy": AUTO_CLOSE_GOAL_NO_WORK,
        "follow_ups": sorted(c.pk for c in children),
    }
    assert (event.from_status, event.to_status) == ("review", "done")
    assert event.actor_kind == "worker" and event.run_id == run.pk
    assert Task.objects.get(pk=waiting.pk).status == TaskStatus.READY


@pytest.mark.parametrize(
    ("case", "kwargs"),
    [
        ("a work task", {"kind": TaskKind.WORK}),
        ("a planning task created by a person", {"origin": TaskOrigin.PERSON}),
        ("a planning task proposed as a follow-up", {"origin": TaskOrigin.AGENT}),
        ("a planning task with no follow-up", {"follow_ups": 0}),
        ("a rejected run", {"verdict": Verdict.REJECTED}),
    ],
)
def test_every_other_task_stays_in_review(policy_on, case, kwargs):
    task, run, _ = planning_in_review(**kwargs)
    events = TaskEvent.objects.count()
    assert apply(task, run) is False, case
    assert Task.objects.get(pk=task.pk).status == TaskStatus.REVIEW
    assert TaskEvent.objects.count() == events


def test_the_policy_is_off_by_default(settings):
    assert settings.ACTHELM_AUTO_CLOSE_GOAL_NO_WORK is False
    task, run, _ = planning_in_review()
    assert apply(task, run) is False
    assert Task.objects.get(pk=task.pk).status == TaskStatus.REVIEW
    assert not TaskEvent.objects.filter(kind=EventKind.AUTO_CLOSED).exists()


def test_the_run_must_be_the_tasks_own(policy_on):
    task, _, _ = planning_in_review()
    _other, other_run, _ = planning_in_review()
    assert apply(task, other_run) is False
    assert Task.objects.get(pk=task.pk).status == TaskStatus.REVIEW


def test_only_a_task_in_review_is_closed(policy_on):
    task, run, _ = planning_in_review()
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.READY)
    assert apply(task, run) is False
    assert Task.objects.get(pk=task.pk).status == TaskStatus.READY


@pytest.mark.parametrize(
    ("tool", "recovery_class", "closes"),
    [
        ("read_file", "read_only", True),  # reading the workspace changes nothing
        ("propose_task", "idempotent", True),  # what a planning task is for
        ("write_artifact", "idempotent", False),  # it produced something a person must see
        ("fetch_url", "external", False),  # it acted outside
    ],
)
def test_a_planning_task_that_acted_is_left_for_a_person(policy_on, tool, recovery_class, closes):
    # A reconciler planning task holds the default tools its follow-ups may inherit; the policy
    # closes it only while all it did was plan, propose and read.
    from tests.factories import ToolCallFactory

    task, run, _ = planning_in_review()
    ToolCallFactory(
        turn__run=run,
        tool=tool,
        recovery_class=recovery_class,
        status="succeeded",
        run_count=1,
        arguments={},
    )
    assert apply(task, run) is closes
    assert Task.objects.get(pk=task.pk).status == ("done" if closes else "review")
