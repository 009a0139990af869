import threading
from datetime import timedelta
from itertools import product

import pytest
from django.db import connection, transaction
from django.utils import timezone

from agents.engine.store import claim_next, fenced, holds_attempt, renew_lease
from agents.models import AgentRun
from agents.states import RunStatus
from core.actors import Actor
from core.exceptions import AttemptLost, TransitionNotAllowed
from tasks.models import Task, TaskEvent
from tasks.states import HELD, TRANSITIONS, EventKind, TaskStatus
from tasks.transitions import lock_task, set_status, transition
from tests.factories import TaskFactory, UserFactory

SYSTEM = Actor.system("test")
ALL_PAIRS = list(product(TaskStatus.values, TaskStatus.values))


@pytest.mark.django_db
@pytest.mark.parametrize(("current", "to"), ALL_PAIRS)
def test_every_pair_follows_the_table(current, to):
    task = TaskFactory(status=current)
    allowed = to in TRANSITIONS[current]
    lease = {}
    if to in HELD:  # only the claim enters a held state; it always sets a lease
        lease = {"lease_owner": "w", "lease_expires_at": timezone.now() + timedelta(seconds=60)}
    if allowed:
        transition(task.pk, to, actor=SYSTEM, kind=EventKind.RESUMED, **lease)
        task.refresh_from_db()
        assert task.status == to
        event = TaskEvent.objects.get(task=task)
        assert (event.from_status, event.to_status) == (current, to)
    else:
        with pytest.raises(TransitionNotAllowed):
            transition(task.pk, to, actor=SYSTEM, kind=EventKind.RESUMED, **lease)
        task.refresh_from_db()
        assert task.status == current
        assert not TaskEvent.objects.filter(task=task).exists()


@pytest.mark.django_db
def test_done_is_never_reachable_except_from_review():
    sources = [s for s, targets in TRANSITIONS.items() if TaskStatus.DONE in targets]
    assert sources == [TaskStatus.REVIEW]


@pytest.mark.django_db(transaction=True)
def test_set_status_refuses_outside_a_transaction():
    task = TaskFactory()
    with pytest.raises(RuntimeError):
        set_status(task, TaskStatus.PAUSED, actor=SYSTEM, kind=EventKind.PAUSED)


@pytest.mark.django_db
def test_leaving_a_held_state_clears_the_lease():
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    transition(task.pk, TaskStatus.REVIEW, actor=SYSTEM, kind=EventKind.SUBMITTED)
    task.refresh_from_db()
    assert task.lease_owner == "" and task.lease_expires_at is None


@pytest.mark.django_db
def test_the_database_refuses_a_held_task_without_a_lease():
    from django.db import IntegrityError

    task = TaskFactory()
    with pytest.raises(IntegrityError), transaction.atomic():
        Task.objects.filter(pk=task.pk).update(status=TaskStatus.IN_PROGRESS)


@pytest.mark.django_db
def test_events_are_append_only():
    from django.db import DatabaseError

    task = TaskFactory()
    transition(task.pk, TaskStatus.PAUSED, actor=SYSTEM, kind=EventKind.PAUSED)
    with pytest.raises(DatabaseError, match="append-only"), transaction.atomic():
        TaskEvent.objects.filter(task=task).update(kind=EventKind.CLOSED)


@pytest.mark.django_db
def test_claim_takes_the_highest_priority_then_oldest_and_records_the_run():
    low = TaskFactory(priority=0)
    high_old = TaskFactory(priority=5)
    TaskFactory(priority=5)
    claim = claim_next(worker_id="w1")
    assert claim.task_id == high_old.pk
    task = Task.objects.get(pk=high_old.pk)
    assert task.status == TaskStatus.IN_PROGRESS
    assert task.claim_count == 1 and task.lease_owner == "w1" and task.lease_expires_at
    run = AgentRun.objects.get(pk=claim.run_id)
    assert (run.number, run.claim_count, run.status) == (1, 1, RunStatus.STARTED)
    event = TaskEvent.objects.get(task=task, kind=EventKind.CLAIMED)
    assert event.data["run_id"] == run.pk and event.data["newest_run_id_before"] is None
    assert run.claim_event_id == event.pk
    assert low.pk != claim.task_id


@pytest.mark.django_db
def test_claim_skips_tasks_not_yet_due_and_blocked_dependencies():
    from datetime import timedelta

    from django.utils import timezone

    TaskFactory(not_before=timezone.now() + timedelta(minutes=5))
    dep = TaskFactory(status=TaskStatus.REVIEW)
    waiting = TaskFactory()
    waiting.dependency_links.create(depends_on=dep)
    assert claim_next(worker_id="w1") is None


@pytest.mark.django_db
def test_claim_records_the_newest_run_before_it():
    task = TaskFactory()
    first = claim_next(worker_id="w1")
    transition(task.pk, TaskStatus.READY, actor=SYSTEM, kind=EventKind.HANDED_BACK)
    AgentRun.objects.filter(pk=first.run_id).update(
        status=RunStatus.FAILED, finished_at=timezone.now()
    )
    second = claim_next(worker_id="w2")
    event = TaskEvent.objects.filter(task=task, kind=EventKind.CLAIMED).last()
    assert event.data["newest_run_id_before"] == first.run_id
    assert second.claim_count == 2


