"""A person's change to a task that is not running, whichever door it comes through (the admin's
form, the console's edit page, the API, the CLI): checked as the task will have it
(`task_edit_check`: the tools, their policies, the acceptance checks, the model), written with an
`edited` event (`task_update`), and, with "change and retry", run again now
(`task_change_and_retry`) so that the change reaches the model's next request (`next_attempt`:
the conversation continues with one message saying what changed, or starts over)."""

import logging
from collections.abc import Mapping
from decimal import Decimal
from typing import Any

from django.db import transaction

from agents.actions.task import task_retry, task_retry_now
from agents.engine.run.intake import _validate_tools
from agents.engine.run.prompting import CHANGE_HEAD, change_message
from agents.engine.verdict.acceptance import FIELD as CHECKS_FIELD
from agents.engine.verdict.acceptance import check_text, validate_checks
from agents.engine.verdict.checking import default_checks_on
from agents.models import Conversation, Turn
from agents.selectors import DEFAULT_CHECK, TASK_CHECK, Rejection, last_rejection
from core.actors import Actor
from core.exceptions import (
    InvalidInput,
    TransitionNotAllowed,
)
from core.numbers import whole_number
from tasks.limits import (
    LIMIT_FIELDS,
)
from tasks.models import Task
from tasks.permissions import OPERATE_TASK
from tasks.services import validate_limits
from tasks.states import (
    OPEN,
    EventKind,
    TaskKind,
    TaskStatus,
)
from tasks.transitions import (
    lock_task,
    record_event,
)

log = logging.getLogger("acthelm.tasks")


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
