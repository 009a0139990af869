"""MCP tool servers: add, test, remove (one function each), and the resolver that turns a
``SERVER__TOOL`` name into a tool from the server's recorded list.

The admin and ``manage.py acthelm_toolserver`` call these functions; the worker only reads. A
stdio server's command runs on every worker: registering or changing it is for superusers or an
executable in ACTHELM_MCP_EXECUTABLES (``stdio_refusal``), and its test never runs in the web
process. Who added and who last changed a server is recorded on the row.
"""

from __future__ import annotations

import logging
import math
import re
from typing import Any, TypedDict

from django.conf import settings
from django.db import transaction
from django.utils import timezone
from pydantic import BaseModel

from agents.catalogue.connection_rules import MAX_TIMEOUT_SECONDS as MAX_CONNECTION_TIMEOUT
from agents.catalogue.tools import Resolver, ToolContext, ToolError, ToolResult, add_resolver
from agents.catalogue.tools.mcp import (
    QUALIFIED_NAME_RE,
    SERVER_NAME_MAX,
    SERVER_NAME_RE,
    McpTool,
    RemoteTool,
    ServerSpec,
    list_tools,
    qualified_name,
    split_name,
    tool_refusal,
)
from agents.catalogue.tools.registry import all_tools
from agents.models import ToolServer
from agents.permissions import MANAGE_TOOLSERVERS
from agents.states import ModelTestStatus, ToolServerTransport
from core.actors import Actor
from core.credentials import (
    CREDENTIAL_NOT_ALLOWED,
    EXEC_PREFIX,
    CredentialRefused,
    credential_problem,
    credential_refusal,
)
from core.exceptions import ErrorCode, InvalidInput
from core.numbers import finite_number

log = logging.getLogger("acthelm.toolservers")

#: An MCP call waits at most this long (the bound of a connection's timeout).
MAX_TIMEOUT_SECONDS = MAX_CONNECTION_TIMEOUT
#: The settings an edit may change (the name is the tools' prefix: it never changes).
EDITABLE = ("transport", "command", "url", "credential_env", "trusted", "timeout_seconds")
#: A test says nothing about a server whose target, credential or trust changed: such an edit
#: makes it untested again and forgets the tools it listed.
RESETS_TEST = ("transport", "command", "url", "credential_env", "trusted")


class RunTestOnWorker(InvalidInput):
    """A stdio server's test starts its command: never in the web process."""

    error = ErrorCode.TEST_ON_WORKER


def validate_credential_env(value: str) -> str:
    """The one credential-name rule (core.credentials), as for connections."""
    value = (value or "").strip()
    problem = credential_problem(value)
    if problem:
        raise InvalidInput.passing(problem, code=CREDENTIAL_NOT_ALLOWED, field="credential_env")
    return value


def credential_destination(transport: str, command: list[str] | None, url: str) -> str:
    """Where a server's credential goes: its URL, or (stdio) its program, which gets it in its
    environment."""
    if transport == ToolServerTransport.STDIO:
        return f"{EXEC_PREFIX}{command[0] if command else ''}"
    return url


def server_credential_refusal(server: ToolServer) -> CredentialRefused | None:
    """Why the server's credential may not go to the server (its name, or a destination the
    operator did not list for it); None when it may."""
    destination = credential_destination(server.transport, server.command, server.url)
    return credential_refusal(server.credential_env, destination)


def stdio_refusal(actor: Actor, command: list[str]) -> str | None:
    """Why ``actor`` may not make ``command`` a stdio server's command: it runs on every worker
    (and wherever it is tested) with the server's environment. Superusers may; other people only
    an executable listed in ACTHELM_MCP_EXECUTABLES (``command[0]`` exactly)."""
    if not actor.is_person or actor.user.is_superuser:
        return None
    allowed = [a for a in settings.ACTHELM_MCP_EXECUTABLES if a]
    if command and command[0] in allowed:
        return None
    listed = f" (allowed: {', '.join(allowed)})" if allowed else ""
    return (
        f"only a superuser may make {command[0] if command else 'a command'!r} a stdio tool "
        f"server's command; ACTHELM_MCP_EXECUTABLES lists what others may register{listed}"
    )


class ServerSettings(TypedDict):
    """A tool server's settings as `toolserver_check` cleaned them (the row's fields)."""

    transport: str
    command: list[str]
    url: str
    credential_env: str
    timeout_seconds: float


