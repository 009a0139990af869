"""Shared set-up for the notification tests: a task that enters a waiting state for real."""

from core.actors import Actor
from tasks.models import Task
from tasks.states import EventKind, TaskStatus
from tasks.transitions import transition
from tests.factories import TaskFactory


def failed_task(title: str = "Quarterly report", code: str = "limit_steps") -> Task:
    """A held task that the real transition function moves to failed (and so notifies)."""
    task = TaskFactory(status=TaskStatus.IN_PROGRESS, title=title)
    return transition(
        task.pk,
        TaskStatus.FAILED,
        actor=Actor.worker("w"),
        kind=EventKind.FAILED,
        data={"code": code, "message": "the turn limit was reached"},
        failure_code=code,
        failure_message="the turn limit was reached",
    )


def approval_notified(url: str = "https://example.org/q3.txt"):
    """A task that the real transition function moves to awaiting_approval of one fetch_url call
    (so each target that wants the event gets a row with the approval's decision link)."""
    from django.db import transaction

    from tasks.transitions import lock_task, set_status
    from tests.console.scenes import pending_approval

    task = TaskFactory(
        status=TaskStatus.IN_PROGRESS,
        title="Fetch the quarterly report",
        instruction="Fetch the report and summarise it.",
        tools=["update_plan", "fetch_url"],
    )
    approval = pending_approval(url=url, task=task)
    with transaction.atomic():
        set_status(
            lock_task(task.pk),
            TaskStatus.AWAITING_APPROVAL,
            actor=Actor.worker("w"),
            kind=EventKind.APPROVAL_REQUESTED,
        )
    return approval
