"""Self-tests of the reusable fakes: the scripted model server (in-process and as a separate
process) and the scripted CLI. Django-free."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from agents.catalogue.providers import Message, ProviderError, build_provider
from tests.fakes.model_server import (
    ScriptedModelServer,
    hang,
    reply_text,
    step_from_dict,
    trickle,
)

pytestmark = pytest.mark.timeout(20)

ROOT = Path(__file__).resolve().parents[2]
FAKES = ROOT / "tests" / "fakes"


def ask(provider, text: str = "hi", **kwargs):
    return provider.complete(
        model="test-model",
        messages=[Message(role="user", content=text)],
        tools=[],
        max_tokens=50,
        **kwargs,
    )


def wait_for_file(path: Path, timeout: float = 10.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.read_text():
            return path.read_text()
        time.sleep(0.02)
    raise AssertionError(f"{path} not written within {timeout} s")


def test_callable_steps_and_default():
    seen = []

    def step(request):
        seen.append(request["messages"][-1]["content"])
        return {"type": "text", "text": "from callable"}

    with ScriptedModelServer([step], default=reply_text("fallback")) as server:
        provider = build_provider("openai_compatible", base_url=server.url)
        assert ask(provider, "one").text == "from callable"
        assert ask(provider, "two").text == "fallback"
        assert seen == ["one"] and server.remaining_steps == 0
        assert len(server.completion_requests) == 2


def test_hang_then_answers_and_trickle_completes_with_long_timeout():
    with ScriptedModelServer([hang(0.2, then=reply_text("late")), trickle(2000, 600)]) as server:
        provider = build_provider("openai_compatible", base_url=server.url, timeout=5)
        assert ask(provider).text == "late"
        assert ask(provider).text == "trickled"
        assert not server.aborted.is_set()


@pytest.mark.parametrize("keep_alive", [False, True])
def test_a_keep_alive_server_answers_again_on_the_same_connection(keep_alive):
    """bench/model_server.py keeps connections as a deployed server does; the tests' default
    closes each (its hangs and trickles are delimited by the close)."""
    import socket

    body = json.dumps({"model": "test-model", "messages": [{"role": "user", "content": "hi"}]})
    request = (
        f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n{body}"
    ).encode()
    with ScriptedModelServer(keep_alive=keep_alive) as server:
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as sock:
            answers = []
            replies = sock.makefile("rb")
            for _ in range(2):
                try:
                    sock.sendall(request)
                    status, length = replies.readline(), 0
                    while (line := replies.readline()) not in (b"\r\n", b""):
                        if line.lower().startswith(b"content-length:"):
                            length = int(line.split(b":")[1])
                    replies.read(length)
                    answers.append(status)
                except (OSError, IndexError):
                    answers.append(b"")
        assert answers[0].startswith(b"HTTP/1.")
        assert answers[1].startswith(b"HTTP/1.1 200") is keep_alive
        assert len(server.completion_requests) == (2 if keep_alive else 1)


def test_models_endpoint_and_unknown_routes():
    with ScriptedModelServer(context_length=1234, model_ids=["a", "b"]) as server:
        models = httpx.get(server.url + "/models").json()
        assert [(m["id"], m["context_length"]) for m in models["data"]] == [
            ("a", 1234),
            ("b", 1234),
        ]
        assert httpx.post(server.root_url + "/nope", json={}).status_code == 404
        assert server.remaining_steps == 0
    with ScriptedModelServer(flavor="anthropic") as server:
        assert server.url == server.root_url
        response = httpx.post(server.url + "/v1/messages", json={"model": "m"}).json()
        assert response["content"] == [{"type": "text", "text": "done"}]


def test_step_from_dict_validates():
    with pytest.raises(ValueError):
        step_from_dict({"type": "bogus"})
    with pytest.raises(ValueError):
        step_from_dict({"text": "no type"})
    step = step_from_dict({"type": "hang", "seconds": 1, "then": {"type": "text", "text": "x"}})
    assert step.then.text == "x"


def test_wait_for_requests_from_another_thread():
    with ScriptedModelServer() as server:
        provider = build_provider("openai_compatible", base_url=server.url)
        threading.Thread(target=lambda: (time.sleep(0.2), ask(provider)), daemon=True).start()
        assert server.wait_for_requests(1, timeout=5)
        assert not server.wait_for_requests(2, timeout=0.2)


def test_standalone_server_process(tmp_path):
    script = tmp_path / "script.json"
    script.write_text(
        json.dumps(
            [
                {"type": "text", "text": "scripted hello"},
                {"type": "tool_calls", "calls": [{"name": "ping", "arguments": {"n": 1}}]},
                {"type": "error", "status": 429, "body": {"error": {"message": "slow down"}}},
                {"type": "hang", "seconds": 30},
            ]
        )
    )
    ready = tmp_path / "ready.txt"
    record = tmp_path / "record.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fakes.model_server",
            "--flavor",
            "openai",
            "--port",
            "0",
            "--script",
            str(script),
            "--ready-file",
            str(ready),
            "--record",
            str(record),
        ],
        cwd=ROOT,
    )
    try:
        url = wait_for_file(ready)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        provider = build_provider("openai_compatible", base_url=url, api_key="k-123456")
        assert ask(provider).text == "scripted hello"
        assert ask(provider).tool_calls[0].arguments == {"n": 1}
        with pytest.raises(ProviderError) as info:
            ask(provider)
        assert info.value.code == "provider_rate_limited"
        event = threading.Event()
        threading.Timer(0.3, event.set).start()
        with pytest.raises(ProviderError) as info:
            ask(provider, cancel_event=event)
        assert info.value.code == "provider_cancelled"
        end = time.monotonic() + 3
        while time.monotonic() < end and '"abort"' not in record.read_text():
            time.sleep(0.05)
        lines = [json.loads(line) for line in record.read_text().splitlines()]
        requests = [line for line in lines if line["event"] == "request"]
        assert len(requests) == 4
        assert requests[0]["path"] == "/v1/chat/completions"
        assert requests[0]["json"]["messages"] == [{"role": "user", "content": "hi"}]
        assert requests[0]["headers"]["authorization"] == "Bearer k-123456"
        assert [line["event"] for line in lines].count("abort") == 1
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=5) == 0


def test_standalone_server_runs_as_plain_script(tmp_path):
    ready = tmp_path / "ready.txt"
    proc = subprocess.Popen(
        [
            sys.executable,
            str(FAKES / "model_server.py"),
            "--flavor",
            "anthropic",
            "--ready-file",
            str(ready),
            "--default",
            '{"type": "text", "text": "hey"}',
        ],
        cwd=tmp_path,
    )
    try:
        provider = build_provider("anthropic", base_url=wait_for_file(ready))
        assert ask(provider).text == "hey"
    finally:
        proc.kill()
        proc.wait(timeout=5)


def run_cli(*args: str, stdin: str = "prompt", **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(FAKES / "scripted_cli.py"), *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=10,
        **kwargs,
    )


def test_scripted_cli_modes(tmp_path):
    assert run_cli("--mode", "echo", stdin="x" * 300).stdout == "ANSWER: " + "x" * 200 + "\n"
    failed = run_cli("--mode", "fail", "--exit-code", "7", "--stderr", "bad thing")
    assert (failed.returncode, failed.stderr) == (7, "bad thing")
    assert len(run_cli("--mode", "huge", "--bytes", "5000").stdout) == 5000
    with pytest.raises(ValueError):
        json.loads(run_cli("--mode", "invalid-json").stdout)
    env = {**os.environ, "SOME_KEY": "v"}
    assert run_cli("--mode", "env", "--env-name", "SOME_KEY", env=env).stdout == "SOME_KEY=v\n"
    started = time.monotonic()
    assert run_cli("--mode", "sleep", "--seconds", "0.2", "--text", "zz").stdout == "zz\n"
    assert time.monotonic() - started >= 0.2


def test_scripted_cli_counts_and_records_prompts_concurrently(tmp_path):
    count = tmp_path / "count.jsonl"
    prompts = tmp_path / "prompts.txt"
    args = ["--mode", "text", "--text", "ok", "--count-file", str(count)]
    args += ["--prompt-file", str(prompts)]
    threads = [
        threading.Thread(target=run_cli, args=args, kwargs={"stdin": f"p{i}"}) for i in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    lines = [json.loads(line) for line in count.read_text().splitlines()]
    assert len(lines) == 6 and len({line["pid"] for line in lines}) == 6
    assert sorted(prompts.read_text().split("\x00END\x00\n")[:-1]) == [f"p{i}" for i in range(6)]
