"""A person's actions on tasks that reach past the ledger: a task created with its input files,
resumed on another model, retried with what remains of its limits, edited (and retried), a
rejected run accepted into review over the supervisor; a goal created with its acceptance checks.

A task itself is created by `agents.engine.run.intake.task_create`, the one path by which a task
enters, whoever creates it. `tasks.services` holds the actions the ledger owns (pause, cancel,
close, reopen, limits, delete, goals); a cancel reaches the runs and the open decisions through
what `agents.apps` and `approvals.apps` register with it. Each action moves the task's status
only through `tasks.transitions`."""

import logging
from collections.abc import Mapping, Sequence
from decimal import Decimal
from pathlib import Path
from typing import Any

from django.core.files import File
from django.db import transaction

from agents.catalogue.connections import model_check_for_task
from agents.engine.run.intake import _validate_tools, task_create
from agents.engine.run.prompting import CHANGE_HEAD, change_message
from agents.engine.run.usage import exhausted_limits
from agents.engine.verdict.acceptance import FIELD as CHECKS_FIELD
from agents.engine.verdict.acceptance import check_text, validate_checks
from agents.engine.verdict.checking import default_checks_on
from agents.models import Connection, Conversation, Model, Turn
from agents.selectors import DEFAULT_CHECK, TASK_CHECK, Rejection, last_rejection
from agents.states import FailureCode
from core.actors import Actor
from core.exceptions import (
    InvalidInput,
    LimitNotRaised,
    TransitionNotAllowed,
)
from core.numbers import whole_number
from tasks.limits import (
    LIMIT_FIELDS,
    limit_for_failure,
)
from tasks.models import Goal, Task
from tasks.permissions import CLOSE_TASK, OPERATE_TASK
from tasks.services import (
    act,
    task_retry_now,
    task_set_limits,
    validate_limits,
)
from tasks.services import goal_create as ledger_goal_create
from tasks.states import (
    OPEN,
    EventKind,
    TaskKind,
    TaskStatus,
)
from tasks.transitions import (
    lock_task,
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


#: What a person may edit on a task's admin page (status and lease fields are never edited).
EDITABLE_FIELDS = (
    "title",
    "instruction",
    "goal",
    "kind",
    "spawned_by",
    "tags",
    "priority",
    *LIMIT_FIELDS,
    "tools",
    "tool_policies",
    "allowed_domains",
    "connection",
    "model",
    CHECKS_FIELD,
)
# How much of an edited instruction the `edited` event keeps, before and after.
EVENT_INSTRUCTION_CHARS = 4000


def _normalize_domains(domains: object) -> list[str]:
    if not isinstance(domains, list | tuple) or not all(isinstance(d, str) for d in domains):
        raise InvalidInput("allowed domains must be a list of host names")
    return sorted({d.strip().lower().rstrip(".") for d in domains if d.strip()})


def _check_tools(clean: dict[str, Any], merged: Mapping[str, Any]) -> None:
    """The tools, their policies and the acceptance checks of an edit, as the task will have
    them; the checks are stored normalized (`clean` is updated). As task_create_by_name: a
    policy given names a tool of the task's list; a tool that leaves the list takes its stored
    policy with it (the `edited` event keeps it)."""
    if "tools" in clean and not isinstance(clean["tools"], list | tuple):
        raise InvalidInput("tools must be a list of tool names ([] for none)", field="tools")
    tools = list(merged["tools"] or [])
    if {"tools", "tool_policies"} & set(clean):
        policies = merged["tool_policies"]
        if "tool_policies" not in clean and isinstance(policies, dict):
            kept = {tool: policy for tool, policy in policies.items() if tool in tools}
            if kept != policies:
                clean["tool_policies"] = policies = kept
        _validate_tools(tools, policies)
        if stray := sorted(set(policies) - set(tools)):
            raise InvalidInput(
                f"a policy names tools the task does not use: {', '.join(stray)}",
                field="tool_policies",
            )
    if {CHECKS_FIELD, "tools"} & set(clean):
        # Against the tools the task will have: `tool_ran` of a tool it lacks never passes.
        checks = validate_checks(merged[CHECKS_FIELD], tools=tools)
        if CHECKS_FIELD in clean:
            clean[CHECKS_FIELD] = checks


def task_edit_check(*, task: Task, changes: Mapping[str, Any]) -> dict[str, Any]:
    """The edit a person asks for, checked as task_create checks a new task; returns it normalized.
    Raises InvalidInput naming the first problem."""
    unknown = sorted(set(changes) - set(EDITABLE_FIELDS))
    if unknown:
        raise InvalidInput(f"these fields cannot be edited: {', '.join(unknown)}")
    clean = dict(changes)
    merged = {name: getattr(task, name) for name in EDITABLE_FIELDS} | clean
    if "title" in clean:
        clean["title"] = (clean["title"] or "").strip()
        if not clean["title"] or len(clean["title"]) > 200:
            raise InvalidInput("a task needs a title of at most 200 characters")
    if "instruction" in clean:
        clean["instruction"] = (clean["instruction"] or "").strip()
        if not clean["instruction"]:
            raise InvalidInput("a task needs an instruction")
    if "kind" in clean and clean["kind"] not in TaskKind.values:
        raise InvalidInput(f"kind must be one of {', '.join(TaskKind.values)}")
    if "priority" in clean:
        clean["priority"] = whole_number(clean["priority"], name="priority")
    clean |= validate_limits({k: v for k, v in clean.items() if k in LIMIT_FIELDS})
    _check_tools(clean, merged)
    if "allowed_domains" in clean:
        clean["allowed_domains"] = _normalize_domains(clean["allowed_domains"])
    if "tags" in clean:
        clean["tags"] = sorted({str(t).strip() for t in clean["tags"] or [] if str(t).strip()})
    if {"connection", "model"} & set(clean):
        model, conn = merged["model"], merged["connection"]
        if model is not None and conn is None:
            clean["connection"] = conn = model.connection
        if model is not None and model.connection_id != conn.pk:
            raise InvalidInput(f"model {model} does not belong to connection {conn}")
    return clean


def _event_value(value: object) -> object:
    if hasattr(value, "pk"):
        return value.pk
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, str) and len(value) > EVENT_INSTRUCTION_CHARS:
        return value[: EVENT_INSTRUCTION_CHARS - 1] + "…"
    return value


