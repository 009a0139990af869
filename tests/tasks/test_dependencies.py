"""Dependencies gate work: blocked until every dependency is done, promoted in the same transaction
as the close that finished the last one, no cycle possible, stuck dependencies explained."""

import pytest
from django.db import transaction

from agents.actions import task as person_task
from agents.engine.run import intake
from agents.engine.verdict.policies import auto_close_if_allowed
from agents.states import RunStatus, Verdict
from core.actors import Actor
from core.exceptions import InvalidInput
from tasks import services
from tasks.models import Task, TaskDependency, TaskEvent
from tasks.selectors import blocking_reason
from tasks.states import EventKind, TaskKind, TaskOrigin, TaskStatus
from tasks.transitions import lock_task, set_status
from tests.factories import AgentRunFactory, TaskFactory

pytestmark = pytest.mark.django_db

WORKER = Actor.worker("w-test")


def create(actor, title, *deps):
    return intake.task_create(actor=actor, title=title, instruction="do it", depends_on=deps)


def finish(actor, task):
    """What the worker and a person do: run it to review, then close it."""
    with transaction.atomic():
        locked = lock_task(task.pk)
        set_status(
            locked,
            TaskStatus.IN_PROGRESS,
            actor=WORKER,
            kind=EventKind.CLAIMED,
            lease_owner="w-test",
            lease_expires_at=locked.created_at,
        )
        set_status(locked, TaskStatus.REVIEW, actor=WORKER, kind=EventKind.SUBMITTED)
    return person_task.task_close(actor=actor, task_id=task.pk)


def status(task) -> str:
    return Task.objects.values_list("status", flat=True).get(pk=task.pk)


def test_a_chain_is_promoted_one_link_at_a_time(actor):
    a = create(actor, "A")
    b = create(actor, "B", a)
    c = create(actor, "C", b)
    assert [status(t) for t in (a, b, c)] == ["ready", "blocked", "blocked"]

    finish(actor, a)
    assert [status(t) for t in (a, b, c)] == ["done", "ready", "blocked"]
    finish(actor, b)
    assert [status(t) for t in (b, c)] == ["done", "ready"]
    promoted = TaskEvent.objects.get(task=c, kind=EventKind.PROMOTED)
    assert promoted.data == {"dependency": b.pk} and promoted.actor_label == "founder"


def test_a_diamond_waits_for_both_sides(actor):
    top = create(actor, "top")
    left = create(actor, "left", top)
    right = create(actor, "right", top)
    bottom = create(actor, "bottom", left, right)

    finish(actor, top)
    assert (status(left), status(right), status(bottom)) == ("ready", "ready", "blocked")
    finish(actor, left)
    assert status(bottom) == "blocked"
    assert f"#{right.pk}" in blocking_reason(Task.objects.get(pk=bottom.pk))
    finish(actor, right)
    assert status(bottom) == "ready"
    assert TaskEvent.objects.filter(task=bottom, kind=EventKind.PROMOTED).count() == 1


def test_promotion_happens_in_the_closing_transaction(actor):
    dep = TaskFactory(status=TaskStatus.REVIEW)
    waiting = create(actor, "W", dep)
    with transaction.atomic():
        person_task.task_close(actor=actor, task_id=dep.pk)
        # Still inside the close's transaction: the dependant is already ready.
        assert status(waiting) == "ready"


def test_an_already_done_dependency_does_not_block(actor):
    done = TaskFactory(status=TaskStatus.DONE)
    assert create(actor, "T", done).status == TaskStatus.READY


@pytest.mark.parametrize("length", [2, 3, 5])
def test_no_cycle_can_form_a_task_only_waits_for_tasks_that_existed_before_it(actor, length):
    # The one way a dependency is made is task creation naming existing tasks, so every link
    # points at an older task and no chain of links can lead back to where it started.
    chain = [create(actor, "t0")]
    for i in range(1, length):
        chain.append(create(actor, f"t{i}", chain[-1]))
    top = create(actor, "top")
    create(actor, "bottom", create(actor, "left", top), create(actor, "right", top), chain[-1])
    links = list(TaskDependency.objects.values_list("task_id", "depends_on_id"))
    assert links and all(dep < task for task, dep in links)
    waits_for: dict[int, set[int]] = {}
    for task, dep in links:
        waits_for.setdefault(task, set()).add(dep)
    for start in waits_for:
        seen, todo = set(), list(waits_for[start])
        while todo:
            node = todo.pop()
            assert node != start, f"task {start} waits for itself"
            if node not in seen:
                seen.add(node)
                todo.extend(waits_for.get(node, ()))


