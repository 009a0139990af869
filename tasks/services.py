"""What a person's actions on a task need of the ledger itself, below the engine: a new task's
default limits and the check of limits given (`validate_limits`), the first step of every action
(`act`: the person may, the task's status allows it, under the task's row lock), and what a
task's end means for the tasks blocked on it (`note_stuck_dependants`, which the run's outcome
calls too). The actions themselves are `agents.actions.task`, `agents.actions.task_change` and
`agents.actions.goal`; the status is written by `tasks.transitions`."""

from collections.abc import Mapping
from decimal import Decimal

from django.conf import settings

from core.actors import Actor
from core.exceptions import (
    InvalidInput,
    TransitionNotAllowed,
)
from core.numbers import INT32_MAX, whole_number
from tasks.limits import (
    BY_FIELD,
    LIMITS,
    BadLimit,
    LimitValues,
    money_amount,
)
from tasks.models import Task
from tasks.permissions import OPERATE_TASK
from tasks.states import (
    EventKind,
    TaskStatus,
    allowed_actions,
)
from tasks.transitions import (
    lock_task,
    record_event,
)


def default_limits() -> LimitValues:
    """The limits a new task gets: each limit's setting (`tasks.limits.LIMITS`)."""
    return {
        limit.field: money_limit(limit.field, value) if limit.money else int(value)
        for limit in LIMITS
        for value in [getattr(settings, limit.setting)]
    }


def money_limit(field: str, value: object) -> Decimal | None:
    """A money limit as stored (empty: no limit); InvalidInput when it is not an amount."""
    try:
        return money_amount(field, value)
    except BadLimit as exc:
        raise InvalidInput(str(exc), field="limits") from None


def validate_limits(limits: Mapping[str, object]) -> LimitValues:
    clean: LimitValues = {}
    for field, value in limits.items():
        limit = BY_FIELD.get(field)
        if limit is None:
            raise InvalidInput(f"unknown limit {field!r}", field="limits")
        if limit.money:
            clean[field] = money_limit(field, value)
        else:
            clean[field] = whole_number(value, name=field, minimum=1, maximum=INT32_MAX)
    return clean


def act(task_id: int, action: str, actor: Actor, perm: str = OPERATE_TASK) -> Task:
    actor.require(perm)
    task = lock_task(task_id)

    if action not in allowed_actions(task.status):
        raise TransitionNotAllowed(f"task {task_id} is {task.status}; {action} is not possible")
    return task


def note_stuck_dependants(task: Task, *, actor: Actor) -> list[int]:
    """`task` was cancelled or failed: each blocked dependant stays blocked, and its timeline says
    why. Called in the transaction that moved `task` (`task_cancel`; the worker when it fails a
    task). Returns the dependants noted."""
    noted = []
    for dependant in Task.objects.filter(
        dependency_links__depends_on=task, status=TaskStatus.BLOCKED
    ).order_by("id"):
        record_event(
            dependant,
            actor=actor,
            kind=EventKind.UNBLOCK_BLOCKED,
            data={"dependency": task.pk, "dependency_status": task.status},
        )
        noted.append(dependant.pk)
    return noted
