"""Agent tools: pure Python (no Django).  See ``base`` for how the loop drives them.

Importing this package registers the built-in tools: list_files, read_file,
search_files, analyze_csv, write_artifact, fetch_url.  Loop-internal tools
(update_plan, propose_task) register themselves with ``register`` elsewhere.
"""

from . import artifacts, csv_tool, fetch, files, plan  # noqa: F401  (import registers the tools)
from .base import (
    ERROR_CODES,
    ArtifactWritten,
    Tool,
    ToolArgs,
    ToolContext,
    ToolError,
    ToolResult,
    canonical_arguments,
    operation_hash,
)
from .fetch import host_allowed
from .files import resolve_in_workspace
from .recovery_class import RecoveryClass
from .registry import (
    Resolver,
    UnknownTool,
    add_resolver,
    all_tools,
    find_tool,
    get_tool,
    is_builtin,
    register,
    remove_resolver,
    tool_names,
    usable_tool_names,
)

__all__ = [
    "ERROR_CODES",
    "ArtifactWritten",
    "RecoveryClass",
    "Resolver",
    "Tool",
    "ToolArgs",
    "ToolContext",
    "ToolError",
    "ToolResult",
    "UnknownTool",
    "add_resolver",
    "all_tools",
    "canonical_arguments",
    "find_tool",
    "get_tool",
    "host_allowed",
    "is_builtin",
    "operation_hash",
    "register",
    "remove_resolver",
    "resolve_in_workspace",
    "tool_names",
    "usable_tool_names",
]
