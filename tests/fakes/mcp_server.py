#!/usr/bin/env python3
"""A real MCP server written with the SDK's server side (FastMCP), for tests.

    python -m tests.fakes.mcp_server --transport stdio [--count-file calls.txt]
    python -m tests.fakes.mcp_server --transport http --port 0 --ready-file ready.txt
    python -m tests.fakes.mcp_server --schema-tools schemas.json   # {"NAME": {input schema}}

Tools:

* ``echo(text, times=1)``   the text repeated; ``readOnlyHint`` + ``idempotentHint``
* ``big(size)``             ``size`` characters of ``x``
* ``add_item(name)``        an external effect: appends the name to the count file
* ``slow_add(name)``        like add_item, but answers only once ``--release-file`` exists
* ``slow_read(text)``       claims ``readOnlyHint``; answers the text once ``--release-file`` exists
* ``hang(seconds=3600)``    sleeps; answers only if it lives that long
* ``die()``                 the server process exits at once (``os._exit``)
* ``garbage()``             (stdio) writes a line that is not JSON-RPC to stdout, then hangs
* ``fails()``               a tool error (``isError``)
* ``whoami()``              whether ``$MCP_TEST_TOKEN`` (stdio) or the bearer token (http)
                            equals ``s3cret-token``; never echoes it
* ``refuses_token()``       a tool error that echoes that credential (as careless servers do)
* with ``--schema-tools FILE``: one more tool per entry of the JSON object in FILE, listed with
  the entry's value as its input schema, whatever it holds (outside ``$ref``, loops, unknown
  types); calling one answers ``NAME ran`` (the server does not check its own schema)

The count file gets one line ``TOOL`` per call (appended and flushed before the tool acts),
so a test can prove how often a tool really ran.  The ready file receives the base URL.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import anyio
from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations

COUNT_FILE: Path | None = None
RELEASE_FILE: Path | None = None
EXPECTED_TOKEN = "s3cret-token"

server = FastMCP("acthelm-test", log_level="WARNING")


def _count(tool: str) -> None:
    if COUNT_FILE is not None:
        with COUNT_FILE.open("a") as fh:
            fh.write(tool + "\n")
            fh.flush()
            os.fsync(fh.fileno())


@server.tool(
    description="Repeat a text.",
    annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True),
)
def echo(text: str, times: int = 1) -> str:
    _count("echo")
    return text * times


@server.tool(description="Return size characters.")
def big(size: int) -> str:
    _count("big")
    return "x" * size


@server.tool(
    description="Add an item somewhere (an external effect).",
    annotations=ToolAnnotations(readOnlyHint=False, destructiveHint=False, idempotentHint=False),
)
def add_item(name: str) -> str:
    _count("add_item")
    return f"added {name}"


@server.tool(
    description="Add an item, slowly: waits until the release file exists (an external effect).",
)
async def slow_add(name: str) -> str:
    _count("slow_add")
    while RELEASE_FILE is not None and not RELEASE_FILE.exists():
        await anyio.sleep(0.05)
    return f"added {name} at last"


@server.tool(
    description="Read something, slowly: waits until the release file exists.",
    annotations=ToolAnnotations(readOnlyHint=True, idempotentHint=True),
)
async def slow_read(text: str) -> str:
    _count("slow_read")
    while RELEASE_FILE is not None and not RELEASE_FILE.exists():
        await anyio.sleep(0.05)
    return text


@server.tool(description="Sleep.")
async def hang(seconds: float = 3600) -> str:
    _count("hang")
    await anyio.sleep(seconds)
    return "woke up"


@server.tool(description="The server exits.")
def die() -> str:
    _count("die")
    os._exit(3)


@server.tool(description="Write garbage to stdout.")
def garbage() -> str:
    _count("garbage")
    sys.stdout.write("this is not json-rpc\n")
    sys.stdout.flush()
    time.sleep(3600)
    return "unreachable"


@server.tool(description="Fail.")
def fails() -> str:
    _count("fails")
    raise ValueError("the tool failed on purpose")


@server.tool(description="Check the credential.")
def whoami(ctx: Context) -> str:
    _count("whoami")
    token = os.environ.get("MCP_TEST_TOKEN")
    request = getattr(ctx.request_context, "request", None)
    if request is not None:
        header = request.headers.get("authorization", "")
        token = header.removeprefix("Bearer ") if header else None
    return "credential ok" if token == EXPECTED_TOKEN else "no credential"


@server.tool(description="Fail with an error that echoes the credential.")
def refuses_token(ctx: Context) -> str:
    _count("refuses_token")
    token = os.environ.get("MCP_TEST_TOKEN")
    request = getattr(ctx.request_context, "request", None)
    if request is not None:
        token = request.headers.get("authorization", "").removeprefix("Bearer ")
    raise ValueError(f"upstream refused token {token}")


def _add_schema_tools(path: Path) -> None:
    """Tools listed with the file's raw schemas (FastMCP would derive them from a signature)."""
    import json

    def tool_named(name: str):  # noqa: ANN202 - a FastMCP tool function
        def ran() -> str:
            _count(name)
            return f"{name} ran"

        return ran

    for name, schema in json.loads(path.read_text()).items():
        server.add_tool(
            tool_named(name), name=name, description=f"A tool with a schema of its own ({name})."
        )
        server._tool_manager.get_tool(name).parameters = schema


def main(argv: list[str] | None = None) -> int:
    global COUNT_FILE, RELEASE_FILE
    parser = argparse.ArgumentParser()
    parser.add_argument("--transport", choices=["stdio", "http"], default="stdio")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--ready-file")
    parser.add_argument("--count-file")
    parser.add_argument("--release-file", help="slow_add answers once this file exists")
    parser.add_argument("--schema-tools", help="JSON object: tool name -> its raw input schema")
    opts = parser.parse_args(argv)
    COUNT_FILE = Path(opts.count_file) if opts.count_file else None
    RELEASE_FILE = Path(opts.release_file) if opts.release_file else None
    if opts.schema_tools:
        _add_schema_tools(Path(opts.schema_tools))
    if opts.transport == "stdio":
        server.run("stdio")
        return 0

    import socket

    import uvicorn

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", opts.port))
    port = sock.getsockname()[1]
    config = uvicorn.Config(
        server.streamable_http_app(), host="127.0.0.1", port=port, log_level="warning"
    )
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    if opts.ready_file:
        Path(opts.ready_file).write_text(f"http://127.0.0.1:{port}/mcp")
    uvicorn.Server(config).run(sockets=[sock])
    return 0


if __name__ == "__main__":
    sys.exit(main())
