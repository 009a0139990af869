"""Registry, argument parsing, schemas and operation hashing of the agent tools."""

import hashlib
import json

import pytest
from pydantic import Field

from agents.catalogue.tools import (
    RecoveryClass,
    Tool,
    ToolArgs,
    ToolContext,
    ToolError,
    ToolResult,
    UnknownTool,
    all_tools,
    canonical_arguments,
    get_tool,
    operation_hash,
    register,
    tool_names,
)
from agents.catalogue.tools.registry import _REGISTRY

pytestmark = pytest.mark.timeout(30)

BUILT_IN = {
    "list_files": RecoveryClass.READ_ONLY,
    "read_file": RecoveryClass.READ_ONLY,
    "search_files": RecoveryClass.READ_ONLY,
    "analyze_csv": RecoveryClass.READ_ONLY,
    "write_artifact": RecoveryClass.IDEMPOTENT,
    "fetch_url": RecoveryClass.EXTERNAL,
}


def test_tools_register_with_recovery_classes(db):  # tool_names() also lists MCP tools
    names = set(tool_names())
    assert set(BUILT_IN) <= names
    for name, recovery in BUILT_IN.items():
        tool = get_tool(name)
        assert tool.name == name
        assert tool.recovery_class == recovery
        assert tool.description
        assert all_tools()[name] is tool
    assert RecoveryClass.EXTERNAL == "external"


def test_the_tools_that_read_a_files_content_say_so():
    # The acceptance check "the run read the input it names" counts calls to exactly these.
    readers = {name for name, tool in all_tools().items() if tool.reads_files}
    assert readers == {"read_file", "search_files", "analyze_csv"}


def test_unknown_tool_is_a_key_error_and_a_tool_error():
    with pytest.raises(KeyError) as info:
        get_tool("rm_rf")
    assert isinstance(info.value, UnknownTool)
    assert isinstance(info.value, ToolError)
    assert info.value.code == "tool_unknown"
    assert "rm_rf" in str(info.value)


def test_registry_stays_open_for_other_tools():
    class EchoArgs(ToolArgs):
        text: str = Field(max_length=10)

    class Echo(Tool):
        name = "test_echo_tool"
        description = "echo"
        Args = EchoArgs

        def run(self, args, ctx):
            return ToolResult(text=args.text)

    try:
        register(Echo)
        tool = get_tool("test_echo_tool")
        assert tool.run(tool.parse({"text": "hi"}), None).text == "hi"

        class Other(Echo):
            pass

        with pytest.raises(ValueError):
            register(Other)
    finally:
        _REGISTRY.pop("test_echo_tool", None)


@pytest.mark.parametrize("bad", [None, [], "path=a.txt", 3])
def test_parse_refuses_non_objects(bad):
    with pytest.raises(ToolError) as info:
        get_tool("read_file").parse(bad)
    assert info.value.code == "invalid_arguments"


def test_parse_lists_every_problem_for_the_model():
    with pytest.raises(ToolError) as info:
        get_tool("read_file").parse({"start_line": 0, "max_lines": "many", "colour": "red"})
    err = info.value
    assert err.code == "invalid_arguments"
    msg = err.message
    assert "read_file" in msg
    assert "path: Field required" in msg
    assert "start_line" in msg and "greater than or equal to 1" in msg and "(got 0)" in msg
    assert "max_lines" in msg
    assert "colour: unknown argument" in msg


def test_parse_nested_errors_have_paths():
    with pytest.raises(ToolError) as info:
        get_tool("analyze_csv").parse(
            {"path": "a.csv", "filter": {"column": "x", "op": "like", "value": 1}}
        )
    assert "filter.op" in info.value.message


def test_json_schema_is_self_contained_and_forbids_extra_keys():
    for name in BUILT_IN:
        schema = get_tool(name).json_schema()
        assert schema["type"] == "object"
        assert schema["additionalProperties"] is False
        assert "$defs" not in json.dumps(schema)
        assert "$ref" not in json.dumps(schema)
    csv_schema = get_tool("analyze_csv").json_schema()
    flt = csv_schema["properties"]["filter"]
    flt_obj = next(s for s in flt["anyOf"] if s.get("type") == "object")
    assert set(flt_obj["properties"]) == {"column", "op", "value"}
    assert get_tool("read_file").json_schema()["required"] == ["path"]


def test_target_and_effect_name_the_exact_thing():
    read = get_tool("read_file")
    assert read.target(read.parse({"path": "docs/a.txt"})) == "docs/a.txt"
    assert "docs/a.txt" in read.describe_effect(read.parse({"path": "docs/a.txt"}))
    fetch = get_tool("fetch_url")
    args = fetch.parse({"url": "https://example.com/x?y=1"})
    assert fetch.target(args) == "https://example.com:443/x?y=1"  # the port it will use
    assert fetch.describe_effect(args).startswith(
        "Sends an HTTP GET request to https://example.com:443/x?y=1 (host example.com, port 443"
    )
    art = get_tool("write_artifact")
    a = art.parse({"name": "r.md", "content": "héllo", "content_type": "text/markdown"})
    assert art.target(a) == "r.md"
    assert "r.md" in art.describe_effect(a) and "6 bytes" in art.describe_effect(a)


