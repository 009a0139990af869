"""A person's actions on a task, whichever door they come through (the console's pages and the
admin, the API, the CLI, schedules): created with its input files or by names, paused, resumed on
another model, cancelled, closed, reopened, retried (with what remains of its limits, or now),
its limits changed, a rejected run accepted into review over the supervisor, deleted. A change to
a task (and its retry) is `agents.actions.task_change`; a goal's actions `agents.actions.goal`;
a decision on one operation `agents.actions.decisions`.

Each action checks first (a `check_*` function, or `act`: the person may, the task's status
allows it; the clear error is raised before anything is written), then makes its change in one
transaction under the task's row lock with its `TaskEvent`; the status moves only through
`tasks.transitions`. A task itself enters by `agents.engine.run.intake.task_create`, the one path
by which a task enters, whoever creates it. A cancel reaches the runs (the run's store) and the
open decisions (`approvals.services`) by direct calls in its own transaction."""

import logging
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.files import File
from django.db import transaction
from django.db.models import Q

from agents.catalogue.connections import model_check_for_task
from agents.engine.run.intake import task_create
from agents.engine.run.usage import exhausted_limits
from agents.engine.store import settle_for_cancelled_task as settle_runs_for_cancel
from agents.models import Connection, Model
from agents.selectors import last_rejection
from agents.states import FailureCode
from approvals.services import settle_for_cancelled_task as settle_decisions_for_cancel
from core.actors import Actor
from core.exceptions import (
    InvalidInput,
    LimitNotRaised,
    TransitionNotAllowed,
)
from tasks.limits import (
    limit_for_failure,
)
from tasks.models import Goal, Task
from tasks.permissions import CLOSE_TASK, OPERATE_TASK
from tasks.services import act, note_stuck_dependants, validate_limits
from tasks.states import (
    DELETABLE,
    EventKind,
    TaskStatus,
)
from tasks.transitions import (
    lock_task,
    notify_ready,
    promote_dependants,
    record_event,
    set_status,
)
from tasks.workspace import add_input_file, remove_task_files, safe_file_name

log = logging.getLogger("acthelm.tasks")

#: An input file's content: bytes or text, an uploaded file, or a file on disk to copy.
type InputData = bytes | str | File[bytes] | Path


def task_create_with_files(
    *, actor: Actor, files: Sequence[tuple[str, InputData]] = (), **fields: Any
) -> Task:
    """task_create plus input files copied into the task's workspace: (name, data) pairs where
    data is bytes, an uploaded file or a Path. The files are in the workspace before the task
    commits, so no worker can claim it and find its folder empty; if anything fails, neither the
    task nor its files remain."""
    names = set()
    for name, _data in files:
        try:
            name = safe_file_name(name)
        except InvalidInput as exc:
            raise InvalidInput(exc.message, field="files") from None
        if name in names:
            raise InvalidInput(f"two files are named {name}", field="files")
        names.add(name)
    task = None
    try:
        with transaction.atomic():
            task = task_create(actor=actor, **fields)
            for name, data in files:
                if isinstance(data, Path):
                    add_input_file(task.pk, name=name, source=data)
                else:
                    add_input_file(task.pk, name=name, data=data)
    except BaseException:
        if task is not None:
            remove_task_files(task.pk)
        raise
    return task


def connection_named(ref: Connection | int | str | None) -> Connection | None:
    if ref is None or isinstance(ref, Connection):
        return ref
    found = Connection.objects.filter(**{"pk" if isinstance(ref, int) else "name": ref}).first()
    if found is None:
        raise InvalidInput(f"connection {ref!r} does not exist", field="connection")
    return found