@pytest.mark.django_db(transaction=True)
def test_two_threads_racing_one_row_exactly_one_claims():
    TaskFactory()
    barrier = threading.Barrier(8)
    results = []

    def race(i):
        barrier.wait()
        try:
            results.append(claim_next(worker_id=f"w{i}"))
        finally:
            connection.close()

    threads = [threading.Thread(target=race, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len([r for r in results if r]) == 1
    assert TaskEvent.objects.filter(kind=EventKind.CLAIMED).count() == 1


@pytest.mark.django_db(transaction=True)
def test_two_threads_racing_the_same_transition_exactly_one_wins():
    task = TaskFactory(status=TaskStatus.REVIEW)
    user = UserFactory(username="closer", is_superuser=True)
    barrier = threading.Barrier(4)
    outcomes = []

    def close():
        from agents.actions.task import task_close

        barrier.wait()
        try:
            task_close(actor=Actor.person(user), task_id=task.pk)
            outcomes.append("won")
        except TransitionNotAllowed:
            outcomes.append("refused")
        finally:
            connection.close()

    threads = [threading.Thread(target=close) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(outcomes) == ["refused", "refused", "refused", "won"]
    assert TaskEvent.objects.filter(task=task, kind=EventKind.CLOSED).count() == 1


@pytest.mark.django_db
def test_holds_attempt_and_the_fence():
    task = TaskFactory()
    claim = claim_next(worker_id="w1")
    with fenced(claim.run_id, task.pk) as locked:
        assert locked.pk == task.pk
    assert renew_lease(task_id=task.pk, run_id=claim.run_id) == TaskStatus.IN_PROGRESS


@pytest.mark.django_db
def test_aba_the_old_run_is_fenced_out_after_cancel_and_a_new_claim(actor):
    """Claim, a person resets the task, it is claimed again: the first run can write nothing."""
    from agents.actions.task import task_cancel

    task = TaskFactory()
    old = claim_next(worker_id="w1")
    # The person's cancel ends the run; simulate the requeue of a reused row to reach ABA.
    task_cancel(actor=actor, task_id=task.pk)
    with transaction.atomic():
        locked = lock_task(task.pk)
        Task.objects.filter(pk=task.pk).update(status=TaskStatus.READY)  # test-only reset
        locked.refresh_from_db()
    new = claim_next(worker_id="w2")
    assert new.task_id == task.pk and new.claim_count == 2
    with pytest.raises(AttemptLost), fenced(old.run_id, task.pk):
        pass
    with fenced(new.run_id, task.pk):
        pass


@pytest.mark.django_db
def test_a_persons_action_after_the_claim_fences_but_a_pause_request_does_not(actor):
    from agents.actions.task import task_pause, task_withdraw_pause

    task = TaskFactory()
    claim = claim_next(worker_id="w1")
    task_pause(actor=actor, task_id=task.pk)
    task_withdraw_pause(actor=actor, task_id=task.pk)
    with transaction.atomic():
        assert holds_attempt(lock_task(task.pk), claim.run_id)
    # Any other person's event after the claim fences the run out.
    with transaction.atomic():
        from tasks.transitions import record_event

        record_event(lock_task(task.pk), actor=actor, kind=EventKind.LIMITS_CHANGED)
    with transaction.atomic():
        assert not holds_attempt(lock_task(task.pk), claim.run_id)


@pytest.mark.django_db
def test_the_database_refuses_a_decreasing_claim_counter():
    from django.db import DatabaseError

    task = TaskFactory()
    claim_next(worker_id="w")
    with pytest.raises(DatabaseError, match="never decreases"), transaction.atomic():
        Task.objects.filter(pk=task.pk).update(claim_count=0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("action", ["event", "cancel"])
def test_the_fence_sees_a_persons_action_committed_while_it_waited_for_the_lock(actor, action):
    """The one-statement fence re-checks the task row after its lock wait (docs/worker.md): a
    person's action that commits while the worker's statement waits for the row fences it out —
    an event that leaves the status alone as well as a cancel."""
    from agents.actions.task import task_cancel
    from tasks.transitions import record_event
    from tests.agents.scripted import waits_for_a_lock

    task = TaskFactory()
    claim = claim_next(worker_id="w1")
    holding = threading.Event()
    errors = []

    def person():
        try:
            with transaction.atomic():
                locked = lock_task(task.pk)
                holding.set()
                if not waits_for_a_lock():
                    errors.append("the fence never waited for the lock")
                if action == "event":
                    record_event(locked, actor=actor, kind=EventKind.LIMITS_CHANGED)
                else:
                    task_cancel(actor=actor, task_id=task.pk)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connection.close()

    thread = threading.Thread(target=person)
    thread.start()
    assert holding.wait(10)
    with pytest.raises(AttemptLost):
        renew_lease(task_id=task.pk, run_id=claim.run_id)
    thread.join(10)
    assert not errors, errors