def toolserver_check(
    *,
    actor: Actor,
    transport: str,
    command: list[str] | None = None,
    url: str = "",
    credential_env: str = "",
    timeout_seconds: float = 60,
    check_command: bool = True,
) -> ServerSettings:
    """A server's settings, checked and cleaned; InvalidInput names the field. The one validator
    behind the admin's form, the command and the services. ``check_command=False`` for an edit
    that leaves a stdio server's command and credential as they are."""
    if transport not in ToolServerTransport.values:
        raise InvalidInput(
            f"transport must be one of {', '.join(ToolServerTransport.values)}", field="transport"
        )
    command = list(command or [])
    url = (url or "").strip()
    if transport == ToolServerTransport.STDIO:
        if not command or not all(isinstance(a, str) and a for a in command):
            raise InvalidInput(
                "a stdio tool server needs a command (an argument list)", field="command"
            )
        problem = stdio_refusal(actor, command) if check_command else None
        if problem:
            raise InvalidInput(problem, code=ErrorCode.EXECUTABLE_NOT_ALLOWED, field="command")
        url = ""
    else:
        if not re.match(r"^https?://[^\s]+$", url):
            raise InvalidInput(
                "an http tool server needs its streamable-HTTP URL (http/https)", field="url"
            )
        command = []
    timeout = finite_number(timeout_seconds, name="timeout", minimum=1, maximum=MAX_TIMEOUT_SECONDS)
    credential_env = validate_credential_env(credential_env)
    # Where the credential would go, as the operator allows it (ACTHELM_CREDENTIAL_DESTINATIONS).
    refusal = credential_refusal(credential_env, credential_destination(transport, command, url))
    if refusal:
        raise InvalidInput.passing(refusal.message, code=refusal.code, field="credential_env")
    return {
        "transport": transport,
        "command": command,
        "url": url,
        "credential_env": credential_env,
        "timeout_seconds": timeout,
    }


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
        timeout=_bounded_timeout(server.timeout_seconds),
        max_result_bytes=settings.ACTHELM_MCP_MAX_RESULT_BYTES,
        description_max_chars=settings.ACTHELM_MCP_DESCRIPTION_MAX_CHARS,
        check_cpu_seconds=settings.ACTHELM_MCP_CHECK_CPU_MS / 1000,
        check_steps=settings.ACTHELM_MCP_CHECK_STEPS,
    )


def _bounded_timeout(value: float) -> float:
    """A row written before the bound (nan, infinity, 1e300) waits the default, never forever."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return 60.0
    return number if math.isfinite(number) and 0 < number <= MAX_TIMEOUT_SECONDS else 60.0


def recorded_refusal(data: dict[str, Any]) -> tuple[str, str] | None:
    """Why a recorded tool is not offered: the refusal its test recorded, or — for a tool
    recorded before schemas were checked — its schema's refusal now (``tool_refusal``)."""
    refused = data.get("refused")
    if isinstance(refused, dict):
        return str(refused.get("code") or ""), str(refused.get("message") or "")
    return tool_refusal(RemoteTool.from_dict(data))


def usable_tools(server: ToolServer) -> list[RemoteTool]:
    """The recorded tools whose ``SERVER__TOOL`` name model APIs accept and whose input schema
    stays inside itself and can be used (``recorded_refusal``): only these are offered."""
    out = []
    for data in server.tools or []:
        remote = RemoteTool.from_dict(data)
        if (
            remote.name
            and QUALIFIED_NAME_RE.match(qualified_name(server.name, remote.name))
            and recorded_refusal(data) is None
        ):
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
    actor.require(MANAGE_TOOLSERVERS)
    name = validate_server_name(name)
    values = toolserver_check(
        actor=actor,
        transport=transport,
        command=command,
        url=url,
        credential_env=credential_env,
        timeout_seconds=timeout_seconds,
    )
    person = actor.user if actor.is_person else None
    with transaction.atomic():
        if ToolServer.objects.select_for_update().filter(name=name).exists():
            raise InvalidInput(f"a tool server named {name!r} exists already", field="name")
        server = ToolServer.objects.create(
            name=name,
            trusted=bool(trusted),
            created_by=person,
            changed_by=person,
            changed_at=timezone.now(),
            **values,
        )
    log.info("toolserver.added", extra={"server": name, "actor": actor.label})
    return server


def toolserver_update(*, actor: Actor, name: str, changes: dict[str, Any]) -> ToolServer:
    """Change a server's settings (EDITABLE) with the checks of ``toolserver_add``. Changing a
    stdio server's command or credential, or making a server stdio, is a registration: for a
    superuser or an allowed executable. An edit of RESETS_TEST makes the server untested and
    forgets its tools (a task's call of them fails ``mcp_server_missing`` until a new test)."""
    actor.require(MANAGE_TOOLSERVERS)
    unknown = set(changes) - set(EDITABLE)
    if unknown:
        raise InvalidInput(f"cannot change {', '.join(sorted(unknown))} of a tool server")
    with transaction.atomic():
        server = ToolServer.objects.select_for_update().filter(name=name).first()
        if server is None:
            raise InvalidInput(f"tool server {name!r} does not exist")
        merged = {f: getattr(server, f) for f in EDITABLE} | changes
        changed = [f for f in EDITABLE if merged[f] != getattr(server, f)]
        if not changed:
            return server
        values = toolserver_check(
            actor=actor,
            transport=merged["transport"],
            command=merged["command"],
            url=merged["url"],
            credential_env=merged["credential_env"],
            timeout_seconds=merged["timeout_seconds"],
            check_command=merged["transport"] == ToolServerTransport.STDIO
            and bool({"transport", "command", "credential_env"} & set(changed)),
        )
        for field_name, value in values.items():
            setattr(server, field_name, value)
        server.trusted = bool(merged["trusted"])
        server.changed_by = actor.user if actor.is_person else None
        server.changed_at = timezone.now()
        if set(changed) & set(RESETS_TEST):
            server.test_status = ModelTestStatus.UNTESTED
            server.tested_at = None
            server.tools = []
            server.test_message = (
                f"{', '.join(changed)} changed by {actor.label}: test the server again"
            )
        server.save()
    log.info("toolserver.changed", extra={"server": name, "actor": actor.label, "fields": changed})
    return server