def model_named(ref: Model | int | str | None, connection: Connection | None) -> Model | None:
    """A model by id, or by name (on `connection` when given; else NAME, or CONNECTION/NAME when no
    model is called NAME); exactly one, else refused."""
    if ref is None or isinstance(ref, Model):
        return ref
    models = Model.objects.select_related("connection")
    if isinstance(ref, int):
        found = models.filter(pk=ref).first()
        if found is None:
            raise InvalidInput(f"model {ref} does not exist", field="model")
        return found
    named = models.filter(name=ref)
    if connection is None and "/" in ref and not named.exists():
        connection_name, _, name = ref.partition("/")
        named = models.filter(connection__name=connection_name, name=name)
    if connection is not None:
        named = named.filter(connection=connection)
    matches = list(named[:2])
    if len(matches) != 1:
        problem = "is ambiguous: name the connection" if matches else "does not exist"
        raise InvalidInput(f"model {ref!r} {problem}", field="model")
    return matches[0]


def task_create_by_name(
    *,
    actor: Actor,
    files: Sequence[tuple[str, InputData]] = (),
    goal: Goal | int | None = None,
    depends_on: Sequence[Task | int] = (),
    connection: Connection | int | str | None = None,
    model: Model | int | str | None = None,
    tools: list[str] | None = None,
    tool_policies: dict[str, str] | None = None,
    field_names: Mapping[str, str] | None = None,
    **fields: Any,
) -> Task:
    """A person's new task, from any door (the console's form, `POST /api/tasks`, `acthelm_task
    create`): the goal, the dependencies, the connection and the model it names (by id, or a
    connection and a model by name) are found here, each failure refused once, with one code
    (`invalid_input`) and one message; then `task_create_with_files` creates the task with its
    input files, its model checked (`check_model`). A door whose input calls a field otherwise
    (the API's `goal_id`, `ask_tools`) passes `field_names` so that the refusal names its field.
    """
    renamed = dict(field_names or {})
    try:
        if isinstance(goal, int):
            goal_id, goal = goal, Goal.objects.filter(pk=goal).first()
            if goal is None:
                raise InvalidInput(f"goal {goal_id} does not exist", field="goal")
        connection = connection_named(connection)
        model = model_named(model, connection)
        wanted = {dep if isinstance(dep, int) else dep.pk for dep in depends_on}
        deps = list(Task.objects.filter(pk__in=wanted))
        if len(deps) != len(wanted):
            raise InvalidInput("a dependency does not exist", field="depends_on")
        policies = dict(tool_policies or {})
        if tools is not None and (stray := sorted(set(policies) - set(tools))):
            raise InvalidInput(
                f"a policy names tools the task does not use: {', '.join(stray)}",
                field="tool_policies",
            )
    except InvalidInput as exc:
        raise InvalidInput(exc.message, field=renamed.get(exc.field or "", exc.field)) from None
    return task_create_with_files(
        actor=actor,
        files=list(files),
        goal=goal,
        depends_on=deps,
        connection=connection,
        model=model,
        tools=tools,
        tool_policies=policies,
        check_model=True,
        **fields,
    )


def task_resume(*, actor: Actor, task_id: int, model: Model | None = None) -> Task:
    """Queue a paused task again, optionally on another connection/model that passes the checks."""

    with transaction.atomic():
        task = act(task_id, "resume", actor)
        data: dict[str, Any] = {}
        if model is not None:
            check = model_check_for_task(task=task, model=model)
            check.raise_if_failed()
            data = {"model_id": model.pk, "model": str(model), "check": check.as_dict()}
            task.connection, task.model = model.connection, model
        set_status(task, TaskStatus.READY, actor=actor, kind=EventKind.RESUMED, data=data)
    return task


