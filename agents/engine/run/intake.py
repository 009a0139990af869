"""The intake: the one path by which a task enters, whoever creates it — a person (the console,
the CLI, the API, through `task_create`), the reconciler (a goal's planning task) or a planning
task's `propose_task` (a follow-up, `follow_up_create`, with never more than its parent has).

Its tools are checked against the catalogue, its model against its connection, its acceptance
checks compiled; the row, its dependencies and its `created` event are written in one
transaction. It lives in the engine because the engine creates tasks; person actions on tasks
that exist are `agents.actions.task`."""

import logging
from collections.abc import Mapping, Sequence
from decimal import Decimal
from typing import Any, NamedTuple, NotRequired, TypedDict

from django.conf import settings
from django.db import transaction

from agents.catalogue.eligibility import eligible_models, has_tools, model_refusal
from agents.catalogue.tools import find_tool, tool_names
from agents.catalogue.tools.plan import ProposeTaskArgs
from agents.engine.run.usage import remaining, task_usage
from agents.engine.verdict.acceptance import Check, validate_checks
from agents.models import Connection, Model
from agents.states import CostTier, FailureCode
from core.actors import Actor
from core.exceptions import (
    ErrorCode,
    InvalidInput,
)
from core.numbers import whole_number
from tasks.limits import (
    CUMULATIVE,
)
from tasks.models import Goal, Task, TaskDependency
from tasks.services import default_limits, validate_limits
from tasks.states import (
    EventKind,
    TaskKind,
    TaskOrigin,
    TaskStatus,
    ToolPolicy,
)
from tasks.transitions import (
    lock_task,
    notify_ready,
    record_event,
)

log = logging.getLogger("acthelm.tasks")


def known_tool_names() -> set[str]:
    return set(tool_names())


def _validate_tools(tools: list[str], policies: dict[str, str]) -> None:
    if not isinstance(tools, list | tuple) or not all(isinstance(t, str) for t in tools):
        raise InvalidInput("tools must be a list of tool names")
    if not isinstance(policies, dict):
        raise InvalidInput('tool policies must be an object such as {"fetch_url": "ask"}')
    known = known_tool_names()
    unknown = sorted(set(tools) - known)
    if unknown:
        raise InvalidInput(
            f"unknown tools: {', '.join(unknown)} (known: {', '.join(sorted(known))})",
            field="tools",
        )
    for tool, policy in policies.items():
        if tool not in known:
            raise InvalidInput(f"a policy names the unknown tool {tool!r}", field="tool_policies")
        if policy not in ToolPolicy.values:
            raise InvalidInput(
                f"the policy for {tool} must be allow or ask, not {policy!r}",
                field="tool_policies",
            )


def _with_default_policies(tools: list[str], policies: dict[str, str]) -> dict[str, str]:
    """A tool whose own default is ``ask`` (an MCP tool of an untrusted server) is stored with
    that policy unless its author set one, so the task shows and keeps what applies."""

    out = dict(policies)
    for name in tools:
        if name in out:
            continue
        tool = find_tool(name)
        if tool is not None and getattr(tool, "default_policy", "allow") == ToolPolicy.ASK:
            out[name] = ToolPolicy.ASK
    return out


# What a person does about each reason a chosen model is refused (`model_refusal`).
_ADVICE = {
    FailureCode.MODEL_UNTESTED: "acthelm_connection test {connection}",
    FailureCode.MODEL_NOT_TOOL_CAPABLE: "choose another model, give the task no tools, or "
    "override the record (acthelm_connection test --override-tools)",
}


