"""Opt-in policies that may move a task without a person. There is exactly one.

`AUTO_CLOSE_GOAL_NO_WORK` (setting ACTHELM_AUTO_CLOSE_GOAL_NO_WORK, off by default): a planning task
that the reconciler created, whose run the supervisor approved, that produced at least one linked
follow-up task and ran nothing but the planning tools and read-only tools, goes from `review` to
`done` with an event naming the policy. Every other task waits in `review` for a person — a task
a person ever accepted over the supervisor (`accepted` event) included. This is the only path to
`done` that no person takes.
"""

import logging

from django.conf import settings
from django.db import connection

from agents.models import AgentRun, ToolCall
from agents.states import Verdict
from core.actors import Actor
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskKind, TaskOrigin, TaskStatus
from tasks.transitions import promote_dependants, set_status

log = logging.getLogger("acthelm.tasks")

AUTO_CLOSE_GOAL_NO_WORK = "AUTO_CLOSE_GOAL_NO_WORK"


def may_auto_close(task: Task) -> bool:
    """Whether the policy could close `task` once in review, by what the task itself says (the
    setting, its kind, its origin); the rest is read when it is."""
    return bool(
        settings.ACTHELM_AUTO_CLOSE_GOAL_NO_WORK
        and task.kind == TaskKind.PLANNING
        and task.origin == TaskOrigin.RECONCILER
    )


def auto_close_if_allowed(task: Task, run: AgentRun | None, *, actor: Actor) -> bool:
    """Close `task` by policy if every condition holds; else change nothing and return False.

    The caller (the worker) has just moved `task` to review in this transaction, holds its row
    lock, and passes the run whose verdict put it there.
    """
    if not connection.in_atomic_block:
        raise RuntimeError("auto_close_if_allowed must run inside the transaction that locked it")
    if not (
        may_auto_close(task)
        and task.status == TaskStatus.REVIEW
        and run is not None
        and run.task_id == task.pk
        and run.verdict == Verdict.APPROVED
    ):
        return False
    # Low-risk and internal: it planned, proposed and read. A planning task holds the default
    # tools its follow-ups may inherit; one that used them to write or fetch waits for a person.
    acted = (
        ToolCall.objects.filter(task_id=task.pk, run_count__gt=0)
        .exclude(tool__in=("update_plan", "propose_task"))
        .exclude(recovery_class="read_only")
    )
    if acted.exists():
        return False
    if TaskEvent.objects.filter(task_id=task.pk, kind=EventKind.ACCEPTED).exists():
        return False  # a person took this task over the supervisor: a person closes it
    follow_ups = list(
        Task.objects.filter(spawned_by=task).order_by("id").values_list("id", flat=True)
    )
    if not follow_ups:
        return False
    set_status(
        task,
        TaskStatus.DONE,
        actor=actor,
        kind=EventKind.AUTO_CLOSED,
        run=run,
        data={"policy": AUTO_CLOSE_GOAL_NO_WORK, "follow_ups": follow_ups},
    )
    promoted = promote_dependants(task, actor=actor)
    log.info(
        "task.auto_closed",
        extra={
            "task_id": task.pk,
            "run_id": run.pk,
            "policy": AUTO_CLOSE_GOAL_NO_WORK,
            "follow_ups": follow_ups,
            "promoted": promoted,
        },
    )
    return True