def test_approval_reason_is_none_for_workspace_tools(tmp_path):
    ctx = ToolContext(workspace=tmp_path, artifacts_dir=tmp_path / "a")
    for name, args in [
        ("read_file", {"path": "x"}),
        ("list_files", {}),
        ("write_artifact", {"name": "x.txt", "content": ""}),
    ]:
        tool = get_tool(name)
        assert tool.approval_reason(tool.parse(args), ctx) is None


def test_context_normalises_domains():
    ctx = ToolContext(workspace="w", artifacts_dir="a", allowed_domains=(" Example.COM ", ""))
    assert ctx.allowed_domains == ("example.com",)


# --------------------------------------------------------------------------- hashing


def parsed_hash(name, arguments):
    """operation_hash takes the parsed arguments: the loop parses the model's first."""
    return operation_hash(name, get_tool(name).parse(arguments))


def test_operation_hash_same_arguments_any_key_order():
    a = {"path": "data.csv", "group_by": "region", "aggregate": {"func": "sum", "column": "x"}}
    b = {"aggregate": {"column": "x", "func": "sum"}, "group_by": "region", "path": "data.csv"}
    assert parsed_hash("analyze_csv", a) == parsed_hash("analyze_csv", b)


def test_operation_hash_applies_defaults():
    short = parsed_hash("read_file", {"path": "a.txt"})
    full = parsed_hash("read_file", {"path": "a.txt", "start_line": 1, "max_lines": 400})
    assert short == full


def test_operation_hash_changes_with_any_argument_or_tool():
    base = parsed_hash("fetch_url", {"url": "https://example.com/a"})
    assert base != parsed_hash("fetch_url", {"url": "https://example.com/b"})
    assert base != parsed_hash("fetch_url", {"url": "https://example.com/a", "max_bytes": 10})
    assert parsed_hash("read_file", {"path": "a"}) != parsed_hash("list_files", {"path": "a"})
    assert len(base) == 64 and int(base, 16) >= 0


def test_invalid_arguments_are_refused_before_any_hash():
    with pytest.raises(ToolError) as info:
        parsed_hash("read_file", {"path": "a", "bogus": 1})
    assert info.value.code == "invalid_arguments"


def test_operation_hash_is_of_the_tool_name_and_the_canonical_arguments():
    args = get_tool("read_file").parse({"path": "a.txt"})
    payload = "read_file\n" + canonical_arguments(args)
    assert operation_hash("read_file", args) == hashlib.sha256(payload.encode()).hexdigest()


def test_canonical_arguments_format():
    args = get_tool("write_artifact").parse({"name": "r.md", "content": "héllo ✓"})
    text = canonical_arguments(args)
    assert text == '{"content":"héllo ✓","content_type":"text/plain","name":"r.md"}'
    assert canonical_arguments({"b": [1, 2], "a": None}) == '{"a":null,"b":[1,2]}'


def test_tool_error_carries_code_message_and_requests():
    err = ToolError("network_limit", "used up", network_requests=3)
    assert err.code == "network_limit" and err.message == "used up"
    assert err.network_requests == 3
    assert str(err) == "network_limit: used up"
    assert err.to_dict() == {"code": "network_limit", "message": "used up", "network_requests": 3}


def test_every_raised_error_code_is_declared():
    import re
    from pathlib import Path

    from agents.catalogue.tools import ERROR_CODES

    source = "".join(
        p.read_text()
        for p in (Path(__file__).parents[2] / "agents" / "catalogue" / "tools").glob("*.py")
    )
    raised = set(re.findall(r'(?:ToolError|_refuse)\(\s*"([a-z_]+)"', source))
    assert len(raised) > 20
    assert raised <= ERROR_CODES, raised - ERROR_CODES


@pytest.mark.parametrize(
    ("arguments", "where"),
    [
        (
            {"path": "d.csv", "filter": {"column": "a", "op": "eq", "value": float("nan")}},
            "filter.value",
        ),
        ({"path": "d.csv", "preview_rows": float("inf")}, "preview_rows"),
        ({"path": "d.csv", "columns": ["a", float("-inf")]}, "columns[1]"),
    ],
)
def test_non_finite_numbers_are_invalid_arguments_and_never_hashed(arguments, where):
    tool = get_tool("analyze_csv")
    with pytest.raises(ToolError) as exc:
        tool.parse(arguments)
    assert exc.value.code == "invalid_arguments"
    assert f"- {where}: numbers must be finite" in exc.value.message
    with pytest.raises(ToolError) as exc:
        parsed_hash("analyze_csv", arguments)
    assert exc.value.code == "invalid_arguments"


def test_nan_spelled_as_a_string_is_not_a_float():
    # A float-only field would turn "NaN"/"Infinity" into a non-finite number.
    class FloatArgs(ToolArgs):
        x: float

    class FloatTool(Tool):
        name = "float_tool_for_test"
        Args = FloatArgs

    for text in ("NaN", "Infinity", "-inf"):
        with pytest.raises(ToolError) as exc:
            FloatTool().parse({"x": text})
        assert exc.value.code == "invalid_arguments" and "finite" in exc.value.message
    assert FloatTool().parse({"x": "1.5"}).x == 1.5