def test_a_dependency_on_a_task_that_does_not_exist_yet_is_refused(actor):
    # Not even the id the new task itself is about to get: a task cannot wait for itself.
    newest = create(actor, "T")
    tasks, links = Task.objects.count(), TaskDependency.objects.count()
    with pytest.raises(InvalidInput, match="does not exist"):
        create(actor, "Self", Task(pk=newest.pk + 1))
    assert (Task.objects.count(), TaskDependency.objects.count()) == (tasks, links)


def test_cancelling_a_dependency_leaves_dependants_blocked_and_says_why(actor):
    dep = create(actor, "Collect data")
    other = create(actor, "Other")
    waiting = create(actor, "Report", dep, other)
    person_task.task_cancel(actor=actor, task_id=dep.pk, reason="not needed")

    assert status(waiting) == "blocked"
    event = TaskEvent.objects.get(task=waiting, kind=EventKind.UNBLOCK_BLOCKED)
    assert event.data == {"dependency": dep.pk, "dependency_status": "cancelled"}
    reason = blocking_reason(Task.objects.get(pk=waiting.pk))
    assert f"#{dep.pk} “Collect data” was cancelled" in reason
    assert f"#{other.pk} “Other” (ready)" in reason
    assert "cancel it" in reason


def test_a_failed_dependency_is_noted_on_its_dependants(actor):
    dep = TaskFactory(status=TaskStatus.IN_PROGRESS, title="Fetch")
    waiting = create(actor, "Use it", dep)
    unrelated = create(actor, "Unrelated")
    with transaction.atomic():
        locked = lock_task(dep.pk)
        set_status(
            locked,
            TaskStatus.FAILED,
            actor=WORKER,
            kind=EventKind.FAILED,
            failure_code="limit_steps",
        )
        noted = services.note_stuck_dependants(locked, actor=WORKER)

    assert noted == [waiting.pk]
    assert status(waiting) == "blocked"
    event = TaskEvent.objects.get(task=waiting, kind=EventKind.UNBLOCK_BLOCKED)
    assert event.data == {"dependency": dep.pk, "dependency_status": "failed"}
    assert event.actor_label == "w-test"
    assert not TaskEvent.objects.filter(task=unrelated, kind=EventKind.UNBLOCK_BLOCKED).exists()
    assert "failed and is done only if it is retried" in blocking_reason(
        Task.objects.get(pk=waiting.pk)
    )


def test_blocking_reason_is_none_unless_blocked(actor):
    assert blocking_reason(create(actor, "free")) is None


def test_blocking_reason_when_only_the_promotion_is_missing():
    dep = TaskFactory(status=TaskStatus.DONE)
    stale = TaskFactory(status=TaskStatus.BLOCKED)
    TaskDependency.objects.create(task=stale, depends_on=dep)
    assert "reconciler" in blocking_reason(stale)


def test_the_auto_close_path_promotes_dependants(settings, actor):
    settings.ACTHELM_AUTO_CLOSE_GOAL_NO_WORK = True
    planning = TaskFactory(
        status=TaskStatus.REVIEW, kind=TaskKind.PLANNING, origin=TaskOrigin.RECONCILER
    )
    TaskFactory(spawned_by=planning)
    waiting = create(actor, "After planning", planning)
    run = AgentRunFactory(
        task=planning,
        status=RunStatus.SUCCEEDED,
        verdict=Verdict.APPROVED,
        finished_at=planning.created_at,
    )
    with transaction.atomic():
        assert auto_close_if_allowed(lock_task(planning.pk), run, actor=WORKER)
    assert status(waiting) == "ready"
