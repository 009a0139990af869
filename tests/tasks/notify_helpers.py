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
