import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPTED_CLI = str(ROOT / "tests" / "fakes" / "scripted_cli.py")


@pytest.fixture
def fast_worker_settings(settings):
    """Short leases for in-process workers: 0.2 s heartbeats, 1.5 s leases."""
    settings.ACTHELM_HEARTBEAT_SECONDS = 0.2
    settings.ACTHELM_LEASE_SECONDS = 1.5
    settings.ACTHELM_POLL_SECONDS = 0.5
    settings.ACTHELM_RECOVER_INTERVAL_SECONDS = 0.5
    return settings


FAST_ENV = {
    "ACTHELM_HEARTBEAT_SECONDS": "0.3",
    "ACTHELM_LEASE_SECONDS": "1.5",
    "ACTHELM_POLL_SECONDS": "0.5",
    "ACTHELM_RECOVER_INTERVAL_SECONDS": "0.5",
}


@pytest.fixture
def cli_model(db, tmp_path):
    """Build a zero-cost CLI connection whose model is the scripted executable."""
    from agents.models import Connection, Model

    counter = tmp_path / "cli-calls.jsonl"

    def make(*args, name="scripted", cost_tier="zero_cost", priority=0, timeout=30):
        conn = Connection.objects.create(
            name=name,
            kind="cli",
            command=[sys.executable, SCRIPTED_CLI, "--count-file", str(counter), *args],
            cost_tier=cost_tier,
            priority=priority,
            timeout_seconds=timeout,
        )
        return Model.objects.create(
            connection=conn, name="scripted", supports_tools=False, test_status="passed"
        )

    make.counter = counter
    return make


def cli_calls(counter: Path) -> int:
    if not counter.exists():
        return 0
    return len([line for line in counter.read_text().splitlines() if line.strip()])


@pytest.fixture
def cli_task(db):
    from agents.engine.run.intake import task_create
    from core.actors import Actor

    def make(model, **kwargs):
        return task_create(
            actor=Actor.system("test"),
            title=kwargs.pop("title", "Summarise"),
            instruction=kwargs.pop("instruction", "Summarise the quarter."),
            tools=kwargs.pop("tools", []),
            model=model,
            **kwargs,
        )

    return make


class WorkerProcess:
    def __init__(self, env, *args, worker_id="w"):
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "manage.py"),
                "acthelm_worker",
                "--worker-id",
                worker_id,
                *args,
            ],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def kill(self):
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def terminate(self):
        self.proc.send_signal(signal.SIGTERM)

    def wait(self, timeout=60):
        out, _ = self.proc.communicate(timeout=timeout)
        self.output = out
        return self.proc.returncode

    def stop(self):
        if self.proc.poll() is None:
            self.kill()


@pytest.fixture
def spawn_worker(worker_env):
    started = []

    def spawn(*args, worker_id="w", env=None):
        proc = WorkerProcess({**worker_env, **FAST_ENV, **(env or {})}, *args, worker_id=worker_id)
        started.append(proc)
        return proc

    yield spawn
    for proc in started:
        proc.stop()


def wait_for(predicate, timeout=30.0, interval=0.05, message="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out waiting for {message}")


def read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def model_server():
    """A scripted OpenAI-compatible server on loopback (in this process)."""
    from tests.fakes.model_server import ScriptedModelServer

    servers = []

    def start(script=(), flavor="openai", **kwargs):
        server = ScriptedModelServer(list(script), flavor=flavor, **kwargs).start()
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def http_model(db):
    """A zero-cost connection + tested model pointing at a scripted server."""
    from agents.models import Connection, Model

    def make(
        server,
        *,
        name=None,
        context_window=32_000,
        flavor="openai",
        cost_tier="zero_cost",
        priority=0,
        credential_env="",
        supports_tools=True,
        timeout=10,
    ):
        conn = Connection.objects.create(
            name=name or f"scripted-{server.port}",
            kind="anthropic" if flavor == "anthropic" else "openai_compatible",
            base_url=server.url,
            cost_tier=cost_tier,
            priority=priority,
            credential_env=credential_env,
            timeout_seconds=timeout,
        )
        return Model.objects.create(
            connection=conn,
            name="test-model",
            context_window=context_window,
            supports_tools=supports_tools,
            test_status="passed",
        )

    return make


@pytest.fixture
def loop_task(db):
    from agents.engine.run.intake import task_create
    from core.actors import Actor

    def make(model, **kwargs):
        kwargs.setdefault("tools", ["update_plan", "list_files", "read_file", "write_artifact"])
        return task_create(
            actor=Actor.system("test"),
            title=kwargs.pop("title", "Report"),
            instruction=kwargs.pop("instruction", "Write a short report on the notes."),
            model=model,
            **kwargs,
        )

    return make


def run_burst(worker_id="w"):
    from agents.engine.runtime.worker import Worker

    return Worker(worker_id=worker_id, burst=True).run()
