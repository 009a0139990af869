"""The deployment files: docker-compose.yml, the Dockerfile, .dockerignore and `make serve`.

No container engine runs on the build machines, so these tests read the files; the behaviour the
compose file relies on (the worker's SIGTERM hand-back) is exercised with real processes in
test_worker_entrypoint below.
"""

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from core.dburl import parse_database_url
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def _seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration)
    assert parts and "".join(a + u for a, u in parts) == duration, duration
    return sum(float(amount) * units[unit] for amount, unit in parts)


def test_compose_has_postgres_the_console_and_workers(compose):
    assert set(compose["services"]) == {"db", "web", "worker"}
    db = compose["services"]["db"]
    assert db["image"].startswith("postgres:16")
    assert any(v.endswith(":/var/lib/postgresql/data") for v in db["volumes"])
    assert "pg_isready" in " ".join(db["healthcheck"]["test"])
    assert set(compose["volumes"]) >= {"pgdata", "media"}


def test_the_worker_service_stops_with_sigterm_and_runs_the_worker_entry_point(compose):
    worker = compose["services"]["worker"]
    assert worker["stop_signal"] == "SIGTERM"
    # Long enough for the next safe point: a model request in flight finishes first.
    assert _seconds(worker["stop_grace_period"]) >= 120
    command = worker["command"]
    assert isinstance(command, list), "exec form: the worker itself receives the signal"
    assert command[:3] == ["python", "manage.py", "acthelm_worker"]
    # Scaling with --scale worker=N: no fixed name, no host port to clash.
    assert "container_name" not in worker and "ports" not in worker


def test_the_worker_entry_point_exists_as_a_management_command():
    from django.core.management import get_commands

    assert get_commands()["acthelm_worker"] == "agents"


def test_web_runs_migrations_then_gunicorn_and_workers_wait_for_it(compose):
    web = compose["services"]["web"]
    command = " ".join(web["command"]) if isinstance(web["command"], list) else web["command"]
    migrate = command.index("manage.py migrate")
    gunicorn = command.index("gunicorn acthelm_site.wsgi")
    assert migrate < gunicorn
    assert "0.0.0.0:8000" in command
    assert "/healthz" in " ".join(web["healthcheck"]["test"])
    depends = compose["services"]["worker"]["depends_on"]
    assert depends["web"]["condition"] == "service_healthy"  # migrations ran
    assert depends["db"]["condition"] == "service_healthy"


@pytest.mark.parametrize("service", ["web", "worker"])
def test_app_services_share_database_secrets_and_files(compose, service):
    spec = compose["services"][service]
    url = spec["environment"]["DATABASE_URL"].replace("${POSTGRES_PASSWORD:-acthelm}", "acthelm")
    db = parse_database_url(url)
    assert (db["HOST"], db["PORT"], db["NAME"]) == ("db", "5432", "acthelm")
    assert spec["env_file"] == "acthelm.env"
    assert "media:/data/media" in spec["volumes"]
    assert spec["environment"]["ACTHELM_MEDIA_ROOT"] == "/data/media"
    assert spec["build"] == "."


def test_the_env_file_example_names_the_secret_key_without_a_value():
    lines = (ROOT / "acthelm.env.example").read_text().splitlines()
    settings = dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))
    assert settings["DJANGO_SECRET_KEY"] == ""
    assert "DJANGO_ALLOWED_HOSTS" in settings


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    text = re.sub(r"\\\n", " ", dockerfile)
    return [
        tuple(line.strip().split(None, 1))
        for line in text.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]


def test_dockerfile_is_slim_non_root_and_serves_gunicorn():
    steps = _instructions((ROOT / "Dockerfile").read_text())
    assert steps[0] == ("FROM", "python:3.12-slim")
    runs = [arg for op, arg in steps if op == "RUN"]
    assert "pip install -c requirements.lock ." in runs  # exact versions from the lock file
    collect = next(r for r in runs if "collectstatic" in r)
    assert "DJANGO_SECRET_KEY=" in collect
    env = " ".join(arg for op, arg in steps if op == "ENV")
    assert "DJANGO_SETTINGS_MODULE=acthelm_site.settings_production" in env
    users = [arg for op, arg in steps if op == "USER"]
    assert users and users[-1] not in ("root", "0")
    ops = [op for op, _ in steps]
    assert ops.index("USER") > max(i for i, (op, _) in enumerate(steps) if op == "RUN")
    cmd = next(arg for op, arg in reversed(steps) if op == "CMD")
    assert cmd.startswith('["gunicorn", "acthelm_site.wsgi"')


