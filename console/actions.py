"""Every action a person takes from the console, declared once.

An entry says what the action is called, who may take it, which service it calls, what it asks
for first, how its button looks and what it asks to confirm. From these entries come: the console's
POST view and URL for each (`tasks:<name>` for a task's actions, `approvals:<name>` for a decision
on one operation), the task page's buttons, the admin's actions, `acthelm_task`'s subcommands and
the API's permission checks. The states an action applies to are the state machine's
(`tasks.states.ACTIONS`), which the services check too.

To add an action: its value in `tasks.states.Action` and the states that allow it in
`tasks.states.ACTIONS`; its service; one entry here (see docs/architecture.md).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from agents.actions import decisions
from agents.actions import task as person_task
from approvals.models import Approval, ReviewDecision
from approvals.permissions import DECIDE_APPROVAL
from core.actors import Actor
from tasks.models import Task
from tasks.permissions import CLOSE_TASK, OPERATE_TASK
from tasks.states import ACTIONS, Action


@dataclass(frozen=True)
class Input:
    """Something an action asks for before it runs, passed to its service by `name`.

    kind "text": a form field and a `--name` option of the CLI; "json": the same, holding a JSON
    object the service parses (an approval's edited arguments); "model": another model to
    continue on (the console shows its checks first; the CLI takes --connection/--model);
    "raised_limit": a new value for the limit a task stopped at (the console's retry form).
    """

    name: str
    kind: str = "text"
    required: bool = False
    help: str = ""
    # What the admin's bulk action passes; a required input without one is asked for on a page
    # of its own first (console.admin).
    admin_default: str | None = None


@dataclass(frozen=True)
class ConsoleAction:
    name: Action
    perm: str
    # The service: called with actor=, the target's id (task_id=, approval_id= or decision_id=)
    # and the inputs by name; decisions also get arguments_hash=. It returns the task (None once
    # deleted) or the decided Approval or ReviewDecision.
    service: Callable[..., Task | Approval | ReviewDecision | None]
    # "task": the task-wide actions; "approval" / "review": a decision on one operation.
    target: str = "task"
    inputs: tuple[Input, ...] = ()
    success: str = ""  # the console's message once done; {pk} is the task's id
    confirm: str = ""  # the browser asks this before posting; {pk} is the task's id
    style: str = ""  # the button's class: "" | "primary" | "danger"
    # A form template shown instead of a plain button, for actions that ask for input first.
    form: str = ""
    # The admin's bulk action ("" = none), and whether it is offered only where every row is in a
    # state that allows it (the change list filtered to such a state, or such a task's page).
    admin: str = ""
    admin_done: str = ""  # its message: "Closed: 3 task(s)."
    admin_in_state_only: bool = False
    cli_help: str = ""

    @property
    def label(self) -> str:
        return self.name.label

    @property
    def states(self) -> frozenset[str]:
        """The task states in which this action is possible (from the state machine)."""
        return frozenset(state for state, allowed in ACTIONS.items() if self.name in allowed)

    @property
    def slug(self) -> str:
        """Its URL segment and CLI subcommand: withdraw_pause -> withdraw-pause."""
        return str(self.name).replace("_", "-")

    @property
    def url_name(self) -> str:
        return f"tasks:{self.name}" if self.target == "task" else f"approvals:{self.name}"

    @property
    def admin_name(self) -> str:
        return f"{self.name}_tasks"

    def page_texts(self, task_id: int) -> dict[str, str]:
        """What its button shows on a task's page."""
        return {"confirm": self.confirm.format(pk=task_id), "style": self.style}

    # Any: which of the service's results it is follows from `target`, which every caller knows
    # (a task's action gives the task or None, a decision its Approval or ReviewDecision).
    def call(self, *, actor: Actor, target_id: int, **inputs: object) -> Any:
        return self.service(actor=actor, **{_TARGET_ID[self.target]: target_id}, **inputs)


# The keyword under which each kind of target's id reaches the service.
_TARGET_ID = {"task": "task_id", "approval": "approval_id", "review": "decision_id"}

A = Action
MODEL = Input("model", kind="model", help="continue on this model")

REGISTRY: dict[str, ConsoleAction] = {
    entry.name: entry
    for entry in (
        # The task-wide actions, in the order of their buttons.
        ConsoleAction(
            A.PAUSE,
            OPERATE_TASK,
            person_task.task_pause,
            success="Pause requested.",
            admin="Pause",
            admin_done="Paused",
            cli_help="pause (a running task stops at its next safe point)",
        ),
        ConsoleAction(
            A.WITHDRAW_PAUSE,
            OPERATE_TASK,
            person_task.task_withdraw_pause,
            success="Pause withdrawn: the worker carries on.",
            cli_help="withdraw a pause request the worker has not reached yet",
        ),
        ConsoleAction(
            A.RESUME,
            OPERATE_TASK,
            person_task.task_resume,
            inputs=(MODEL,),
            success="Task resumed: it is queued.",
            style="primary",
            form="console/actions/_resume.html",
            admin="Resume",
            admin_done="Resumed",
            cli_help="queue a paused task again",
        ),
        ConsoleAction(
            A.RETRY,
            OPERATE_TASK,
            person_task.task_retry,
            inputs=(MODEL, Input("raised_limit", kind="raised_limit")),
            success="Task queued again from its last checkpoint.",
            style="primary",
            form="console/actions/_retry.html",
            admin="Retry from the last checkpoint",
            admin_done="Queued again",
            cli_help="queue a failed task again from its checkpoint",
        ),
        ConsoleAction(
            A.CLOSE,
            CLOSE_TASK,
            person_task.task_close,
            success="Task closed: done.",
            style="primary",
            admin="Close (review → done)",
            admin_done="Closed",
            admin_in_state_only=True,
            cli_help="close a task in review: done",
        ),
        ConsoleAction(
            A.ACCEPT,
            CLOSE_TASK,
            person_task.task_accept,
            inputs=(
                Input(
                    "reason",
                    required=True,
                    help="why the rejected result is good enough (shown on the timeline)",
                ),
            ),
            success="Accepted into review over the supervisor's rejection.",
            style="primary",
            form="console/actions/_accept.html",
            admin="Accept the rejected run into review (asks why)",
            admin_done="Accepted into review",
            cli_help="accept the run the supervisor rejected into review, with a reason",
        ),
        ConsoleAction(
            A.REOPEN,
            CLOSE_TASK,
            person_task.task_reopen,
            inputs=(
                Input(
                    "feedback",
                    required=True,
                    help="what the next attempt should change",
                    admin_default="Reopened from the admin for rework.",
                ),
            ),
            success="Task reopened with your feedback; it is queued again.",
            form="console/actions/_reopen.html",
            admin="Reopen with feedback",
            admin_done="Reopened",
            admin_in_state_only=True,
            cli_help="send a task in review back with feedback",
        ),
        ConsoleAction(
            A.CANCEL,
            OPERATE_TASK,
            person_task.task_cancel,
            inputs=(
                Input("reason", help="why (on the timeline, and on the approvals it settles)"),
            ),
            success="Task cancelled: no further step starts.",
            confirm="Cancel task #{pk}? No further step starts and it cannot be resumed.",
            style="danger",
            form="console/actions/_cancel.html",
            admin="Cancel",
            admin_done="Cancelled",
            cli_help="cancel: no further step starts",
        ),
        ConsoleAction(
            A.DELETE,
            OPERATE_TASK,
            person_task.task_delete,
            success="Task #{pk} deleted.",
            confirm="Delete task #{pk} with its transcript, events and files?",
            style="danger",
            cli_help="delete a done, failed or cancelled task with its files",
        ),
        # Decisions on one operation, bound to its arguments' hash.
        ConsoleAction(
            A.APPROVE,
            DECIDE_APPROVAL,
            decisions.approval_approve,
            target="approval",
            inputs=(
                Input(
                    "arguments",
                    kind="json",
                    help="let these arguments (a JSON object) run instead of the proposed ones; "
                    "checked as the model's are, and the new hash is printed",
                ),
            ),
            success="Approved",
            style="primary",
            cli_help="let the operation run (as proposed, or with --arguments)",
        ),
        ConsoleAction(
            A.DENY,
            DECIDE_APPROVAL,
            decisions.approval_deny,
            target="approval",
            inputs=(
                Input(
                    "message",
                    help="why, for the model: it receives 'denied by a person: MESSAGE' as the "
                    "call's result",
                ),
            ),
            success="Denied",
            style="danger",
            cli_help="refuse the operation; the model is told it was denied (and --message)",
        ),
        ConsoleAction(
            A.RUN_AGAIN,
            DECIDE_APPROVAL,
            decisions.review_run_again,
            target="review",
            success="Run again",
            cli_help="run an operation of unknown outcome again",
        ),
        ConsoleAction(
            A.SKIP,
            DECIDE_APPROVAL,
            decisions.review_skip,
            target="review",
            success="Skipped",
            cli_help="tell the model the outcome is unknown; it does not run again",
        ),
    )
}

# What the API and the console check before an action (one permission each).
ACTION_PERMS: dict[str, str] = {name: entry.perm for name, entry in REGISTRY.items()}


def task_actions() -> list[ConsoleAction]:
    return [entry for entry in REGISTRY.values() if entry.target == "task"]


def decision_actions(target: str) -> list[ConsoleAction]:
    """The decisions on an approval ("approval") or on a needs_review operation ("review")."""
    return [entry for entry in REGISTRY.values() if entry.target == target]


def decision_buttons() -> dict[str, list[ConsoleAction]]:
    """The buttons of a pending approval and of a needs_review operation, in their order."""
    return {target: decision_actions(target) for target in ("approval", "review")}


def by_slug(slug: str) -> ConsoleAction:
    """The entry of a URL segment or CLI subcommand: withdraw-pause -> withdraw_pause."""
    return REGISTRY[slug.replace("-", "_")]