def task_retry(
    *,
    actor: Actor,
    task_id: int,
    model: Model | None = None,
    limits: dict[str, Any] | None = None,
    raised_limit: int | None = None,
    data: Mapping[str, Any] | None = None,
) -> Task:
    """Queue a failed task again from its checkpoint. After a limit, the limit must be raised:
    `limits` are set first, in the same transaction (all or nothing; unchanged ones are skipped).
    `raised_limit` is a new value for the limit the task stopped at, whichever that is.

    When the supervisor rejected the newest run and no feedback waits for the next attempt,
    the rejection becomes that feedback: the next run asks the model again with it, rather than
    judging the stored answer once more. `data` adds to the `retried` event."""

    if raised_limit is not None:
        code = Task.objects.filter(pk=task_id).values_list("failure_code", flat=True).first()
        field = limit_for_failure(code or "")
        if field:
            limits = {**(limits or {}), field: raised_limit}
    raised = validate_limits(limits or {})
    with transaction.atomic():
        if raised:
            current = Task.objects.filter(pk=task_id).values(*raised).first() or {}
            changed = {f: v for f, v in raised.items() if current.get(f) != v}
            if changed:
                task_set_limits(actor=actor, task_id=task_id, **changed)
        task = act(task_id, "retry", actor)
        if task.failure_code in FailureCode.limits() and task.failure_code in exhausted_limits(
            task
        ):
            raise LimitNotRaised(
                f"task {task_id} stopped at {task.failure_code}; raise that limit before retrying"
            )
        event: dict[str, Any] = {"previous_failure": task.failure_code, **(data or {})}
        if model is not None:
            check = model_check_for_task(task=task, model=model)
            check.raise_if_failed()
            event |= {"model_id": model.pk, "model": str(model), "check": check.as_dict()}
            task.connection, task.model = model.connection, model
        feedback = task.feedback
        if (
            not feedback
            and not event.get("start_over")  # a fresh conversation begins from the instruction
            and (rejection := last_rejection(task)) is not None
            and rejection.accepted is None
        ):
            feedback = rejection.reason
        set_status(
            task,
            TaskStatus.READY,
            actor=actor,
            kind=EventKind.RETRIED,
            data=event,
            feedback=feedback,
            failure_code="",
            failure_message="",
            failed_attempts=0,
            lost_count=0,
            not_before=None,
        )
    return task


# --- The task's life: pause, cancel, close, reopen, retry now, limits, delete -------------


def task_pause(*, actor: Actor, task_id: int) -> Task:
    """A ready task pauses at once; a running one stops at its next safe point."""
    with transaction.atomic():
        task = act(task_id, "pause", actor)
        if task.status == TaskStatus.READY:
            set_status(task, TaskStatus.PAUSED, actor=actor, kind=EventKind.PAUSED)
        else:
            set_status(
                task, TaskStatus.PAUSE_REQUESTED, actor=actor, kind=EventKind.PAUSE_REQUESTED
            )
    return task


def task_withdraw_pause(*, actor: Actor, task_id: int) -> Task:
    with transaction.atomic():
        task = act(task_id, "withdraw_pause", actor)
        set_status(task, TaskStatus.IN_PROGRESS, actor=actor, kind=EventKind.PAUSE_WITHDRAWN)
    return task


#: A cancel's reason: a sentence or two for the timeline, not a document.
CANCEL_REASON_MAX_CHARS = 500


def check_cancel_reason(reason: str) -> str:
    """A cancel's reason as recorded (stripped); InvalidInput when it is too long."""
    reason = (reason or "").strip()
    if len(reason) > CANCEL_REASON_MAX_CHARS:
        raise InvalidInput(
            f"the reason is {len(reason)} characters; at most {CANCEL_REASON_MAX_CHARS}",
            field="reason",
        )
    return reason


def task_cancel(*, actor: Actor, task_id: int, reason: str = "") -> Task:
    """A person's cancel, whichever door it comes through (console, admin, CLI, API): no further
    step starts. In one transaction that holds the task's lock: the runs (a running attempt ends
    now, its worker notices at its next safe point; a tool call in flight becomes `unknown`:
    `agents.engine.store.settle_for_cancelled_task`), the open decisions (approvals and
    needs_review decisions are cancelled, the approvals with the reason:
    `approvals.services.settle_for_cancelled_task`), then the status with a `cancelled` event
    that records the optional reason and what was settled, and blocked dependants noted."""
    reason = check_cancel_reason(reason)
    with transaction.atomic():
        task = act(task_id, "cancel", actor)
        settled: dict[str, Any] = {
            **settle_runs_for_cancel(task, reason),
            **settle_decisions_for_cancel(task, reason),
        }
        set_status(
            task,
            TaskStatus.CANCELLED,
            actor=actor,
            kind=EventKind.CANCELLED,
            data={"reason": reason, **settled},
        )
        note_stuck_dependants(task, actor=actor)
    return task


