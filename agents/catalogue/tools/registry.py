"""Name -> Tool registry.

Tools register with the ``@register`` decorator on their class (an instance is
created once and shared; tools keep no per-call state).  Loop-internal tools
(``update_plan``, ``propose_task``) written elsewhere register the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .base import Tool, ToolError

_REGISTRY: dict[str, Tool[Any]] = {}


@dataclass(frozen=True)
class Resolver:
    """Tools that exist outside this process's code, e.g. an MCP server's (``SERVER__TOOL``).

    ``find(name)`` returns a Tool or None; ``names()`` lists every name it can resolve now.
    Installed by the app that knows where such tools are recorded
    (``agents.catalogue.toolservers``).
    """

    find: Callable[[str], Tool[Any] | None]
    names: Callable[[], Iterable[str]]


_RESOLVERS: dict[str, Resolver] = {}


def add_resolver(key: str, resolver: Resolver) -> None:
    _RESOLVERS[key] = resolver


def remove_resolver(key: str) -> None:
    _RESOLVERS.pop(key, None)


def find_tool(name: object) -> Tool[Any] | None:
    """The tool registered or resolvable under ``name``, or None (also for a name that is not
    a string, e.g. from JSON nobody checked)."""
    if not isinstance(name, str):
        return None
    tool = _REGISTRY.get(name)
    if tool is not None:
        return tool
    for resolver in _RESOLVERS.values():
        tool = resolver.find(name)
        if tool is not None:
            return tool
    return None


class UnknownTool(ToolError, KeyError):
    """Raised by ``get_tool`` for a name nobody registered (code ``tool_unknown``)."""

    def __init__(self, name: str) -> None:
        # Built-in names only: this message must not need the database (MCP tools are listed by
        # tool_names(), and the task's list says what the model may call).
        known = ", ".join(sorted(_REGISTRY)) or "none"
        super().__init__("tool_unknown", f"There is no tool named {name!r}. Known tools: {known}.")
        self.tool_name = name

    def __str__(self) -> str:  # KeyError would otherwise print the repr of its args
        return f"{self.code}: {self.message}"


def register[T: type[Tool[Any]]](cls: T) -> T:
    """Class decorator: instantiate the tool and register it under ``cls.name``."""
    if not isinstance(cls, type) or not issubclass(cls, Tool):
        raise TypeError("register() expects a Tool subclass")
    name = cls.name
    if not name or not isinstance(name, str):
        raise ValueError(f"{cls.__name__} has no tool name")
    existing = _REGISTRY.get(name)
    # The same class re-registered (module reload) is fine; a different one is a bug.
    if (
        existing is not None
        and type(existing) is not cls
        and f"{type(existing).__module__}.{type(existing).__qualname__}"
        != f"{cls.__module__}.{cls.__qualname__}"
    ):
        raise ValueError(f"tool name {name!r} is already registered by {existing!r}")
    _REGISTRY[name] = cls()
    return cls


def is_builtin(tool: Tool[Any]) -> bool:
    """Whether `tool` is the registry's own object for its name (a built-in tool: the same for
    every task), not one resolved for a task (an MCP server's)."""
    return _REGISTRY.get(getattr(tool, "name", None)) is tool  # type: ignore[arg-type]


def get_tool(name: str) -> Tool[Any]:
    tool = find_tool(name)
    if tool is None:
        raise UnknownTool(str(name))
    return tool


def all_tools() -> dict[str, Tool[Any]]:
    return dict(_REGISTRY)


def tool_names() -> list[str]:
    """Every usable tool name: the built-in ones and those the resolvers know now."""
    names = set(_REGISTRY)
    for resolver in _RESOLVERS.values():
        names.update(resolver.names())
    return sorted(names)


def usable_tool_names(names: Iterable[str]) -> list[str]:
    """Those of `names` that `tool_names` lists, in their order. A built-in name is always
    usable: the resolvers (an MCP server's recorded list, read from the database) are asked only
    when a name is not built in."""
    wanted = list(names)
    if all(name in _REGISTRY for name in wanted):
        return wanted
    known = set(tool_names())
    return [name for name in wanted if name in known]
