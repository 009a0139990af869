"""Name -> Tool registry.

Tools register with the ``@register`` decorator on their class (an instance is
created once and shared; tools keep no per-call state).  Loop-internal tools
(``update_plan``, ``propose_task``) written elsewhere register the same way.
"""

from __future__ import annotations

from .base import Tool, ToolError

_REGISTRY: dict[str, Tool] = {}


class UnknownTool(ToolError, KeyError):
    """Raised by ``get_tool`` for a name nobody registered (code ``tool_unknown``)."""

    def __init__(self, name: str) -> None:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        super().__init__("tool_unknown", f"There is no tool named {name!r}. Known tools: {known}.")
        self.tool_name = name

    def __str__(self) -> str:  # KeyError would otherwise print the repr of its args
        return f"{self.code}: {self.message}"


def register[T: type[Tool]](cls: T) -> T:
    """Class decorator: instantiate the tool and register it under ``cls.name``."""
    if not isinstance(cls, type) or not issubclass(cls, Tool):
        raise TypeError("register() expects a Tool subclass")
    name = cls.name
    if not name or not isinstance(name, str):
        raise ValueError(f"{cls.__name__} has no tool name")
    existing = _REGISTRY.get(name)
    if existing is not None and type(existing) is not cls:
        # The same class re-registered (module reload) is fine; a different one is a bug.
        if f"{type(existing).__module__}.{type(existing).__qualname__}" != (
            f"{cls.__module__}.{cls.__qualname__}"
        ):
            raise ValueError(f"tool name {name!r} is already registered by {existing!r}")
    _REGISTRY[name] = cls()
    return cls


def get_tool(name: str) -> Tool:
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise UnknownTool(str(name)) from None


def all_tools() -> dict[str, Tool]:
    return dict(_REGISTRY)


def tool_names() -> list[str]:
    return sorted(_REGISTRY)
