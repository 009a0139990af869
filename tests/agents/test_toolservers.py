"""Registering MCP tool servers, recording their tools, and SERVER__TOOL names in tasks."""

import json
import sys
from pathlib import Path

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction

from agents.catalogue.tools import (
    RecoveryClass,
    UnknownTool,
    find_tool,
    get_tool,
    operation_hash,
    tool_names,
    usable_tool_names,
)
from agents.catalogue.tools.mcp import McpTool
from agents.catalogue.toolservers import (
    toolserver_add,
    toolserver_as_dict,
    toolserver_remove,
    toolserver_test,
)
from agents.engine.run.intake import task_create
from agents.models import ToolServer
from core.actors import Actor
from core.exceptions import InvalidInput, NotPermitted
from tests.factories import UserFactory
from tests.fakes.http_target import HttpTarget

ROOT = Path(__file__).resolve().parents[2]
SERVER = [sys.executable, "-m", "tests.fakes.mcp_server"]


@pytest.fixture(autouse=True)
def allowed_executables(settings):
    """The fake server's interpreter (and "x") are what an operator allowed (issue 21 item 3)."""
    settings.ACTHELM_MCP_EXECUTABLES = [sys.executable, "x"]


@pytest.fixture
def ops(db):
    return Actor.person(
        UserFactory(
            username="tools-ops",
            perms=["agents.manage_toolservers", "tasks.operate_task", "tasks.close_task"],
        )
    )


@pytest.fixture
def tested_server(ops):
    toolserver_add(actor=ops, name="local", transport="stdio", command=SERVER, timeout_seconds=20)
    result = toolserver_test(actor=ops, name="local")
    assert result["ok"], result
    return ToolServer.objects.get(name="local")


@pytest.mark.parametrize(
    "name", ["", "Local", "a__b", "_a", "a_", "1a", "a-b", "x" * 31, "a b", "list__"]
)
def test_server_name_must_be_a_safe_identifier(ops, name):
    with pytest.raises(InvalidInput):
        toolserver_add(actor=ops, name=name, transport="stdio", command=["x"])


@pytest.mark.parametrize("env", ["sk-abc123", "MY KEY", "A=B", "1ABC", "$TOKEN"])
def test_credential_env_is_a_name_not_a_value(ops, env):
    with pytest.raises(InvalidInput, match="NAME of an environment variable"):
        toolserver_add(actor=ops, name="s", transport="stdio", command=["x"], credential_env=env)


def test_transport_needs_its_target(ops):
    with pytest.raises(InvalidInput, match="command"):
        toolserver_add(actor=ops, name="s", transport="stdio")
    with pytest.raises(InvalidInput, match="URL"):
        toolserver_add(actor=ops, name="s", transport="http", url="ftp://x")
    with pytest.raises(InvalidInput, match="transport"):
        toolserver_add(actor=ops, name="s", transport="ws", url="http://x")


def test_database_refuses_an_unsafe_name(db):
    with pytest.raises(IntegrityError), transaction.atomic():
        ToolServer.objects.create(name="a__b", transport="stdio", command=["x"])


def test_adding_needs_the_permission(db):
    nobody = Actor.person(UserFactory(username="nobody"))
    with pytest.raises(NotPermitted):
        toolserver_add(actor=nobody, name="s", transport="stdio", command=["x"])


def test_test_records_tools_and_the_registry_resolves_them(tested_server):
    recorded = {t["name"]: t for t in tested_server.tools}
    assert recorded["echo"]["input_schema"]["required"] == ["text"]
    assert recorded["echo"]["annotations"]["readOnlyHint"] is True
    assert tested_server.test_status == "passed" and tested_server.tested_at

    tool = get_tool("local__echo")
    assert isinstance(tool, McpTool)
    assert tool.json_schema()["required"] == ["text"]
    assert tool.recovery_class == RecoveryClass.EXTERNAL  # untrusted: hints ignored
    assert "local__echo" in tool_names() and "read_file" in tool_names()
    # the arguments, parsed against the server's schema, hash like a built-in tool's
    digest = operation_hash("local__echo", tool.parse({"text": "a"}))
    assert digest == operation_hash("local__echo", tool.parse({"text": "a"}))
    assert digest != operation_hash("local__echo", tool.parse({"text": "b"}))
    with pytest.raises(UnknownTool):
        get_tool("local__nope")
    with pytest.raises(UnknownTool):
        get_tool("elsewhere__echo")


def test_usable_tool_names_reads_the_servers_only_for_a_name_not_built_in(tested_server):
    from django.db import connection

    statements: list[str] = []

    def counted(execute, sql, params, many, context):
        statements.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(counted):
        assert usable_tool_names(["read_file", "list_files"]) == ["read_file", "list_files"]
        assert usable_tool_names([]) == []
        assert statements == []
        names = ["local__echo", "read_file", "local__nope", "elsewhere__echo"]
        assert usable_tool_names(names) == ["local__echo", "read_file"]
    assert len(statements) == 1


