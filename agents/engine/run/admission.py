"""The admission rules: what every tool call passes before it runs, whether a model asked for it
(the run's loop, `agents.engine.run.rounds`) or a person edited its arguments before approving it
(`agents.actions.decisions.approval_approve`). One set of checks, not a copy per caller.

A call's arguments are parsed against the tool's model or schema (`parse_operation`; an MCP tool
as the task pinned it at first use, `pinned_tool`), hashed as the approval binds them and in the
order jsonb stores them (`jsonb_order`); a call that needs a person first says why
(`approval_reason`). Pure: no SQL, no model call.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from django.conf import settings

from agents.catalogue.providers import ToolSpec
from agents.catalogue.tools import Tool, ToolContext, ToolError, is_builtin, operation_hash
from agents.catalogue.tools.mcp import McpTool, RemoteTool
from agents.catalogue.tools.schemas import stop_checks_when
from approvals.services import ApprovalRequest
from approvals.states import ApprovalReason
from tasks.states import ToolPolicy
from tasks.workspace import artifacts_dir, workspace_dir

if TYPE_CHECKING:
    from pydantic import BaseModel

    from tasks.models import Task

__all__ = [
    "CallVerdict",
    "Decision",
    "approval_reason",
    "approval_request",
    "jsonb_order",
    "offered_spec",
    "parse_operation",
    "pinned_tool",
    "refuse",
    "task_tool_context",
]


class CallVerdict(enum.StrEnum):
    """What the checks make of one tool call (`AgentLoop._admit`)."""

    RUN = "run"
    REFUSE = "refuse"
    ASK = "ask"  # a person approves it first


@dataclass(frozen=True)
class Decision:
    """What to do with one tool call: run it, refuse it, or ask a person. A refusal has a code
    and a message; a call to run or to ask about has its tool and parsed arguments."""

    verdict: CallVerdict
    tool: Tool[Any] | None = None
    args: BaseModel | None = None
    hash: str = ""
    canonical: dict[str, Any] | None = None
    code: str = ""
    message: str = ""
    reason: str = ""

    def operation(self) -> tuple[Tool[Any], BaseModel]:
        """The tool and its parsed arguments, which a decision to run or to ask has."""
        if self.tool is None or self.args is None:
            raise ValueError(f"a decision to {self.verdict} names no operation")
        return self.tool, self.args


def refuse(code: str, message: str) -> Decision:
    return Decision(CallVerdict.REFUSE, code=code, message=message)


def parse_operation(
    tool: Tool[Any],
    arguments: dict[str, Any] | None,
    *,
    should_stop: Callable[[], bool] | None = None,
) -> Decision:
    """The arguments valid against the tool's model or schema (an MCP tool's, offline, within
    its budget: ``arguments_too_costly`` past it), hashed as the approval binds them and in the
    order jsonb stores them: a decision to run, or a refusal. A schema check that
    ``should_stop`` stops raises ``CheckStopped``."""
    try:
        with stop_checks_when(should_stop):
            args = tool.parse(arguments)
        digest = operation_hash(tool.name, args)
        canonical = args.model_dump(mode="json")
    except ToolError as exc:
        return refuse(exc.code, exc.message)
    except (ValueError, TypeError) as exc:  # e.g. NaN in the arguments: no hash, no jsonb
        return refuse("invalid_arguments", f"the arguments cannot be used: {exc}")
    except RecursionError:  # arguments nested too deep to hash: a refusal, not a crash
        return refuse("invalid_arguments", "the arguments are nested too deeply")
    return Decision(
        CallVerdict.RUN, tool=tool, args=args, hash=digest, canonical=jsonb_order(canonical)
    )


def approval_reason(task: Task, tool: Tool[Any], args: BaseModel, ctx: ToolContext) -> str | None:
    """Why a call needs a person first, or None: the task's policy for the tool, else the tool's
    own default (an MCP tool of an untrusted server asks); then the tool's own reason (a domain
    outside the task's allowed list)."""
    policy = task.tool_policies.get(tool.name) or getattr(tool, "default_policy", ToolPolicy.ALLOW)
    if policy == ToolPolicy.ASK:
        return ApprovalReason.POLICY_ASK
    if tool.approval_reason(args, ctx):
        return ApprovalReason.DOMAIN_NOT_ALLOWED
    return None


def approval_request(d: Decision) -> ApprovalRequest:
    """What a person is asked to approve: the operation a decision to ask names."""
    tool, args = d.operation()
    return {
        "tool": tool.name,
        "target": tool.target(args),
        "arguments": d.canonical,
        "arguments_hash": d.hash,
        "reason": d.reason,
        "effect": tool.describe_effect(args),
    }


def task_tool_context(task: Task, **run: Any) -> ToolContext:
    """What a tool may touch for `task`: its folders, its domains, the egress settings, its
    artifact size; `run` adds what only a running attempt has (its fence, its cancel event)."""
    return ToolContext(
        workspace=workspace_dir(task.pk),
        artifacts_dir=artifacts_dir(task.pk),
        allowed_domains=tuple(task.allowed_domains),
        allow_private_network=settings.ACTHELM_FETCH_ALLOW_PRIVATE,
        allowed_endpoints=tuple(settings.ACTHELM_FETCH_ALLOW_ENDPOINTS),
        max_artifact_bytes=task.limit_artifact_bytes,
        **run,
    )


def pinned_tool(tool: Tool[Any], pins: dict[str, Any]) -> Tool[Any]:
    """An MCP tool as the task pinned it at first use (description, schema, annotations), so
    its arguments are checked against what the task's model read; any other tool as it is."""
    if isinstance(tool, McpTool) and tool.name in pins:
        return McpTool(tool.spec, RemoteTool.from_dict(pins[tool.name]))
    return tool


#: The spec of each built-in tool, made once per process and offered by every run: a built-in
#: tool's name, description and schema are its class's, the same for every task. Read-only: the
#: providers put it into each request's own payload and change nothing of it.
_BUILTIN_SPECS: dict[str, tuple[Tool[Any], ToolSpec]] = {}


def offered_spec(tool: Tool[Any]) -> ToolSpec:
    """What the model is offered of `tool`: a built-in tool's spec shared by the runs, any other
    (an MCP tool, as its task pinned it) made for the run."""
    if not is_builtin(tool):
        return ToolSpec(name=tool.name, description=tool.description, parameters=tool.json_schema())
    made = _BUILTIN_SPECS.get(tool.name)
    if made is None or made[0] is not tool:  # a tool registered again (a reload) gets its own
        spec = ToolSpec(name=tool.name, description=tool.description, parameters=tool.json_schema())
        made = _BUILTIN_SPECS[tool.name] = (tool, spec)
    return made[1]


def jsonb_order(value: Any) -> Any:
    """`value` with its keys in the order PostgreSQL's jsonb keeps them (shorter keys first),
    so that the history this run keeps in memory is sent exactly as a later run, reading it
    back from the database, sends it."""
    if isinstance(value, dict):
        keys = sorted(value, key=lambda k: (len(k.encode()), k.encode()))
        return {k: jsonb_order(value[k]) for k in keys}
    if isinstance(value, list):
        return [jsonb_order(v) for v in value]
    return value