def toolserver_test(*, actor: Actor, name: str, in_web_process: bool = False) -> dict[str, Any]:
    """Connect, list the server's tools and record them (with their schemas and annotations).

    A failed test keeps the tools recorded before: tasks that use them keep working once the
    server is back, and a person sees the failure on the server. A stdio server is tested where
    it runs (``acthelm_toolserver test`` on a worker host): ``in_web_process`` refuses it
    (``test_on_worker``), so the web server never starts a registered command.
    """
    actor.require(MANAGE_TOOLSERVERS)
    server = ToolServer.objects.filter(name=name).first()
    if server is None:
        raise InvalidInput(f"tool server {name!r} does not exist")
    if in_web_process and server.transport == ToolServerTransport.STDIO:
        raise RunTestOnWorker(
            f"{name} is a stdio server: its test starts its command, so it runs where the "
            f"server runs — on a worker host: python manage.py acthelm_toolserver test {name}"
        )
    spec = server_spec(server)
    try:  # outside any transaction: this may take the server's whole timeout
        refusal = server_credential_refusal(server)
        if refusal:  # a row written before the rules: nothing is started or sent
            raise ToolError(refusal.code, refusal.message)
        remote = list_tools(spec)
    except ToolError as exc:
        ok, tools, message = False, None, f"{exc.code}: {exc.message}"
    else:
        ok, tools, refused = True, [], []
        for tool in remote:
            recorded = tool.as_dict()
            schema_problem = tool_refusal(tool)  # nothing is fetched or read to decide
            if schema_problem is not None:
                code, why = schema_problem
                recorded["refused"] = {"code": code, "message": why}
                refused.append(f"{tool.name} ({code}: {why})")
            tools.append(recorded)
        skipped = [t.name for t in remote if not QUALIFIED_NAME_RE.match(f"{name}__{t.name}")]
        message = f"{len(remote)} tools listed"
        if skipped:
            message += f"; not usable (name too long or invalid): {', '.join(skipped)}"
        if refused:
            message += f"; not offered (their input schema is refused): {'; '.join(refused)}"
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
    actor.require(MANAGE_TOOLSERVERS)
    deleted, _ = ToolServer.objects.filter(name=name).delete()
    if not deleted:
        raise InvalidInput(f"tool server {name!r} does not exist")


def toolserver_as_dict(server: ToolServer) -> dict[str, Any]:
    recorded = [(t, recorded_refusal(t)) for t in server.tools or [] if isinstance(t, dict)]
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
        "created_by": server.created_by.get_username() if server.created_by else None,
        "changed_by": server.changed_by.get_username() if server.changed_by else None,
        "changed_at": server.changed_at.isoformat() if server.changed_at else None,
        "tools": [
            {
                "name": qualified_name(server.name, t.get("name", "")),
                "description": t.get("description") or "",
                "annotations": t.get("annotations") or {},
            }
            for t, refusal in recorded
            if refusal is None
        ],
        # Listed by the server but never offered to a model, and why.
        "refused_tools": [
            {
                "name": qualified_name(server.name, t.get("name", "")),
                "code": refusal[0],
                "message": refusal[1],
            }
            for t, refusal in recorded
            if refusal is not None
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
    refusal = server_credential_refusal(server)
    for remote in usable_tools(server):
        if remote.name == tool_name:
            if refusal:  # a row written before the rules: the call sends nothing and says why
                return RefusedMcpTool(server_spec(server), remote, refusal)
            return McpTool(server_spec(server), remote)
    return None


class RefusedMcpTool(McpTool):
    """A recorded tool of a server whose credential breaks the rules: it fails
    ``credential_not_allowed`` (or ``credential_destination_not_allowed``) without starting,
    connecting or reading the variable."""

    def __init__(self, spec: ServerSpec, remote: RemoteTool, refusal: CredentialRefused) -> None:
        super().__init__(spec, remote)
        self.refusal = refusal

    def run(self, args: BaseModel, ctx: ToolContext) -> ToolResult:
        raise ToolError(self.refusal.code, f"MCP server {self.spec.name!r}: {self.refusal.message}")


def mcp_tool_names() -> list[str]:
    names: list[str] = []
    for server in ToolServer.objects.only("name", "tools"):
        names.extend(qualified_name(server.name, t.name) for t in usable_tools(server))
    return names


def install_resolver() -> None:
    add_resolver("mcp", Resolver(find=find_mcp_tool, names=mcp_tool_names))