def model_for_new_task(
    *, connection: Connection | None = None, model: Model | None = None, tools: list[str]
) -> tuple[Connection, Model]:
    """What a person's new task runs on, checked now so that it does not fail a second later:
    the model they chose, else the chosen connection's first model that could run it
    (`eligible_models`), else the highest-priority zero-cost connection's such model (the
    reconciler's rule; for a task without tools a tool-capable one first among equals, else a
    model CLI's). Refused with a field error (``model``) when there is none
    (``no_usable_model``), or with the reason the chosen one could not run the task
    (`model_refusal`: its code). A cooldown is waited out, not refused."""
    with_tools = has_tools(tools)
    if model is None:
        what = "tested, tool-capable" if with_tools else "tested"
        if connection is not None:
            on_it = eligible_models(with_tools=with_tools).filter(connection=connection)
            model = on_it.order_by("name", "id").first()
            if model is None:
                raise InvalidInput(
                    f"connection {connection} has no {what} model: choose a model "
                    f"or test one (acthelm_connection test {connection})",
                    field="model",
                    code=ErrorCode.NO_USABLE_MODEL,
                )
        else:
            model = (
                eligible_models(with_tools=with_tools)
                .filter(connection__cost_tier=CostTier.ZERO_COST)
                .order_by("-connection__priority", "-supports_tools", "connection__name", "id")
                .first()
            )
            if model is None:
                raise InvalidInput(
                    f"no {what}, zero-cost model to run the task on: choose a "
                    "connection and model, or add and test one (acthelm_connection add, "
                    "acthelm_connection test)",
                    field="model",
                    code=ErrorCode.NO_USABLE_MODEL,
                )
        return model.connection, model
    if connection is not None and model.connection_id != connection.pk:
        raise InvalidInput(
            f"model {model} does not belong to connection {connection}", field="model"
        )
    refusal = model_refusal(model, with_tools=with_tools)
    if refusal is not None:
        advice = _ADVICE.get(refusal.code, "").format(connection=model.connection)
        raise InvalidInput.passing(
            f"{refusal.message}: {advice}" if advice else refusal.message,
            field="model",
            code=refusal.code,
        )
    return model.connection, model


def task_create(
    *,
    actor: Actor,
    title: str,
    instruction: str,
    goal: Goal | None = None,
    kind: str = TaskKind.WORK,
    origin: str = TaskOrigin.PERSON,
    spawned_by: Task | None = None,
    depends_on: Sequence[Task] = (),
    priority: int = 0,
    tools: list[str] | None = None,
    tool_policies: dict[str, str] | None = None,
    allowed_domains: list[str] | None = None,
    connection: Connection | None = None,
    model: Model | None = None,
    tags: list[str] | None = None,
    limits: dict[str, Any] | None = None,
    evaluation: bool = False,
    acceptance_checks: Sequence[str | Mapping[str, object]] | None = None,
    check_model: bool = False,
) -> Task:
    """Create a task, `ready` or `blocked` by its dependencies, with limits from the defaults.

    `evaluation`: a case of the graded suite (agents.eval), hidden from the review queue, the
    inbox and the scorecard's real-work figures. `acceptance_checks`: ``KIND=VALUE`` texts or
    ``{"kind", "value"}`` objects (`agents.engine.verdict.acceptance`), refused with
    `acceptance_check_invalid`
    (field `acceptance_checks`) when a kind is unknown or a pattern cannot be run; a person's
    work task for a goal given none gets the goal's (`meetable_checks`).
    `check_model` (a person's new task from the console, the CLI or the API): without a model,
    the default one (`model_for_new_task`); a model the task could not run on is refused now."""
    title, instruction = (title or "").strip(), (instruction or "").strip()
    if not title:
        raise InvalidInput("a task needs a title", field="title")
    if not instruction:
        raise InvalidInput("a task needs an instruction", field="instruction")
    if len(title) > 200:
        raise InvalidInput("a title is at most 200 characters", field="title")
    if kind not in TaskKind.values:
        raise InvalidInput(f"kind must be one of {', '.join(TaskKind.values)}", field="kind")
    priority = whole_number(priority, name="priority")
    tools = list(settings.ACTHELM_DEFAULT_TOOLS if tools is None else tools)
    tool_policies = dict(tool_policies or {})
    _validate_tools(tools, tool_policies)
    tool_policies = _with_default_policies(tools, tool_policies)
    if model is not None:
        if connection is None:
            connection = model.connection
        if model.connection_id != connection.pk:
            raise InvalidInput(
                f"model {model} does not belong to connection {connection}", field="model"
            )
    domains = sorted({d.strip().lower().rstrip(".") for d in (allowed_domains or []) if d.strip()})
    fields = default_limits() | validate_limits(limits or {})
    checks = validate_checks(acceptance_checks, tools=tools)
    if (
        not checks
        and goal is not None
        and origin == TaskOrigin.PERSON
        and kind != TaskKind.PLANNING
    ):
        # A person's work for a goal, with no checks of its own: the goal's (a plan is not the
        # goal's result, so a planning task gets none).
        checks = meetable_checks(goal.acceptance_checks, tools)
    if check_model:  # after the input's own checks: a bad field is named first
        connection, model = model_for_new_task(connection=connection, model=model, tools=tools)
    with transaction.atomic():
        deps = list(Task.objects.select_for_update().filter(pk__in=[d.pk for d in depends_on]))
        if len(deps) != len({d.pk for d in depends_on}):
            raise InvalidInput("a dependency does not exist", field="depends_on")
        blocked = any(dep.status != TaskStatus.DONE for dep in deps)
        task = Task(
            title=title,
            instruction=instruction,
            goal=goal,
            kind=kind,
            origin=origin,
            spawned_by=spawned_by,
            priority=priority,
            tools=tools,
            tool_policies=tool_policies,
            allowed_domains=domains,
            connection=connection,
            model=model,
            tags=sorted(set(tags or [])),
            acceptance_checks=checks,
            is_evaluation=bool(evaluation),
            created_by=actor.user if actor.is_person else None,
            status=TaskStatus.BLOCKED if blocked else TaskStatus.READY,
            **fields,
        )
        task.save()
        TaskDependency.objects.bulk_create(
            [TaskDependency(task=task, depends_on=dep) for dep in deps]
        )
        record_event(
            task,
            actor=actor,
            kind=EventKind.CREATED,
            to_status=task.status,
            data={"depends_on": [d.pk for d in deps], "origin": origin}
            | ({"evaluation": True} if evaluation else {}),
        )
        if task.status == TaskStatus.READY:
            notify_ready()
    return task