def test_trusted_server_maps_hints(ops, tested_server):
    ToolServer.objects.filter(pk=tested_server.pk).update(trusted=True)
    assert get_tool("local__echo").recovery_class == RecoveryClass.READ_ONLY
    assert get_tool("local__add_item").recovery_class == RecoveryClass.EXTERNAL


def test_failed_test_keeps_the_recorded_tools(ops, tested_server):
    ToolServer.objects.filter(pk=tested_server.pk).update(command=["/nonexistent/server"])
    result = toolserver_test(actor=ops, name="local")
    assert not result["ok"]
    server = ToolServer.objects.get(pk=tested_server.pk)
    assert server.test_status == "failed"
    assert server.test_message.startswith("mcp_unreachable")
    assert {t["name"] for t in server.tools} >= {"echo"}


def test_task_tool_list_accepts_recorded_mcp_tools_and_defaults_them_to_ask(ops, tested_server):
    task = task_create(
        actor=ops,
        title="t",
        instruction="i",
        tools=["read_file", "local__echo", "local__add_item"],
        tool_policies={"local__add_item": "allow"},
    )
    assert task.tools == ["read_file", "local__echo", "local__add_item"]
    # The untrusted server's tool asks; what the person set explicitly is kept.
    assert task.tool_policies == {"local__echo": "ask", "local__add_item": "allow"}
    assert task.limit_mcp_calls == 20 and task.limit_cost is None


@pytest.mark.parametrize("name", ["local__nope", "other__echo", "local__"])
def test_task_tool_list_refuses_unrecorded_mcp_tools(ops, tested_server, name):
    with pytest.raises(InvalidInput, match="unknown tools"):
        task_create(actor=ops, title="t", instruction="i", tools=[name])


def test_removing_a_server_removes_its_tools(ops, tested_server):
    toolserver_remove(actor=ops, name="local")
    assert find_tool("local__echo") is None
    assert "local__echo" not in tool_names()
    with pytest.raises(InvalidInput):
        toolserver_remove(actor=ops, name="local")


# -- a tool's schema stays inside itself (issue 32 item 1) -------------------------------------

LEAKED = {"type": "integer", "const": "LEAKED-FROM-OUTSIDE"}


def test_a_tool_whose_schema_reaches_outside_is_refused_at_the_test_and_never_offered(
    ops, tmp_path
):
    """The server's other tools are offered; the refused ones are shown with their reason, and
    nothing is fetched or read while deciding."""
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps(LEAKED))
    with HttpTarget() as outside:
        outside.route("/meta", body=json.dumps(LEAKED), content_type="application/json")
        schemas = tmp_path / "schemas.json"
        schemas.write_text(
            json.dumps(
                {
                    "reach": {
                        "type": "object",
                        "properties": {"x": {"$ref": outside.url + "/meta"}},
                    },
                    "peek": {"type": "object", "properties": {"x": {"$ref": secret.as_uri()}}},
                    "rebased": {
                        "$id": outside.url + "/",
                        "type": "object",
                        "properties": {"x": {"$ref": "meta"}},
                    },
                    "oddtype": {"type": "object", "properties": {"x": {"type": "frobnicate"}}},
                }
            )
        )
        toolserver_add(
            actor=ops,
            name="odd",
            transport="stdio",
            command=[*SERVER, "--schema-tools", str(schemas)],
            timeout_seconds=20,
        )
        result = toolserver_test(actor=ops, name="odd")
        names = tool_names()
        for name in ("odd__reach", "odd__peek", "odd__rebased", "odd__oddtype"):
            with pytest.raises(UnknownTool):
                get_tool(name)
        with pytest.raises(InvalidInput, match="unknown tools"):
            task_create(actor=ops, title="t", instruction="i", tools=["odd__reach"])
        assert outside.total == 0
    assert result["ok"] and result["test_status"] == "passed"
    refused = {t["name"]: t["code"] for t in result["refused_tools"]}
    assert refused == {
        "odd__reach": "schema_not_allowed",
        "odd__peek": "schema_not_allowed",
        "odd__rebased": "schema_not_allowed",
        "odd__oddtype": "schema_invalid",
    }
    assert "odd__echo" in names and not set(refused) & set(names)
    assert "odd__echo" in [t["name"] for t in result["tools"]]
    assert not set(refused) & {t["name"] for t in result["tools"]}
    message = result["test_message"]
    assert "not offered" in message and "reach (schema_not_allowed" in message
    assert "LEAKED" not in json.dumps(result)
    assert get_tool("odd__echo").parse({"text": "hi"})


def test_a_tool_recorded_before_schemas_were_checked_is_not_offered(ops):
    """A row written by an older test still holds the tool: it is refused when read."""
    ToolServer.objects.create(
        name="old",
        transport="stdio",
        command=["x"],
        test_status="passed",
        tools=[
            {"name": "fine", "input_schema": {"type": "object"}},
            {
                "name": "reach",
                "input_schema": {"properties": {"x": {"$ref": "http://169.254.169.254/x"}}},
            },
        ],
    )
    assert "old__fine" in tool_names() and "old__reach" not in tool_names()
    assert find_tool("old__reach") is None
    [shown] = toolserver_as_dict(ToolServer.objects.get(name="old"))["refused_tools"]
    assert (shown["name"], shown["code"]) == ("old__reach", "schema_not_allowed")


