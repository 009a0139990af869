"""Core types shared by every agent tool.

The tools are plain Python (no Django).  The agent loop drives them like this::

    tool = get_tool(name)                      # UnknownTool (code "tool_unknown")
    args = tool.parse(raw_arguments)           # ToolError("invalid_arguments", ...)
    tool.preflight(args, ctx)                  # optional cheap static checks, ToolError
    op_hash = operation_hash(tool.name, args)  # approvals are bound to this hash
    reason = tool.approval_reason(args, ctx)   # e.g. "domain_not_allowed" or None
    ...                                        # loop decides / waits for a person
    result = tool.run(args, ctx)               # ToolResult, or raises ToolError

``run`` always repeats ``preflight`` itself, so skipping it is safe; calling it
before asking a person only avoids asking about a call that would be refused.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
import math
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError

# What the worker may do with a call that was running when it crashed: one definition, with the
# call rows' vocabulary (read-only and idempotent run again; external is never replayed).
from agents.catalogue.tools.recovery_class import RecoveryClass

# Stable error codes.  The loop may show / persist them; tests assert on them.
ERROR_CODES: frozenset[str] = frozenset(
    {
        "invalid_arguments",
        "tool_unknown",
        "cancelled",
        # paths
        "path_outside_workspace",
        "path_not_found",
        "path_is_binary",
        "path_invalid",
        "path_not_regular",
        "path_is_directory",
        "file_too_large",
        "regex_invalid",
        # csv
        "csv_malformed",
        # artifacts
        "artifact_too_large",
        "artifact_name_invalid",
        "artifact_write_failed",
        # fetch
        "url_invalid",
        "url_scheme_not_allowed",
        "url_credentials_not_allowed",
        "url_address_not_allowed",
        "url_domain_not_allowed",
        "network_limit",
        "too_many_redirects",
        "response_too_large",
        "fetch_failed",
        "fetch_timeout",
        "response_charset_invalid",
        # MCP tools (agents.catalogue.tools.mcp)
        "mcp_unreachable",
        "mcp_connection_closed",
        "mcp_timeout",
        "mcp_bad_response",
        "mcp_tool_error",
        "mcp_protocol_error",
        "mcp_server_missing",
        # an MCP tool's input schema, when its server is tested (agents.catalogue.tools.schemas)
        "schema_not_allowed",
        "schema_invalid",
        # one call's arguments cost more than a check may spend (CPU, memory, steps)
        "arguments_too_costly",
    }
)


class ToolError(Exception):
    """The single error type raised by tools.

    ``code`` is a stable machine-readable identifier, ``message`` is written for the
    model (it says what went wrong and, where possible, what to do instead).
    ``network_requests`` is how many HTTP requests the failed call had already
    made (fetch_url sets it; it is 0 for every other tool).
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        network_requests: int = 0,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.network_requests = network_requests
        self.details: dict[str, Any] = details or {}

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.network_requests:
            out["network_requests"] = self.network_requests
        if self.details:
            out["details"] = self.details
        return out


@dataclass(frozen=True)
class ToolContext:
    """Everything a tool may touch for one task.  Built by the agent loop."""

    workspace: Path
    artifacts_dir: Path
    allowed_domains: tuple[str, ...] = ()
    allow_private_network: bool = False
    # "address:port" pairs reachable although not public (ACTHELM_FETCH_ALLOW_ENDPOINTS).
    allowed_endpoints: tuple[str, ...] = ()
    max_artifact_bytes: int = 1_048_576
    network_requests_remaining: int = 8
    max_response_bytes: int = 2_000_000
    fetch_timeout: float = 20.0
    cancel_event: threading.Event | None = None
    # The run's claim counter: a file side effect refuses to replace what a newer run wrote.
    fence_token: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "workspace", Path(self.workspace))
        object.__setattr__(self, "artifacts_dir", Path(self.artifacts_dir))
        object.__setattr__(
            self,
            "allowed_domains",
            tuple(d.strip().lower() for d in self.allowed_domains if d and d.strip()),
        )

    def check_cancelled(self) -> None:
        if self.cancel_event is not None and self.cancel_event.is_set():
            raise ToolError("cancelled", "The task was cancelled while this tool was running.")


