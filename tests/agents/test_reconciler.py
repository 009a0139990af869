"""The reconciler: promotes unblocked tasks, plans idle goals once, and is safe to run from many
processes at once."""

import json
import subprocess
import sys

import pytest
from django.conf import settings

from agents.engine.runtime.reconciler import PLANNING_TOOLS, choose_model, reconcile
from agents.states import CostTier, ModelTestStatus
from tasks.models import Task, TaskDependency, TaskEvent
from tasks.states import EventKind, TaskKind, TaskOrigin, TaskStatus
from tests.conftest import ROOT
from tests.factories import ConnectionFactory, GoalFactory, ModelFactory, TaskFactory


@pytest.fixture
def free_model(db):
    """The fallback: a tested model on a zero-cost connection."""
    return ModelFactory(name="free", connection=ConnectionFactory(name="free-conn", priority=5))


def planning_tasks(goal):
    return Task.objects.filter(goal=goal, kind=TaskKind.PLANNING)


@pytest.mark.django_db
def test_an_idle_goal_gets_one_planning_task(free_model):
    goal = GoalFactory(title="Grow the newsletter", description="Reach 1,000 readers by June.")
    report = reconcile()

    task = planning_tasks(goal).get()
    assert report.planned == [{"goal_id": goal.pk, "task_id": task.pk}]
    assert task.status == TaskStatus.READY
    assert task.origin == TaskOrigin.RECONCILER
    # The planning tools, and the default tools its follow-ups may inherit (never more).
    assert task.tools[:2] == PLANNING_TOOLS
    assert set(task.tools) == set(PLANNING_TOOLS) | set(settings.ACTHELM_DEFAULT_TOOLS)
    assert task.instruction.startswith("Plan the next work for this goal: Grow the newsletter")
    assert "Reach 1,000 readers by June." in task.instruction
    assert "propose_task" in task.instruction
    assert (task.connection_id, task.model_id) == (free_model.connection_id, free_model.pk)
    created = TaskEvent.objects.get(task=task, kind=EventKind.CREATED)
    assert (created.actor_kind, created.actor_label) == ("system", "reconciler")

    assert reconcile().planned == []  # its planning task is open work
    assert planning_tasks(goal).count() == 1


@pytest.mark.django_db
@pytest.mark.parametrize(
    "status", [s for s in TaskStatus if s not in (TaskStatus.DONE, TaskStatus.CANCELLED)]
)
def test_a_goal_with_open_work_is_left_alone(free_model, status):
    goal = GoalFactory()
    TaskFactory(goal=goal, status=status)
    assert reconcile().planned == []
    assert not planning_tasks(goal).exists()


@pytest.mark.django_db
def test_an_inactive_goal_is_never_planned(free_model):
    goal = GoalFactory(active=False)
    reconcile()
    assert not planning_tasks(goal).exists()


@pytest.mark.django_db
def test_a_goal_whose_work_is_done_is_planned_on_the_model_of_its_latest_task(free_model):
    goal = GoalFactory()
    used = ModelFactory(connection=ConnectionFactory(cost_tier=CostTier.PAID))
    TaskFactory(
        goal=goal, status=TaskStatus.DONE, connection=free_model.connection, model=free_model
    )
    TaskFactory(goal=goal, status=TaskStatus.CANCELLED, connection=used.connection, model=used)
    reconcile()
    task = planning_tasks(goal).get()
    assert task.model_id == used.pk
    assert "(cancelled)" in task.instruction and "(done)" in task.instruction


@pytest.mark.django_db
def test_the_fallback_is_the_highest_priority_zero_cost_tested_tool_model():
    goal = GoalFactory()
    ModelFactory(connection=ConnectionFactory(priority=100, cost_tier=CostTier.PAID))
    ModelFactory(connection=ConnectionFactory(priority=90), test_status=ModelTestStatus.FAILED)
    ModelFactory(connection=ConnectionFactory(priority=80), test_status=ModelTestStatus.UNTESTED)
    ModelFactory(connection=ConnectionFactory(priority=70), supports_tools=False)
    ModelFactory(connection=ConnectionFactory(priority=60, enabled=False))
    best = ModelFactory(connection=ConnectionFactory(priority=50))
    ModelFactory(connection=ConnectionFactory(priority=10))
    assert choose_model(goal) == best


