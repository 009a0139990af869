"""The worker's maintenance loop runs what apps registered: a real `acthelm_worker` process
creates a schedule's task at its slot (the schedules' tick), runs it on the scripted model CLI,
and the task waits in review for a person: a schedule closes nothing."""

from datetime import timedelta

import pytest
from django.utils import timezone

from agents.engine.runtime.maintenance import _HOOKS, register_maintenance, run_maintenance
from core.actors import Actor
from schedules.models import ScheduleSlot
from schedules.services import schedule_create
from schedules.states import SlotOutcome
from tasks.models import Task, TaskEvent
from tasks.states import TaskStatus
from tests.agents.conftest import wait_for
from tests.factories import UserFactory

pytestmark = pytest.mark.django_db(transaction=True)


def test_a_worker_creates_a_schedules_task_at_its_slot_and_it_reaches_review_not_done(
    cli_model, spawn_worker
):
    model = cli_model("--mode", "text", "--text", "The digest: three tickets, all answered.")
    person = UserFactory(username="planner", is_superuser=True)
    schedule = schedule_create(
        actor=Actor.person(person),
        now=timezone.now() - timedelta(minutes=2),
        name="digest",
        cron="* * * * *",
        title="Support digest",
        instruction="Summarise yesterday's support tickets.",
        model=model,
        tools=[],
    )
    worker = spawn_worker(worker_id="sched", env={"ACTHELM_RECONCILE_INTERVAL_SECONDS": "0.5"})
    slot = wait_for(
        lambda: (
            ScheduleSlot.objects.filter(schedule=schedule, outcome=SlotOutcome.CREATED)
            .select_related("task")
            .first()
        ),
        timeout=30,
        message="the worker's tick creates the slot's task",
    )
    task = slot.task
    wait_for(
        lambda: Task.objects.get(pk=task.pk).status == TaskStatus.REVIEW,
        timeout=60,
        message="the scheduled task reaches review",
    )
    worker.terminate()
    worker.wait(30)
    task.refresh_from_db()
    assert task.status == TaskStatus.REVIEW
    assert not TaskEvent.objects.filter(task=task, to_status=TaskStatus.DONE).exists()
    assert Task.objects.count() == 1
    assert TaskEvent.objects.get(task=task, kind="created").actor_label == f"schedule:{schedule.pk}"


def test_one_failing_hook_does_not_stop_the_others(db):
    ran: list[str] = []

    def broken() -> None:
        raise RuntimeError("boom")

    saved = dict(_HOOKS)
    try:
        register_maintenance("broken", broken)
        register_maintenance("fine", lambda: ran.append("fine"))
        run_maintenance()
    finally:
        _HOOKS.clear()
        _HOOKS.update(saved)
    assert ran == ["fine"]
    assert "schedules" in saved  # registered by the schedules app when it is ready
