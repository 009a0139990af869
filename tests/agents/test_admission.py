"""agents.engine.run.admission: what the model is offered of a tool (`offered_spec`).

A built-in tool's spec is made once per process and shared by every run (thousands of runs wait
at once, each offering its tools); a tool resolved for a task (an MCP tool, as the task pinned
it) is never shared, so no task offers another task's description or schema."""

import json

from agents.catalogue.providers import ToolSpec, build_provider
from agents.catalogue.tools import get_tool
from agents.catalogue.tools.mcp import McpTool, RemoteTool, ServerSpec
from agents.engine.run.admission import offered_spec


def test_a_built_in_tools_spec_is_made_once_and_is_the_tools_own():
    tool = get_tool("list_files")
    spec = offered_spec(tool)
    assert offered_spec(get_tool("list_files")) is spec
    assert spec == ToolSpec(
        name=tool.name, description=tool.description, parameters=tool.json_schema()
    )
    assert offered_spec(get_tool("read_file")).name == "read_file"


def test_requests_built_from_a_shared_spec_leave_it_as_it_was():
    """Every provider puts the shared spec into a payload of its own: what a request does with
    its payload never reaches the next run's spec."""
    spec = offered_spec(get_tool("list_files"))
    pristine = json.dumps(spec.model_dump(), sort_keys=True)
    for kind in ("openai_compatible", "anthropic"):
        provider = build_provider(kind, base_url="http://127.0.0.1:9/v1", api_key="k")
        payload = provider.payload("m", [], [spec], 10)
        wire = json.loads(json.dumps(payload))
        assert json.dumps(spec.model_dump(), sort_keys=True) == pristine
        assert "list_files" in json.dumps(wire)
    assert offered_spec(get_tool("list_files")) is spec


def test_an_mcp_tools_spec_is_the_tasks_own():
    """Two tasks pinned the same MCP tool with different texts and schemas: each run offers
    its own task's, however many runs came before."""
    server = ServerSpec(name="srv", transport="stdio", command=("x",))
    first = McpTool(server, RemoteTool("t", "first text", {"properties": {"a": {}}}))
    second = McpTool(server, RemoteTool("t", "second text", {"properties": {"b": {}}}))
    one, two = offered_spec(first), offered_spec(second)
    assert one.name == two.name == "srv__t"
    assert "first text" in one.description and "second text" in two.description
    assert set(one.parameters["properties"]) == {"a"}
    assert set(two.parameters["properties"]) == {"b"}
    assert offered_spec(first) is not one  # made for each run
