"""MCP tool servers: add, test, remove (one function each), and the resolver that turns a
``SERVER__TOOL`` name into a tool from the server's recorded list.

The admin and ``manage.py acthelm_toolserver`` call these functions; the worker only reads.
"""

from __future__ import annotations

import logging
import re

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents.models import ToolServer
from agents.states import ModelTestStatus, ToolServerTransport
from agents.tools import Resolver, ToolError, add_resolver
from agents.tools.mcp import (
    QUALIFIED_NAME_RE,
    SERVER_NAME_MAX,
    SERVER_NAME_RE,
    McpTool,
    RemoteTool,
    ServerSpec,
    list_tools,
    qualified_name,
    split_name,
)
from agents.tools.registry import all_tools
from tasks.actors import Actor
from tasks.exceptions import InvalidInput

log = logging.getLogger("acthelm.toolservers")

#: The rule connections use for ``credential_env``: a variable's name, never its value.
ENV_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def validate_credential_env(value: str) -> str:
    value = (value or "").strip()
    if value and not ENV_NAME_RE.match(value):
        raise InvalidInput(
            "credential_env is the NAME of an environment variable (letters, digits, _), "
            "never the key itself"
        )
    return value


def validate_server_name(name: str) -> str:
    name = (name or "").strip()
    if not name or len(name) > SERVER_NAME_MAX or not SERVER_NAME_RE.match(name):
        raise InvalidInput(
            f"a tool server's name is 1-{SERVER_NAME_MAX} lower-case letters, digits and single "
            "underscores, starting with a letter (its tools are named SERVER__TOOL)"
        )

    if any(builtin.startswith(name + "__") for builtin in all_tools()):
        raise InvalidInput(f"{name!r} clashes with a built-in tool")
    return name


def server_spec(server: ToolServer) -> ServerSpec:
    return ServerSpec(
        name=server.name,
        transport=server.transport,
        command=tuple(server.command or ()),
        url=server.url,
        credential_env=server.credential_env,
        trusted=server.trusted,
        timeout=float(server.timeout_seconds),
        max_result_bytes=settings.ACTHELM_MCP_MAX_RESULT_BYTES,
        description_max_chars=settings.ACTHELM_MCP_DESCRIPTION_MAX_CHARS,
    )


def usable_tools(server: ToolServer) -> list[RemoteTool]:
    """The recorded tools whose ``SERVER__TOOL`` name model APIs accept."""
    out = []
    for data in server.tools or []:
        remote = RemoteTool.from_dict(data)
        if remote.name and QUALIFIED_NAME_RE.match(qualified_name(server.name, remote.name)):
            out.append(remote)
    return out


def toolserver_add(
    *,
    actor: Actor,
    name: str,
    transport: str,
    command: list[str] | None = None,
    url: str = "",
    credential_env: str = "",
    trusted: bool = False,
    timeout_seconds: float = 60,
) -> ToolServer:
    actor.require("agents.manage_toolservers")
    name = validate_server_name(name)
    if transport not in ToolServerTransport.values:
        raise InvalidInput(f"transport must be one of {', '.join(ToolServerTransport.values)}")
    command = list(command or [])
    url = (url or "").strip()
    if transport == ToolServerTransport.STDIO:
        if not command or not all(isinstance(a, str) and a for a in command):
            raise InvalidInput("a stdio tool server needs a command (an argument list)")
        url = ""
    else:
        if not re.match(r"^https?://[^\s]+$", url):
            raise InvalidInput("an http tool server needs its streamable-HTTP URL (http/https)")
        command = []
    if not timeout_seconds or timeout_seconds <= 0:
        raise InvalidInput("timeout_seconds must be positive")
    credential_env = validate_credential_env(credential_env)
    with transaction.atomic():
        if ToolServer.objects.select_for_update().filter(name=name).exists():
            raise InvalidInput(f"a tool server named {name!r} exists already")
        return ToolServer.objects.create(
            name=name,
            transport=transport,
            command=command,
            url=url,
            credential_env=credential_env,
            trusted=trusted,
            timeout_seconds=timeout_seconds,
        )


def toolserver_test(*, actor: Actor, name: str) -> dict:
    """Connect, list the server's tools and record them (with their schemas and annotations).

    A failed test keeps the tools recorded before: tasks that use them keep working once the
    server is back, and a person sees the failure on the server.
    """
    actor.require("agents.manage_toolservers")
    server = ToolServer.objects.filter(name=name).first()
    if server is None:
        raise InvalidInput(f"tool server {name!r} does not exist")
    spec = server_spec(server)
    try:  # outside any transaction: this may take the server's whole timeout
        remote = list_tools(spec)
    except ToolError as exc:
        ok, tools, message = False, None, f"{exc.code}: {exc.message}"
    else:
        ok, tools = True, [t.as_dict() for t in remote]
        skipped = [t.name for t in remote if not QUALIFIED_NAME_RE.match(f"{name}__{t.name}")]
        message = f"{len(remote)} tools listed"
        if skipped:
            message += f"; not usable (name too long or invalid): {', '.join(skipped)}"
    with transaction.atomic():
        server = ToolServer.objects.select_for_update().get(pk=server.pk)
        server.test_status = ModelTestStatus.PASSED if ok else ModelTestStatus.FAILED
        server.tested_at = timezone.now()
        server.test_message = message[:2000]
        fields = ["test_status", "tested_at", "test_message", "updated_at"]
        if tools is not None:
            server.tools = tools
            fields.append("tools")
        server.save(update_fields=fields)
    log.info("toolserver.tested", extra={"server": name, "ok": ok})
    return toolserver_as_dict(server) | {"ok": ok}


def toolserver_remove(*, actor: Actor, name: str) -> None:
    """Remove a server. Tasks naming its tools keep their list; such calls fail
    ``mcp_server_missing`` (a tool not on the registry is refused before it runs)."""
    actor.require("agents.manage_toolservers")
    deleted, _ = ToolServer.objects.filter(name=name).delete()
    if not deleted:
        raise InvalidInput(f"tool server {name!r} does not exist")


def toolserver_as_dict(server: ToolServer) -> dict:
    return {
        "name": server.name,
        "transport": server.transport,
        "command": server.command or None,
        "url": server.url or None,
        "credential_env": server.credential_env or None,
        "trusted": server.trusted,
        "timeout_seconds": server.timeout_seconds,
        "test_status": server.test_status,
        "tested_at": server.tested_at.isoformat() if server.tested_at else None,
        "test_message": server.test_message or None,
        "tools": [
            {
                "name": qualified_name(server.name, t.get("name", "")),
                "description": t.get("description") or "",
                "annotations": t.get("annotations") or {},
            }
            for t in server.tools or []
        ],
    }


# ----------------------------------------------------------------------------------------------
# Resolver: SERVER__TOOL -> McpTool, from the recorded list
# ----------------------------------------------------------------------------------------------


def find_mcp_tool(name: str) -> McpTool | None:
    parts = split_name(name)
    if parts is None:
        return None
    server_name, tool_name = parts
    server = ToolServer.objects.filter(name=server_name).first()
    if server is None:
        return None
    for remote in usable_tools(server):
        if remote.name == tool_name:
            return McpTool(server_spec(server), remote)
    return None


def mcp_tool_names() -> list[str]:
    names = []
    for server in ToolServer.objects.only("name", "tools"):
        names.extend(qualified_name(server.name, t.name) for t in usable_tools(server))
    return names


def install_resolver() -> None:
    add_resolver("mcp", Resolver(find=find_mcp_tool, names=mcp_tool_names))