# -- manage.py acthelm_toolserver, end to end --------------------------------------------------


def run(*args) -> dict | list:
    from io import StringIO

    out = StringIO()
    call_command("acthelm_toolserver", "--json", "--user", "tools-ops", *args, stdout=out)
    return json.loads(out.getvalue())


def test_command_add_test_list_remove(ops):
    added = run(
        "add", "cmd", "--transport", "stdio", "--command", json.dumps(SERVER), "--timeout", "20"
    )
    assert added["name"] == "cmd" and added["tools"] == [] and added["trusted"] is False
    tested = run("test", "cmd")
    assert tested["ok"] is True
    assert "cmd__echo" in {t["name"] for t in tested["tools"]}
    listed = run("list")
    assert [s["name"] for s in listed] == ["cmd"]
    assert listed[0]["test_status"] == "passed"
    assert run("remove", "cmd") == {"ok": True, "removed": "cmd"}
    assert run("list") == []


def test_command_refuses_bad_input_with_a_code(ops):
    from io import StringIO

    out = StringIO()
    with pytest.raises(CommandError, match="invalid_input"):
        call_command(
            "acthelm_toolserver",
            "--json",
            "--user",
            "tools-ops",
            "add",
            "a__b",
            "--transport",
            "stdio",
            "--command",
            "x",
            stdout=out,
        )
    assert json.loads(out.getvalue())["error"] == "invalid_input"


def test_command_test_of_a_dead_server_exits_nonzero(ops):
    run("add", "dead", "--transport", "http", "--url", "http://127.0.0.1:9/mcp", "--timeout", "5")
    with pytest.raises(SystemExit) as exc:
        run("test", "dead")
    assert exc.value.code == 1
    assert ToolServer.objects.get(name="dead").test_status == "failed"


# -- who changes a server, and what an edit resets (issue 21 item 3) ---------------------------


def test_a_person_without_superuser_status_registers_only_allowed_executables(ops, settings):
    settings.ACTHELM_MCP_EXECUTABLES = []
    with pytest.raises(InvalidInput) as refused:
        toolserver_add(actor=ops, name="s", transport="stdio", command=["sh", "-c", "id"])
    assert refused.value.code == "executable_not_allowed" and refused.value.field == "command"
    root = Actor.person(UserFactory(username="root", is_superuser=True))
    assert toolserver_add(actor=root, name="s", transport="stdio", command=["sh", "-c", "id"])


def test_an_edit_records_who_and_resets_the_test_only_for_what_it_reaches(ops, tested_server):
    from agents.catalogue.toolservers import toolserver_update

    assert tested_server.created_by == ops.user
    server = toolserver_update(actor=ops, name="local", changes={"timeout_seconds": 30})
    assert server.test_status == "passed" and server.tools  # a timeout says nothing new
    server = toolserver_update(actor=ops, name="local", changes={"trusted": True})
    assert (server.test_status, server.tools, server.tested_at) == ("untested", [], None)
    assert server.changed_by == ops.user and "trusted changed by tools-ops" in server.test_message
    with pytest.raises(UnknownTool):
        get_tool("local__echo")


def test_an_edit_to_a_shell_is_refused_and_changes_nothing(ops, tested_server, settings):
    from agents.catalogue.toolservers import toolserver_update

    settings.ACTHELM_MCP_EXECUTABLES = [sys.executable]
    with pytest.raises(InvalidInput) as refused:
        toolserver_update(actor=ops, name="local", changes={"command": ["sh", "-c", "id"]})
    assert refused.value.code == "executable_not_allowed"
    assert ToolServer.objects.get(name="local").command == SERVER


@pytest.mark.parametrize("timeout", ["nan", "inf", "1e300", "0"])
def test_command_refuses_a_timeout_that_is_not_a_bounded_number(ops, timeout):
    from io import StringIO

    out = StringIO()
    with pytest.raises(CommandError):
        call_command(
            "acthelm_toolserver",
            "--json",
            "--user",
            "tools-ops",
            "add",
            "slow",
            "--transport",
            "stdio",
            "--command",
            json.dumps(SERVER),
            "--timeout",
            timeout,
            stdout=out,
        )
    assert json.loads(out.getvalue())["error"] in {"invalid_input", "number_out_of_range"}
    assert not ToolServer.objects.exists()


def test_command_takes_json_after_the_action_too(ops, tested_server):
    from io import StringIO

    out = StringIO()
    call_command("acthelm_toolserver", "--user", "tools-ops", "list", "--json", stdout=out)
    assert [s["name"] for s in json.loads(out.getvalue())] == ["local"]


@pytest.mark.parametrize("timeout", [float("nan"), float("inf"), 1e300])
def test_an_old_row_with_an_unbounded_timeout_is_tested_without_a_traceback(ops, timeout):
    ToolServer.objects.create(
        name="old", transport="http", url="http://127.0.0.1:9/mcp", timeout_seconds=timeout
    )
    result = toolserver_test(actor=ops, name="old")
    assert result["ok"] is False and result["test_message"].startswith("mcp_unreachable")