def test_dockerignore_keeps_local_state_and_secrets_out_of_the_image():
    ignored = set((ROOT / ".dockerignore").read_text().split())
    assert {".venv", ".pgdata", ".git", "acthelm.env", "var"} <= ignored


def test_make_serve_runs_gunicorn_with_the_production_settings():
    makefile = (ROOT / "Makefile").read_text()
    recipe = makefile.split("\nserve:", 1)[1].split("\n\n", 1)[0]
    assert "acthelm_site.settings_production" in recipe
    assert recipe.index("collectstatic") < recipe.index("gunicorn acthelm_site.wsgi")
    assert "--bind $(HOST):$(PORT)" in recipe


# --- what `docker compose stop` does to a worker -------------------------------------------------

SCRIPTED_CLI = str(ROOT / "tests" / "fakes" / "scripted_cli.py")
FAST = {
    "ACTHELM_HEARTBEAT_SECONDS": "0.3",
    "ACTHELM_LEASE_SECONDS": "3",
    "ACTHELM_POLL_SECONDS": "0.5",
    "ACTHELM_RECOVER_INTERVAL_SECONDS": "0.5",
}


def _wait_for(predicate, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _calls(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _sleepy_cli_task(tmp_path, seconds=3):
    from agents.engine.run.intake import task_create
    from agents.models import Connection, Model
    from core.actors import Actor

    calls = tmp_path / "calls.jsonl"
    connection = Connection.objects.create(
        name="sleepy",
        kind="cli",
        cost_tier="zero_cost",
        command=[sys.executable, SCRIPTED_CLI, "--count-file", str(calls), "--mode", "sleep",
                 "--seconds", str(seconds), "--text", "The quarter went well."],
    )  # fmt: skip
    model = Model.objects.create(
        connection=connection, name="scripted", supports_tools=False, test_status="passed"
    )
    task = task_create(
        actor=Actor.system("test"),
        title="Summarise",
        instruction="Summarise the quarter.",
        tools=[],
        model=model,
    )
    return task, calls


@pytest.mark.slow
def test_worker_entry_point_hands_back_on_sigterm_as_compose_stop_relies_on(
    compose, worker_env, tmp_path
):
    from agents.models import AgentRun
    from agents.states import RunStatus
    from tasks.models import Task, TaskEvent
    from tasks.states import EventKind, TaskStatus

    task, calls = _sleepy_cli_task(tmp_path, seconds=3)
    command = list(compose["services"]["worker"]["command"])
    assert command[0] == "python"
    env = {**worker_env, **FAST, **compose["services"]["worker"]["environment"]}
    env["DATABASE_URL"] = worker_env["DATABASE_URL"]
    env["ACTHELM_MEDIA_ROOT"] = str(tmp_path / "media")
    proc = subprocess.Popen(
        [sys.executable, *command[1:]],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        _wait_for(lambda: _calls(calls), what="the model CLI to be called")
        held = Task.objects.get(pk=task.pk)
        assert held.status == TaskStatus.IN_PROGRESS
        # The default worker id is host:pid; the worker page reads the host from it.
        assert held.lease_owner == f"{socket.gethostname()}:{proc.pid}"
        # Like Docker (and tini): SIGTERM to the worker process only, while the model answers.
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(
            timeout=_seconds(compose["services"]["worker"]["stop_grace_period"])
        )
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, output

    task.refresh_from_db()
    assert task.status == TaskStatus.READY
    assert task.lease_owner == "" and task.lease_expires_at is None
    run = AgentRun.objects.get(task=task)
    assert run.status == RunStatus.CANCELLED and run.error_code == "handed_back"
    handed_back = TaskEvent.objects.filter(task=task, kind=EventKind.HANDED_BACK)
    assert handed_back.count() == 1 and handed_back.get().run_id == run.pk
    # The model answer in flight was allowed to finish (one call, not killed mid-answer).
    assert len(_calls(calls)) == 1

    # The compose file sets ACTHELM_LOG_FORMAT=json: every line the worker wrote is one object.
    records = [json.loads(line) for line in output.splitlines() if line.strip()]
    events = [r["event"] for r in records]
    assert "worker.stopping" in events and "worker.stopped" in events
    assert any(r["event"] == "task.handed_back" and r.get("task_id") == task.pk for r in records)