def task_update(*, actor: Actor, task_id: int, changes: Mapping[str, Any]) -> Task:
    """A person's edit of a task's settings (the admin page, the console's Change form,
    `acthelm_task edit`, `PATCH /api/tasks/{id}`): checked like a new task, refused while a
    worker holds the task and once it is done or cancelled, written with an `edited` event
    naming each change with its value before and after (an instruction up to
    EVENT_INSTRUCTION_CHARS)."""
    actor.require(OPERATE_TASK)
    with transaction.atomic():
        task = lock_task(task_id)
        if task.is_held:
            raise TransitionNotAllowed(
                f"task {task_id} is {task.status}: a worker holds it; pause it to edit it"
            )
        if task.status not in OPEN:
            raise TransitionNotAllowed(
                f"task {task_id} is {task.status}: a closed or cancelled task is not edited"
            )
        clean = task_edit_check(task=task, changes=changes)
        changed = {k: v for k, v in clean.items() if getattr(task, k) != v}
        if not changed:
            return task
        before = {k: _event_value(getattr(task, k)) for k in changed}
        for field, value in changed.items():
            setattr(task, field, value)
        task.save(update_fields=[*changed, "updated_at"])
        after = {k: _event_value(v) for k, v in changed.items()}
        record_event(
            task,
            actor=actor,
            kind=EventKind.EDITED,
            data={"fields": sorted(changed), "before": before, "after": after},
        )
    return task


#: What a model continuing its conversation is told of when a person changes it.
TOLD_FIELDS = ("instruction", CHECKS_FIELD, "tools")


def task_change_and_retry(
    *,
    actor: Actor,
    task_id: int,
    changes: Mapping[str, Any],
    retry: bool = True,
    start_over: bool = False,
) -> Task:
    """Change a task that is not running (`task_update`), then, with `retry`, run it again now:
    a failed task is retried (`task_retry`), a ready task waiting for its retry drops the wait
    (`task_retry_now`). All or nothing: a refused retry undoes the edit.

    The change reaches the model's next request (`next_attempt`). By default the conversation
    continues: its stored prefix is sent as it was, and one message says what changed. With
    `start_over` (only with `retry`) the next run begins a fresh conversation from the new
    instruction; the earlier turns, runs and calls stay on record."""
    if start_over and not retry:
        raise InvalidInput("starting over is a way to retry: ask for the retry too", field="retry")
    with transaction.atomic():
        task = lock_task(task_id)
        before = {name: getattr(task, name) for name in TOLD_FIELDS}
        task = task_update(actor=actor, task_id=task_id, changes=changes)
        changed = {name for name, value in before.items() if getattr(task, name) != value}
        if not retry:
            next_attempt(task, changed=changed, start_over=False)
            return task
        if task.status == TaskStatus.FAILED:
            data = next_attempt(task, changed=changed, start_over=start_over)
            return task_retry(actor=actor, task_id=task_id, data=data)
        if task.status == TaskStatus.READY and task.not_before is not None:
            data = next_attempt(task, changed=changed, start_over=start_over)
            return task_retry_now(actor=actor, task_id=task_id, data=data)
        raise TransitionNotAllowed(
            f"task {task_id} is {task.status}: only a failed task or one waiting for its retry "
            "can be retried now"
        )


