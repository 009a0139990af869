"""A provider's or a server's words never carry a credential's value into what is stored (issue
21 item 11): provider HTTP error bodies, a model CLI's stderr, an MCP tool's own error. Against
the real fakes: the scripted model server, the scripted CLI, the MCP server (stdio and HTTP)."""

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from agents.catalogue.providers import Message, ProviderError, build_provider
from agents.catalogue.tools import ToolContext, ToolError
from agents.catalogue.tools.mcp import McpTool, ServerSpec, list_tools
from tests.fakes.model_server import ScriptedModelServer, reply_error, reply_json, reply_raw

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]
CLI = str(ROOT / "tests" / "fakes" / "scripted_cli.py")
MCP = [sys.executable, "-m", "tests.fakes.mcp_server"]
SECRET = "sk-test-SECRET-0123456789abcdef"


def leaked(text: str, secret: str = SECRET) -> list[str]:
    """Every 6-character piece of the secret found in ``text``."""
    return [secret[i : i + 6] for i in range(len(secret) - 5) if secret[i : i + 6] in text]


def error_of(provider) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        provider.complete(
            model="m", messages=[Message(role="user", content="hi")], tools=[], max_tokens=8
        )
    return caught.value


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "step",
    [
        # The summary is cut at 500 characters: the cut falls inside the echoed key.
        reply_error(401, {"error": {"message": "x" * 490 + f" Incorrect API key: {SECRET}"}}),
        reply_error(500, "y" * 495 + SECRET),
        # A body that is not JSON is quoted (repr) after a cut at 200 characters.
        reply_raw(200, "z" * 190 + SECRET, "text/plain"),
        # The key inside a JSON string whose escaping differs from the raw value.
        reply_error(401, '{"error": {"message": "' + SECRET.replace("-", "\\u002d") + '"}}'),
        reply_json(200, {"error": {"message": "w" * 495 + SECRET, "code": 400}}),
    ],
)
def test_a_provider_error_body_never_keeps_a_piece_of_the_key(flavor, step):
    kind = "openai_compatible" if flavor == "openai" else "anthropic"
    with ScriptedModelServer(flavor=flavor) as server:
        server.enqueue(step)
        err = error_of(build_provider(kind, base_url=server.url, api_key=SECRET, timeout=5))
    for text in (err.message, str(err), repr(err)):
        assert leaked(text) == [], text[-120:]


@pytest.mark.parametrize(
    "stderr",
    [
        SECRET + "y" * 490,  # the 500-character tail begins inside the key
        "x" * 2000 + f" token {SECRET} END",
    ],
)
def test_a_cli_stderr_never_keeps_a_piece_of_the_key(stderr):
    provider = build_provider(
        "cli",
        command=[sys.executable, CLI, "--mode", "fail", "--stderr", stderr],
        api_key=SECRET,
        api_key_env="ACTHELM_KEY_TEST",
        timeout=10,
    )
    err = error_of(provider)
    assert leaked(err.message) == [], err.message[:120]


def test_a_cli_error_report_never_keeps_a_piece_of_the_key():
    report = json.dumps({"is_error": True, "result": "q" * 495 + SECRET})
    provider = build_provider(
        "cli",
        command=[sys.executable, CLI, "--mode", "json", "--json", report],
        answer_field="result",
        api_key=SECRET,
        timeout=10,
    )
    err = error_of(provider)
    assert leaked(err.message) == [], err.message[-120:]


# -- an MCP tool's own error ----------------------------------------------------------------------

MCP_SECRET = "stdio-s3cret-value"


@pytest.fixture
def ctx(tmp_path):
    (tmp_path / "ws").mkdir()
    return ToolContext(
        workspace=tmp_path / "ws", artifacts_dir=tmp_path / "art", cancel_event=threading.Event()
    )


@pytest.fixture(scope="module")
def http_url(tmp_path_factory):
    ready = tmp_path_factory.mktemp("mcp-http") / "ready.txt"
    proc = subprocess.Popen(
        [*MCP, "--transport", "http", "--ready-file", str(ready)],
        cwd=ROOT,
        stderr=subprocess.DEVNULL,
    )
    for _ in range(400):
        if ready.exists() and ready.read_text():
            break
        time.sleep(0.05)
    yield ready.read_text()
    proc.terminate()
    proc.wait(timeout=10)


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_an_mcp_tool_error_never_shows_the_credential(
    transport, ctx, http_url, monkeypatch, settings
):
    settings.ACTHELM_CREDENTIAL_PREFIXES = ["ACTHELM_KEY_", "MCP_TEST_"]
    monkeypatch.setenv("MCP_TEST_TOKEN", MCP_SECRET)
    if transport == "stdio":
        spec = ServerSpec(
            name="local",
            transport="stdio",
            command=tuple(MCP),
            cwd=str(ROOT),
            credential_env="MCP_TEST_TOKEN",
        )
    else:
        spec = ServerSpec(
            name="remote", transport="http", url=http_url, credential_env="MCP_TEST_TOKEN"
        )
    remote = {t.name: t for t in list_tools(spec)}["refuses_token"]
    tool = McpTool(spec, remote)
    with pytest.raises(ToolError) as err:
        tool.run(tool.parse({}), ctx)
    assert err.value.code == "mcp_tool_error"
    assert "upstream refused token [redacted]" in err.value.message
    assert leaked(err.value.message, MCP_SECRET) == []