@pytest.mark.django_db
def test_a_latest_model_that_is_no_longer_usable_falls_back(free_model):
    goal = GoalFactory()
    broken = ModelFactory(test_status=ModelTestStatus.FAILED)
    TaskFactory(goal=goal, status=TaskStatus.DONE, connection=broken.connection, model=broken)
    assert choose_model(goal) == free_model


@pytest.mark.django_db
def test_without_a_usable_model_the_goal_is_skipped_with_a_reason():
    goal = GoalFactory()
    ModelFactory(connection=ConnectionFactory(cost_tier=CostTier.PAID))
    report = reconcile()
    assert report.planned == []
    assert report.skipped == [
        {"goal_id": goal.pk, "reason": "no tested, tool-calling model on an enabled connection"}
    ]
    assert not Task.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize(
    ("status", "follow_up", "planned_again"),
    [
        (TaskStatus.CANCELLED, False, False),  # a person stopped the planning: respect it
        (TaskStatus.DONE, False, False),  # the planner found nothing to do
        (TaskStatus.DONE, True, True),  # its follow-ups are done: plan the next round
    ],
)
def test_a_settled_planning_round_is_not_repeated_blindly(
    free_model, status, follow_up, planned_again
):
    goal = GoalFactory()
    last = TaskFactory(
        goal=goal, status=status, kind=TaskKind.PLANNING, origin=TaskOrigin.RECONCILER
    )
    if follow_up:
        TaskFactory(goal=goal, status=TaskStatus.DONE, spawned_by=last)
    report = reconcile()
    assert bool(report.planned) is planned_again
    assert planning_tasks(goal).count() == (2 if planned_again else 1)
    if not planned_again:
        assert report.skipped[0]["goal_id"] == goal.pk
        assert f"#{last.pk}" in report.skipped[0]["reason"]


@pytest.mark.django_db
def test_promotes_blocked_tasks_whose_dependencies_are_done():
    done = TaskFactory(status=TaskStatus.DONE)
    open_dep = TaskFactory(status=TaskStatus.REVIEW)
    missed = TaskFactory(status=TaskStatus.BLOCKED)
    TaskDependency.objects.create(task=missed, depends_on=done)
    still = TaskFactory(status=TaskStatus.BLOCKED)
    TaskDependency.objects.create(task=still, depends_on=done)
    TaskDependency.objects.create(task=still, depends_on=open_dep)

    report = reconcile()

    assert report.promoted == [missed.pk]
    assert Task.objects.get(pk=missed.pk).status == TaskStatus.READY
    assert Task.objects.get(pk=still.pk).status == TaskStatus.BLOCKED
    event = TaskEvent.objects.get(task=missed, kind=EventKind.PROMOTED)
    assert event.actor_label == "reconciler" and event.data == {"by": "reconciler"}
    assert reconcile().promoted == []


def test_the_command_prints_a_summary_and_json(manage_process, free_model):
    manage = manage_process  # the command's one test: a real `manage.py` process
    goal = GoalFactory()
    result = manage("acthelm_reconcile", check=True)
    assert "created 1 planning task(s)" in result.stdout
    result = manage("acthelm_reconcile", "--json", check=True)
    assert json.loads(result.stdout) == {"promoted": [], "planned": [], "skipped": []}
    assert planning_tasks(goal).count() == 1


def test_four_processes_at_once_create_one_planning_task_per_idle_goal(worker_env, free_model):
    idle = [GoalFactory() for _ in range(40)]
    busy = GoalFactory()
    TaskFactory(goal=busy, status=TaskStatus.IN_PROGRESS)
    done = TaskFactory(status=TaskStatus.DONE)
    blocked = [TaskFactory(status=TaskStatus.BLOCKED) for _ in range(20)]
    TaskDependency.objects.bulk_create(
        [TaskDependency(task=task, depends_on=done) for task in blocked]
    )

    procs = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "acthelm_reconcile", "--json"],
            env=worker_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))

    for goal in idle:
        assert planning_tasks(goal).count() == 1, f"goal {goal.pk}"
    assert not planning_tasks(busy).exists()
    planned = sorted(p["goal_id"] for r in reports for p in r["planned"])
    assert planned == sorted(g.pk for g in idle)
    promoted = sorted(i for r in reports for i in r["promoted"])
    assert promoted == sorted(t.pk for t in blocked)
    assert TaskEvent.objects.filter(kind=EventKind.PROMOTED).count() == len(blocked)