def next_attempt(task: Task, *, changed: set[str], start_over: bool) -> dict[str, Any]:
    """What the next run of `task` starts from after a person changed `changed` (the caller
    holds the task's row lock). Returns what the `retried` event records of it.

    Continue: when the instruction, the checks or the tools changed and the task has a
    conversation, `Task.feedback` becomes one message (`change_message`) with the task as it is
    now, the rejection of the previous attempt as far as it still applies (a check taken away,
    or a default check of an instruction since changed, is dropped) and the person's own
    feedback; the run sends it after the stored prefix, unchanged. Start over: the turns so far
    become an earlier conversation (`Conversation.first_turn`, `Conversation.earlier`), the
    feedback is dropped, and the next run builds a new system prompt and begins from the
    instruction."""
    conversation = Conversation.objects.select_for_update().filter(task_id=task.pk).first()
    rejection = last_rejection(task)
    if rejection is not None and rejection.accepted is not None:
        rejection = None  # a person took that run into review: its rejection answers nothing
    if start_over:
        data: dict[str, Any] = {"start_over": True}
        if conversation is not None:
            data["first_turn"] = _start_over(conversation)
        _set_feedback(task, "")
        return data
    if conversation is None or not changed & set(TOLD_FIELDS):
        return {}
    own = task.feedback
    if own.startswith(CHANGE_HEAD) or (rejection is not None and own == rejection.reason):
        own = ""  # a change told before is told again as it is now; the rejection, below
    message = change_message(
        instruction=task.instruction,
        checks=[check_text(c) for c in task.acceptance_checks or []],
        tools=list(task.tools) if "tools" in changed else None,
        rejected=_still_applies(rejection, task, instruction_changed="instruction" in changed),
        feedback=own,
    )
    _set_feedback(task, message)
    return {"change_sent": sorted(changed & set(TOLD_FIELDS))}


def _still_applies(
    rejection: Rejection | None, task: Task, *, instruction_changed: bool
) -> list[str]:
    """Why the previous attempt was rejected, as far as it still applies to the changed task: a
    failed check of the task's own only while the task still has it, a default check only while
    the instruction it was derived from is unchanged; a reason that is no check's (the rules',
    a model supervisor's) as it was."""
    if rejection is None:
        return []
    if not rejection.failed_checks:
        return [rejection.reason] if rejection.reason else []
    in_force = {check_text(c) for c in task.acceptance_checks or []}
    out = []
    for failed in rejection.failed_checks:
        if failed["source"] == TASK_CHECK and failed["check"] not in in_force:
            continue
        if failed["source"] == DEFAULT_CHECK and (instruction_changed or not default_checks_on()):
            continue
        out.append(f"{failed['source']} {failed['check']} failed: {failed['detail']}")
    return out


def _start_over(conversation: Conversation) -> int:
    """The conversation's turns so far become an earlier one, kept on record and never sent
    again; its prompt, pins and plan are kept with them, and cleared for the next run to build.
    Returns the index of the new conversation's first turn."""
    last = Turn.objects.filter(task_id=conversation.task_id).order_by("-index").first()
    first_turn = last.index + 1 if last is not None else conversation.first_turn
    if first_turn == conversation.first_turn and not conversation.system_prompt:
        return first_turn  # started over already, and no run has begun the new one
    conversation.earlier = [
        *(conversation.earlier or []),
        {
            "first_turn": conversation.first_turn,
            "until_turn": first_turn,
            "system_prompt": conversation.system_prompt,
            "system_prompt_sha256": conversation.system_prompt_sha256,
            "tool_pins": conversation.tool_pins,
            "plan": conversation.plan,
            "created_at": conversation.created_at.isoformat(),
        },
    ]
    conversation.first_turn = first_turn
    conversation.system_prompt = conversation.system_prompt_sha256 = ""
    conversation.tool_pins, conversation.plan, conversation.plan_updated_at = {}, None, None
    conversation.save()
    return first_turn


def _set_feedback(task: Task, feedback: str) -> None:
    if task.feedback != feedback:
        task.feedback = feedback
        Task.objects.filter(pk=task.pk).update(feedback=feedback)


# A person's later decision about a rejected run's task, in the words of an accept's refusal.
_CHOICE: dict[str, str] = {
    EventKind.REOPENED: "reopen it with feedback",
    EventKind.RETRIED: "run it again",
}


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
    reason = (reason or "").strip()
    if not reason:
        raise InvalidInput("say why the rejected run is accepted", field="reason")
    if not actor.is_person:
        raise TransitionNotAllowed("only a person overrules the supervisor")
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


def goal_create(
    *,
    actor: Actor,
    title: str,
    description: str = "",
    acceptance_checks: Sequence[str | Mapping[str, object]] | None = None,
) -> Goal:
    """A new active goal with the acceptance checks of the work planned for it (``KIND=VALUE``
    texts or ``{"kind", "value"}`` objects, refused with `acceptance_check_invalid`, field
    `acceptance_checks`). The goal has no tool list, so `tool_ran` is not checked against one:
    each task that gets the goal's checks drops those for tools it lacks (`meetable_checks`)."""
    checks = validate_checks(acceptance_checks, tools=None)
    return ledger_goal_create(
        actor=actor, title=title, description=description, acceptance_checks=checks
    )
