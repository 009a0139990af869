"""The reconciler: one idempotent pass that keeps goals moving.

(a) Promotes every blocked task whose dependencies are all done. Closing a task promotes its
    dependants in the same transaction; this pass is the safety net that makes a missed promotion
    impossible.
(b) Gives every active goal without open work one low-risk internal planning task (tools
    `update_plan` and `propose_task`, plus the default tools its follow-ups may inherit), whose
    follow-ups become the goal's next work.

Safe to run from many processes at once: a promotion locks the task and re-checks it, and the
planning task is created under the goal's row lock after re-checking that the goal is still idle,
so concurrent passes create at most one planning task per goal.
"""

import logging
from dataclasses import asdict, dataclass, field
from typing import Any, TypedDict

from django.conf import settings
from django.db import transaction
from django.db.models import Exists, OuterRef, QuerySet

from agents.catalogue.connections import best_zero_cost_model, usable_models
from agents.engine.run.intake import task_create
from agents.models import Model
from core.actors import Actor
from tasks.models import Goal, Task, TaskDependency
from tasks.states import OPEN, EventKind, TaskKind, TaskOrigin, TaskStatus
from tasks.transitions import set_status

log = logging.getLogger("acthelm.reconciler")

PLANNING_TOOLS = ["update_plan", "propose_task"]


def planning_tools() -> list[str]:
    """A planning task's tools: the planning tools plus the server's default tools.

    A follow-up gets at most its planning task's tools (see `follow_up_permissions`), so the
    planning task holds the defaults it may hand on, as any task a person creates would.
    """
    return list(dict.fromkeys([*PLANNING_TOOLS, *settings.ACTHELM_DEFAULT_TOOLS]))


# How many of the goal's latest tasks the planning instruction lists, so the planner sees what
# was done already.
RECENT_TASKS_SHOWN = 10


class Planned(TypedDict):
    goal_id: int
    task_id: int


class Skipped(TypedDict):
    goal_id: int
    reason: str


@dataclass
class ReconcileReport:
    promoted: list[int] = field(default_factory=list)
    # One for each planning task created.
    planned: list[Planned] = field(default_factory=list)
    # One for each idle goal that got no planning task.
    skipped: list[Skipped] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def summary(self) -> str:
        lines = [
            f"promoted {len(self.promoted)} task(s)"
            + (f": {', '.join(f'#{i}' for i in self.promoted)}" if self.promoted else ""),
            f"created {len(self.planned)} planning task(s)"
            + (
                ": " + ", ".join(f"#{p['task_id']} for goal {p['goal_id']}" for p in self.planned)
                if self.planned
                else ""
            ),
        ]
        lines += [f"goal {s['goal_id']} skipped: {s['reason']}" for s in self.skipped]
        return "\n".join(lines)


def reconcile(*, actor: Actor | None = None) -> ReconcileReport:
    """One pass: promote unblocked tasks, then plan for idle goals."""
    actor = actor or Actor.system("reconciler")
    report = ReconcileReport()
    report.promoted = promote_unblocked(actor=actor)
    for goal_id in idle_goal_ids():
        _plan_goal(goal_id, actor=actor, report=report)
    log.info(
        "reconciler.pass",
        extra={
            "promoted": len(report.promoted),
            "planned": len(report.planned),
            "skipped": len(report.skipped),
        },
    )
    return report


# --- (a) promotion -------------------------------------------------------------------------------


def _unfinished_dependency() -> QuerySet[TaskDependency]:
    return TaskDependency.objects.filter(task=OuterRef("pk")).exclude(
        depends_on__status=TaskStatus.DONE
    )


def promote_unblocked(*, actor: Actor) -> list[int]:
    """Every blocked task whose dependencies are all done becomes ready (one transaction each)."""
    candidates = list(
        Task.objects.filter(status=TaskStatus.BLOCKED)
        .filter(~Exists(_unfinished_dependency()))
        .order_by("id")
        .values_list("id", flat=True)
    )
    promoted: list[int] = []
    for task_id in candidates:
        with transaction.atomic():
            # Another pass (or the close that finished the last dependency) may hold it: skip.
            task = (
                Task.objects.select_for_update(skip_locked=True)
                .filter(pk=task_id, status=TaskStatus.BLOCKED)
                .filter(~Exists(_unfinished_dependency()))
                .first()
            )
            if task is None:
                continue
            set_status(
                task,
                TaskStatus.READY,
                actor=actor,
                kind=EventKind.PROMOTED,
                data={"by": "reconciler"},
            )
            promoted.append(task.pk)
    return promoted


