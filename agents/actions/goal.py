"""A person's actions on a goal, whichever door they come through (the console, the admin, the
API, the CLI, a schedule): create one with the acceptance checks of the work planned for it, and
deactivate it. Each checks first (`check_goal`, the checks' kinds, the permission), then writes.
The reconciler (`agents.engine.runtime.reconciler`) plans an active goal while it has no open
work."""

import logging
from collections.abc import Mapping, Sequence

from django.db import transaction

from agents.engine.verdict.acceptance import validate_checks
from core.actors import Actor
from core.exceptions import GoalNotFound, InvalidInput, TransitionNotAllowed
from tasks.models import Goal
from tasks.permissions import ADD_GOAL, CHANGE_GOAL

log = logging.getLogger("acthelm.tasks")

#: A goal's title, as the column holds it.
TITLE_MAX_CHARS = 200


def check_goal(title: str, description: str = "") -> tuple[str, str]:
    """A goal's title and description as stored (stripped); InvalidInput naming the problem."""
    title, description = (title or "").strip(), (description or "").strip()
    if not title:
        raise InvalidInput("a goal needs a title", field="title")
    if len(title) > TITLE_MAX_CHARS:
        raise InvalidInput(f"a title is at most {TITLE_MAX_CHARS} characters", field="title")
    return title, description


def goal_create(
    *,
    actor: Actor,
    title: str,
    description: str = "",
    acceptance_checks: Sequence[str | Mapping[str, object]] | None = None,
) -> Goal:
    """A new active goal; the reconciler plans it at its next pass while it has no open work.

    With the acceptance checks of the work planned for it (``KIND=VALUE`` texts or
    ``{"kind", "value"}`` objects, refused with `acceptance_check_invalid`, field
    `acceptance_checks`). The goal has no tool list, so `tool_ran` is not checked against one:
    each task that gets the goal's checks drops those for tools it lacks (`meetable_checks`)."""
    checks = validate_checks(acceptance_checks, tools=None)
    actor.require(ADD_GOAL)
    title, description = check_goal(title, description)
    goal = Goal.objects.create(
        title=title,
        description=description,
        acceptance_checks=checks,
        created_by=actor.user if actor.is_person else None,
    )
    log.info("goal.created", extra={"goal_id": goal.pk, "actor": actor.label})
    return goal


def goal_deactivate(*, actor: Actor, goal_id: int) -> Goal:
    """The reconciler stops planning the goal. Its tasks keep their states: a person cancels
    or closes them one by one."""
    actor.require(CHANGE_GOAL)
    with transaction.atomic():
        goal = Goal.objects.select_for_update().filter(pk=goal_id).first()
        if goal is None:
            raise GoalNotFound(f"goal {goal_id} does not exist")
        if not goal.active:
            raise TransitionNotAllowed(f"goal {goal_id} is already inactive")
        goal.active = False
        goal.save(update_fields=["active"])
    log.info("goal.deactivated", extra={"goal_id": goal_id, "actor": actor.label})
    return goal