# Tools a follow-up never inherits: proposing is a planning task's work, and a proposed task is
# a work task (so proposals cannot chain without bound).
NOT_INHERITED_TOOLS = frozenset({"propose_task"})


# Per-call caps copied from the parent as they are; the cumulative limits give what remains.
_COPIED_LIMITS = ("limit_output_tokens", "limit_tool_output_chars", "limit_artifact_bytes")


class FollowUpPermissions(TypedDict):
    """What a follow-up gets of its parent (`follow_up_permissions`): `task_create`'s arguments."""

    tools: list[str]
    tool_policies: dict[str, str]
    allowed_domains: list[str]
    limits: dict[str, Any]  # a whole number, or an amount of money (Decimal), per limit field
    acceptance_checks: NotRequired[list[Check]]


def follow_up_permissions(parent: Task, tools: list[str] | None = None) -> FollowUpPermissions:
    """What a follow-up of ``parent`` gets: never more than the parent has.

    Tools: the parent's (without ``propose_task``), or the subset asked for; the parent's
    policies for those tools; its allowed domains; and what remains of each of its cumulative
    limits (turns, runtime, token budget, network requests, MCP calls, and the money budget
    when it has one) with its per-call caps. Raises
    InvalidInput (``tool_not_allowed``, ``limit_exhausted``) when that cannot be met.
    """

    own = [t for t in parent.tools if t not in NOT_INHERITED_TOOLS]
    if tools is None:
        child_tools = own
    else:
        extra = [t for t in dict.fromkeys(tools) if t not in own]
        if extra:
            raise InvalidInput(
                f"a follow-up can only get tools this task has ({', '.join(own) or 'none'}), "
                f"not {', '.join(extra)}",
                code=ErrorCode.TOOL_NOT_ALLOWED,
            )
        child_tools = [t for t in own if t in tools]
    left = remaining(parent, task_usage(parent.pk))
    limits: dict[str, Any] = {}
    for limit in CUMULATIVE:
        field = limit.field
        if limit.failure_code not in left:  # a limit the parent does not set (no money budget)
            continue
        # What remains: a whole number, or an amount of money (a string in `remaining`).
        left_of_it = left[limit.failure_code]
        rest = Decimal(left_of_it) if limit.money else int(left_of_it)
        if rest <= 0 or (not limit.money and rest < 1):
            raise InvalidInput(
                f"this task has used up its {field.removeprefix('limit_').replace('_', ' ')}; "
                "a follow-up cannot be given more than remains",
                code=ErrorCode.LIMIT_EXHAUSTED,
            )
        limits[field] = rest
    limits.update({field: getattr(parent, field) for field in _COPIED_LIMITS})
    return {
        "tools": child_tools,
        "tool_policies": {t: p for t, p in parent.tool_policies.items() if t in child_tools},
        "allowed_domains": list(parent.allowed_domains),
        "limits": limits,
    }