@dataclass(frozen=True)
class ArtifactWritten:
    name: str
    path: Path
    size: int
    sha256: str
    content_type: str

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "size": self.size,
            "sha256": self.sha256,
            "content_type": self.content_type,
        }


@dataclass
class ToolResult:
    text: str
    data: dict[str, Any] = field(default_factory=dict)
    network_requests: int = 0
    artifact: ArtifactWritten | None = None


class ToolArgs(BaseModel):
    """Base for every tool's ``Args`` model: unknown keys and non-finite numbers are refused."""

    # Unknown keys are refused; so are NaN and ±Infinity, even as strings ("NaN") for float
    # fields: JSON has no such numbers, and they cannot be hashed or stored as jsonb.
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def non_finite_path(value: Any) -> str | None:
    """Where ``value`` holds NaN or ±Infinity, as ``a.b[2]``; None if nowhere."""
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        if isinstance(item, float) and not math.isfinite(item):
            return path or "(arguments)"
        if isinstance(item, dict):
            stack.extend((f"{path}.{k}" if path else str(k), v) for k, v in item.items())
        elif isinstance(item, (list, tuple)):
            stack.extend((f"{path}[{i}]", v) for i, v in enumerate(item))
    return None


def _format_loc(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out or "(arguments)"


def _short_repr(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_validation_error(tool_name: str, exc: ValidationError) -> str:
    lines = [f"Invalid arguments for tool '{tool_name}':"]
    for err in exc.errors(include_url=False):
        loc = _format_loc(tuple(err.get("loc", ())))
        msg = err.get("msg", "invalid value")
        line = f"- {loc}: {msg}"
        if err.get("type") not in ("missing", "extra_forbidden") and "input" in err:
            line += f" (got {_short_repr(err['input'])})"
        elif err.get("type") == "extra_forbidden":
            line = f"- {loc}: unknown argument, not allowed"
        lines.append(line)
    return "\n".join(lines)


@functools.lru_cache(maxsize=256)
def _args_schema(args: type[BaseModel]) -> dict[str, Any]:
    """A tool's parameters schema, built once per arguments class: pydantic builds it anew on
    every call (a few ms of CPU for a run's tools, at every run's start)."""
    schema = _inline_refs(args.model_json_schema())
    schema.pop("title", None)
    schema.setdefault("type", "object")
    schema.setdefault("properties", {})
    return schema


def _inline_refs(schema: dict[str, Any]) -> dict[str, Any]:
    """Return the schema with ``$defs`` references inlined (our models are not recursive)."""
    defs = schema.get("$defs", {})

    def walk(node: Any) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                target = walk(defs[ref.split("/")[-1]])
                extra = {k: walk(v) for k, v in node.items() if k != "$ref"}
                return {**target, **extra}
            return {k: walk(v) for k, v in node.items() if k != "$defs"}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return node

    inlined: dict[str, Any] = walk(schema)  # a dict walks to a dict
    return inlined


class Tool[A: BaseModel]:
    """Base class, generic in the arguments model ``A``.  Subclasses (``class
    FetchUrl(Tool[FetchUrlArgs])``) set the class attributes, ``Args`` above all, and implement
    ``run``.  A collection of different tools holds ``Tool[Any]``.

    ``name``, ``description``, ``recovery_class`` and ``default_policy`` are set on the class by
    the built-in tools and on the instance by an MCP server's (``McpTool``).
    """

    name: str = ""
    description: str = ""
    effect: ClassVar[str] = "Runs {target}"  # template; {target} is replaced
    recovery_class: RecoveryClass = RecoveryClass.READ_ONLY
    # The policy ("allow" | "ask") a task gets for this tool when its author sets none.
    default_policy: str = "allow"
    internal: ClassVar[bool] = False  # loop-internal tools (update_plan, propose_task)
    # The tool reads a workspace file's content (listing names is not reading one): the
    # acceptance check "the run read the input it names" counts a call to it.
    reads_files: ClassVar[bool] = False
    # The tool waits on the network with a blocking client (fetch_url): a worker runs it on
    # its blocking pool, not on a step thread (`core.fibers.blocking`). An MCP tool waits on
    # the process's event loop instead; the others are a step's CPU.
    waits_on_network: ClassVar[bool] = False
    #: The arguments model (a ``ToolArgs`` subclass for the built-in tools).
    Args: type[A]

    def parse(self, arguments: dict[str, Any] | None) -> A:
        """Validate raw arguments from the model; apply defaults.  ToolError on failure."""
        if arguments is None:
            # Providers give None when the model's argument text is not a JSON object: not
            # JSON at all, another JSON value, or numbers JSON does not have (NaN, Infinity).
            raise ToolError(
                "invalid_arguments",
                f"Tool '{self.name}' needs a JSON object of arguments, and the arguments sent "
                "were not one. Send a single valid JSON object; numbers must be finite (JSON "
                "has no NaN or Infinity).",
            )
        if not isinstance(arguments, dict):
            raise ToolError(
                "invalid_arguments",
                f"Tool '{self.name}' needs a JSON object of arguments, "
                f"got {type(arguments).__name__}.",
            )
        where = non_finite_path(arguments)
        if where is not None:
            raise ToolError(
                "invalid_arguments",
                f"Invalid arguments for tool '{self.name}':\n- {where}: numbers must be finite "
                "(JSON has no NaN or Infinity)",
            )
        try:
            return self.Args.model_validate(arguments)
        except ValidationError as exc:
            raise ToolError("invalid_arguments", format_validation_error(self.name, exc)) from None

    def json_schema(self) -> dict[str, Any]:
        """JSON schema of the parameters, with references inlined, to offer the model (a copy:
        the caller may change it)."""
        return copy.deepcopy(_args_schema(self.Args))

    def definition(self) -> dict[str, Any]:
        """Convenience: name, description and parameters in one dict."""
        return {
            "name": self.name,
            "description": self.description,
            "parameters": self.json_schema(),
        }

    def target(self, args: A) -> str:
        """The exact thing this call acts on, as shown to a person (a path or URL)."""
        for attr in ("path", "url", "name"):
            if hasattr(args, attr):
                return str(getattr(args, attr))
        return ""

    def describe_effect(self, args: A) -> str:
        return self.effect.format(target=self.target(args))

    def preflight(self, args: A, ctx: ToolContext) -> None:
        """Cheap checks that need no I/O (or only local I/O); raise ToolError to refuse."""

    def approval_reason(self, args: A, ctx: ToolContext) -> str | None:
        """Why this specific call needs a person's approval whatever the policy says."""
        return None

    def run(self, args: A, ctx: ToolContext) -> ToolResult:  # pragma: no cover
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<Tool {self.name}>"


def canonical_arguments(args: BaseModel | dict[str, Any]) -> str:
    """Canonical JSON of the arguments (sorted keys, no whitespace, UTF-8 kept).

    Pass the parsed ``Args`` model so defaults are applied; a plain dict is encoded
    as it is.
    """
    data = args.model_dump(mode="json") if isinstance(args, BaseModel) else args
    return json.dumps(
        data, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def operation_hash(tool_name: str, args: BaseModel) -> str:
    """sha256 hex of ``tool_name + "\\n" + canonical_arguments``; approvals bind to it.

    ``args`` is the parsed ``Args`` model (``tool.parse(raw)``), so defaults are applied and
    ``{"path": "a"}`` hashes like ``{"path": "a", "start_line": 1, ...}``.
    """
    payload = tool_name + "\n" + canonical_arguments(args)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()