# --- (b) planning --------------------------------------------------------------------------------


def _open_work() -> QuerySet[Task]:
    return Task.objects.filter(goal=OuterRef("pk"), status__in=OPEN)


def idle_goal_ids() -> list[int]:
    """Active goals with no task in an open state."""
    return list(
        Goal.objects.filter(active=True)
        .filter(~Exists(_open_work()))
        .order_by("id")
        .values_list("id", flat=True)
    )


def choose_model(goal: Goal) -> Model | None:
    """The model of the goal's most recent task that has a usable one (tested, tool-calling, on
    an enabled connection); else the highest-priority zero-cost connection's tested model."""
    recent = (
        Task.objects.filter(goal=goal, model__isnull=False)
        .order_by("-id")
        .values_list("model_id", flat=True)
        .first()
    )
    if recent is not None:
        model = usable_models().filter(pk=recent).first()
        if model is not None:
            return model
    return best_zero_cost_model()


def _settled_last_round(goal: Goal) -> str | None:
    """Why the goal should not be planned again although it is idle, or None.

    The goal's newest task is a reconciler planning task that a person cancelled, or that was
    closed without proposing anything: planning again would only repeat it. A person restarts the
    goal by adding a task (once that task is done, the goal is planned again)."""
    last = Task.objects.filter(goal=goal).order_by("-id").first()
    if last is None or last.kind != TaskKind.PLANNING or last.origin != TaskOrigin.RECONCILER:
        return None
    if last.status == TaskStatus.CANCELLED:
        return f"its last planning task #{last.pk} was cancelled"
    if last.status == TaskStatus.DONE and not Task.objects.filter(spawned_by=last).exists():
        return f"its last planning task #{last.pk} proposed no follow-up work"
    return None


def planning_instruction(goal: Goal) -> str:
    parts = [f"Plan the next work for this goal: {goal.title}"]
    if goal.description.strip():
        parts.append(goal.description.strip())
    recent = list(
        Task.objects.filter(goal=goal)
        .order_by("-id")
        .values_list("id", "title", "status")[:RECENT_TASKS_SHOWN]
    )
    if recent:
        parts.append(
            "The goal's most recent tasks:\n"
            + "\n".join(f"- #{pk} {title} ({status})" for pk, title, status in recent)
        )
    parts.append(
        "Propose follow-up tasks with propose_task: small, concrete, each with a clear "
        "instruction, naming in depends_on_titles the proposed tasks it must wait for. "
        "Propose nothing if the goal needs no more work, and say so in your final answer."
    )
    return "\n\n".join(parts)


def _plan_goal(goal_id: int, *, actor: Actor, report: ReconcileReport) -> None:
    with transaction.atomic():
        # The goal's row lock serialises concurrent passes; the re-check under it sees the
        # planning task a pass that held the lock before us has committed.
        goal = Goal.objects.select_for_update().filter(pk=goal_id, active=True).first()
        if goal is None or Task.objects.filter(goal=goal, status__in=OPEN).exists():
            return
        reason = _settled_last_round(goal)
        model = None
        if reason is None:
            model = choose_model(goal)
            if model is None:
                reason = "no tested, tool-calling model on an enabled connection"
        if reason is not None:
            report.skipped.append({"goal_id": goal.pk, "reason": reason})
            log.debug("reconciler.goal_skipped", extra={"goal_id": goal.pk, "reason": reason})
            return
        assert model is not None  # chosen, since there was no reason to skip the goal
        task = task_create(
            actor=actor,
            title=f"Plan the next work: {goal.title}"[:200],
            instruction=planning_instruction(goal),
            goal=goal,
            kind=TaskKind.PLANNING,
            origin=TaskOrigin.RECONCILER,
            tools=planning_tools(),
            connection=model.connection,
            model=model,
        )
    report.planned.append({"goal_id": goal_id, "task_id": task.pk})
    log.info(
        "reconciler.planning_created",
        extra={"goal_id": goal_id, "task_id": task.pk, "model": str(model)},
    )