def check_by_a_person(actor: Actor, what: str) -> None:
    """Only a person does `what` (closing a task, overruling the supervisor)."""
    if not actor.is_person:
        raise TransitionNotAllowed(f"only a person {what}")


def task_close(*, actor: Actor, task_id: int) -> Task:
    """A person closes a task in review: done. Dependants whose dependencies are done get ready."""
    check_by_a_person(actor, "closes a task")
    with transaction.atomic():
        task = act(task_id, "close", actor, perm=CLOSE_TASK)
        set_status(task, TaskStatus.DONE, actor=actor, kind=EventKind.CLOSED)
        promote_dependants(task, actor=actor)
    return task


def task_retry_now(*, actor: Actor, task_id: int, data: Mapping[str, object] | None = None) -> Task:
    """A ready task waiting for its retry back-off (or a cooldown) becomes claimable now: the
    wait is dropped and the workers are woken. Only a ready task with a wait; its attempts
    still count. `data` adds to the `retried` event (what a person's change made of the run)."""
    actor.require(OPERATE_TASK)
    with transaction.atomic():
        task = lock_task(task_id)
        if task.status != TaskStatus.READY or task.not_before is None:
            raise TransitionNotAllowed(
                f"task {task_id} is {task.status} and waits for no retry; retry now is not possible"
            )
        waited_until = task.not_before
        task.not_before = None
        task.save(update_fields=["not_before", "updated_at"])
        record_event(
            task,
            actor=actor,
            kind=EventKind.RETRIED,
            data={"retry_now": True, "not_before_was": waited_until.isoformat(), **(data or {})},
        )
        notify_ready()
    return task


def check_reopen_feedback(feedback: str) -> str:
    """A reopen's feedback for the next attempt, stripped; InvalidInput when there is none."""
    feedback = (feedback or "").strip()
    if not feedback:
        raise InvalidInput("reopening needs feedback for the next attempt", field="feedback")
    return feedback


def task_reopen(*, actor: Actor, task_id: int, feedback: str) -> Task:
    """A person reopens a task in review (or done) with feedback: ready for another attempt."""
    feedback = check_reopen_feedback(feedback)
    with transaction.atomic():
        task = act(task_id, "reopen", actor, perm=CLOSE_TASK)
        set_status(
            task,
            TaskStatus.READY,
            actor=actor,
            kind=EventKind.REOPENED,
            data={"feedback": feedback},
            feedback=feedback,
            failed_attempts=0,
            not_before=None,
        )
    return task


def _jsonable(value: int | Decimal | None) -> int | str | None:
    return str(value) if isinstance(value, Decimal) else value


def task_set_limits(*, actor: Actor, task_id: int, **limits: object) -> Task:
    """Raise or lower a task's limits while no worker holds it."""
    clean = validate_limits(limits)
    with transaction.atomic():
        actor.require(OPERATE_TASK)
        task = lock_task(task_id)
        if task.is_held:
            raise TransitionNotAllowed(f"task {task_id} is running; pause it to change its limits")
        before = {field: _jsonable(getattr(task, field)) for field in clean}
        for field, value in clean.items():
            setattr(task, field, value)
        task.save(update_fields=[*clean, "updated_at"])
        record_event(
            task,
            actor=actor,
            kind=EventKind.LIMITS_CHANGED,
            data={"before": before, "after": {k: _jsonable(v) for k, v in clean.items()}},
        )
    return task