def meetable_checks(checks: list[Check], tools: list[str]) -> list[Check]:
    """Stored checks handed on to a task with these tools: each once, without the `tool_ran`
    checks for tools it does not have (they could never pass)."""
    out: list[Check] = []
    for check in checks or []:
        if check.get("kind") == "tool_ran" and check.get("value") not in tools:
            continue
        if check not in out:
            out.append(check)
    return out


def follow_up_create(
    *,
    actor: Actor,
    parent: Task,
    title: str,
    instruction: str,
    depends_on: Sequence[Task] = (),
    tools: list[str] | None = None,
    inherit_checks: bool = False,
) -> Task:
    """A planning task's `propose_task`: a linked work task for the parent's goal, on the parent's
    connection and model, `blocked` or `ready` by its dependencies, with at most the parent's
    permissions (`follow_up_permissions`); at most ACTHELM_MAX_PROPOSALS_PER_TASK per parent.
    The parent's acceptance checks describe the parent's result, so a follow-up gets them only
    when asked (`inherit_checks`): then the parent's and its goal's (`Goal.acceptance_checks`,
    the defaults of the goal's work), each once, only those its tools can meet.

    Proposing the same title twice from one parent returns the first follow-up: the tool is
    replayed after a crash, and the loop names dependencies by title, so titles stay unique.
    Refusals raise InvalidInput with the codes ``proposal_limit``, ``tool_not_allowed`` and
    ``limit_exhausted``.
    """
    title = (title or "").strip()
    with transaction.atomic():
        # Serialises two proposals from one parent (the worker already holds this lock).
        parent = lock_task(parent.pk)
        existing = Task.objects.filter(spawned_by=parent, title=title).order_by("id").first()
        if existing is not None:
            log.info(
                "task.follow_up_exists",
                extra={"task_id": existing.pk, "parent_id": parent.pk, "actor": actor.label},
            )
            return existing
        cap = int(settings.ACTHELM_MAX_PROPOSALS_PER_TASK)
        if Task.objects.filter(spawned_by=parent).count() >= cap:
            raise InvalidInput(
                f"this task has proposed {cap} follow-up tasks, the most one task may "
                "propose (ACTHELM_MAX_PROPOSALS_PER_TASK); propose no more",
                code=ErrorCode.PROPOSAL_LIMIT,
            )
        inherited = follow_up_permissions(parent, tools)
        if inherit_checks:
            goal_checks = parent.goal.acceptance_checks if parent.goal is not None else []
            inherited["acceptance_checks"] = meetable_checks(
                [*parent.acceptance_checks, *goal_checks], inherited["tools"]
            )
        task = task_create(
            actor=actor,
            title=title,
            instruction=instruction,
            goal=parent.goal,
            kind=TaskKind.WORK,
            origin=TaskOrigin.AGENT,
            spawned_by=parent,
            depends_on=depends_on,
            connection=parent.connection,
            model=parent.model,
            **inherited,
        )
    log.info(
        "task.follow_up_created",
        extra={
            "task_id": task.pk,
            "parent_id": parent.pk,
            "status": task.status,
            "actor": actor.label,
        },
    )
    return task


class ProposalResult(NamedTuple):
    """What `propose_follow_up` answers (unpacks as ``text, error_code``)."""

    text: str  # for the model
    error_code: str  # "" when the follow-up was created


def propose_follow_up(*, actor: Actor, parent: Task, proposal: ProposeTaskArgs) -> ProposalResult:
    """The agent loop's `propose_task` (``proposal``: its parsed arguments), inside the worker's
    fenced transaction."""
    titles = list(proposal.depends_on_titles)
    deps = list(Task.objects.filter(spawned_by=parent, title__in=titles))
    missing = set(titles) - {d.title for d in deps}
    if missing:
        code = "unknown_dependency"
        return ProposalResult(
            f"Error ({code}): no proposed task titled {sorted(missing)[0]!r}; propose it first",
            code,
        )
    try:
        child = follow_up_create(
            actor=actor,
            parent=parent,
            title=proposal.title,
            instruction=proposal.instruction,
            depends_on=deps,
            tools=proposal.tools,
            inherit_checks=bool(getattr(proposal, "inherit_checks", False)),
        )
    except InvalidInput as exc:
        return ProposalResult(f"Error ({exc.code}): {exc.message}", exc.code)
    return ProposalResult(
        f"Follow-up task proposed: {child.title} (task #{child.pk}, {child.status})", ""
    )