def task_delete(*, actor: Actor, task_id: int) -> None:
    """Delete a done, failed or cancelled task with its transcript, events, artifacts and its
    files (input files and artifacts on disk)."""
    with transaction.atomic():
        task = act(task_id, "delete", actor)
        if task.status not in DELETABLE:  # the actions table says so too; belt and braces
            raise TransitionNotAllowed(f"task {task_id} is {task.status}; it cannot be deleted")
        if task.dependant_links.filter(~Q(task__status__in=DELETABLE)).exists():
            raise TransitionNotAllowed(f"open tasks depend on task {task_id}")
        task.delete()
    # Only once the row is gone: a refused delete (any raise above) keeps the files. Called
    # inside a caller's transaction that later rolls back, the files would be gone with the
    # row kept; no caller does that (the console, the CLI and the API call it on its own).
    remove_task_files(task_id)
    log.info("task.deleted", extra={"task_id": task_id, "actor": actor.label})


# A person's later decision about a rejected run's task, in the words of an accept's refusal.
_CHOICE: dict[str, str] = {
    EventKind.REOPENED: "reopen it with feedback",
    EventKind.RETRIED: "run it again",
}


def check_accept_reason(reason: str) -> str:
    """Why a person accepts a rejected run, stripped; InvalidInput when they do not say."""
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("say why the rejected run is accepted", field="reason")
    return reason


def task_accept(*, actor: Actor, task_id: int, reason: str) -> Task:
    """A person overrules the supervisor: the run it rejected goes to review as it is.

    Only a person holding `tasks.close_task`, with a reason, and only while the task's newest run
    is the one the supervisor rejected (the task failed after its attempts, or waits ready for
    its retry); once per run, and never after a person's later decision about the task (a reopen
    with feedback, a retry: `agents.selectors.LATER_DECISIONS`). Under the task's row lock: the
    scheduled retry is dropped, the task moves to `review` keeping that run's answer and the
    artifacts as they are, and an `accepted` event records who, why, the run and the checks that
    failed. No model is asked. A retry that falls due meanwhile is not claimed (the claim skips
    the row this lock holds, and finds it in review once the accept commits); a run that claimed
    the task first holds it, and the accept is refused (`in_progress` allows no accept)."""
    reason = check_accept_reason(reason)
    check_by_a_person(actor, "overrules the supervisor")
    with transaction.atomic():
        task = act(task_id, "accept", actor, perm=CLOSE_TASK)
        rejection = last_rejection(task)
        if rejection is None:
            raise TransitionNotAllowed(
                f"task {task_id}'s last run was not rejected by the supervisor: nothing to accept"
            )
        run = rejection.run
        # Once, and never over a person: a second accept after a reopen would erase its feedback
        # and undo the reopen; one after a retry would undo the choice to run it again.
        if rejection.accepted is not None:
            raise TransitionNotAllowed(
                f"run {run.number} of task {task_id} was already accepted by "
                f"{rejection.accepted.actor_label}; it is accepted once"
            )
        if (later := rejection.later_decision) is not None:
            raise TransitionNotAllowed(
                f"after the supervisor rejected run {run.number} of task {task_id}, "
                f"{later.actor_label} chose to {_CHOICE.get(later.kind, later.kind)}: an accept "
                "does not overrule it; the next run's verdict decides"
            )
        if not run.answer.strip():
            raise TransitionNotAllowed(
                f"run {run.number} of task {task_id} gave no answer: nothing to accept; "
                "change the task and retry it instead"
            )
        data: dict[str, Any] = {
            "reason": reason[:2000],
            "run_id": run.pk,
            "run": run.number,
            "verdict_reason": rejection.reason[:2000],
            "failed_checks": rejection.failed_checks,
        }
        if task.not_before is not None:
            data["retry_cancelled"] = task.not_before.isoformat()
        if task.failure_code:
            data["previous_failure"] = task.failure_code
        set_status(
            task,
            TaskStatus.REVIEW,
            actor=actor,
            kind=EventKind.ACCEPTED,
            run=run,
            data=data,
            not_before=None,
            failure_code="",
            failure_message="",
            # The supervisor's feedback was for a next attempt that a person has just overruled
            # (it stays in the event as `verdict_reason`); a reopen gives its own.
            feedback="",
        )
    log.info(
        "task.accepted",
        extra={"task_id": task_id, "run_id": run.pk, "actor": actor.label},
    )
    return task
