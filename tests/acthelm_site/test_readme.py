"""The README's CLI and curl examples, run as written against a fresh `make run` (issue 24).

The demo is seeded by `acthelm_demo` and run a minute's worth (the reconciler's planning task and
its follow-ups), as `make run` shows it; then each example's commands run in bash from a folder
holding `notes.txt`, with only the console's address and the paths of the interpreter and
manage.py replaced: the CLI lines as child processes, the curl lines as real HTTP requests to a
live server, with the token the README says how to get. Where a person would wait for the worker
of `make run`, the test runs one."""

import json
import re
import subprocess
import sys
import threading
from http.server import ThreadingHTTPServer

import pytest
from django.core.management import call_command

from acthelm_site.demo_model import Handler
from agents.engine.reconciler import reconcile
from agents.engine.worker import Worker
from agents.models import Artifact
from tasks.models import Task
from tasks.states import TaskStatus
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True, reset_sequences=True)

README = (ROOT / "README.md").read_text()
NOTES = "Decisions: ship on Friday; the launch moves to April.\n"


def sh_block(after: str) -> list[str]:
    """The commands of the first ```sh block after the text `after`: one string per command,
    continuation lines joined."""
    start = README.index(after)
    body = re.search(r"```sh\n(.*?)```", README[start:], re.S).group(1)
    return [c.strip() for c in body.replace("\\\n", " ").splitlines() if c.strip()]


@pytest.fixture
def env(worker_env, settings):
    """The commands' environment: the test database and this test's task files."""
    return {**worker_env, "ACTHELM_MEDIA_ROOT": str(settings.ACTHELM_MEDIA_ROOT)}


@pytest.fixture
def demo(monkeypatch, settings, tmp_path):
    """A fresh `make run`, a minute in: the demo seeded and run once through."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    settings.ACTHELM_HEARTBEAT_SECONDS = 0.5
    monkeypatch.setenv("ACTHELM_DEMO_MODEL_PORT", str(server.server_address[1]))
    call_command("acthelm_demo")
    reconcile()
    run_worker()
    assert Task.objects.count() == 4  # the demo's tasks 1 to 4
    (tmp_path / "notes.txt").write_text(NOTES)
    yield tmp_path
    server.shutdown()
    server.server_close()


def run_worker():
    Worker(worker_id="make-run", burst=True).run()


def bash(commands: list[str], *, cwd, env, base_url: str = "", echo: str = "") -> str:
    script = "\n".join(commands).replace(
        ".venv/bin/python manage.py", f"{sys.executable} {ROOT / 'manage.py'}"
    )
    script = script.replace("http://127.0.0.1:8000", base_url)
    result = subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script + (f"\n{echo}" if echo else "")],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{script}\n--- stdout\n{result.stdout}\n--- {result.stderr}"
    return result.stdout


def test_the_cli_example_works_as_written(demo, env):
    commands = sh_block("Example, a minute into a fresh `make run`")
    create, show, artifact, close, pending, approve = commands
    assert "…" in approve  # the one line with a placeholder, for the line `pending` prints
    made = json.loads(bash([create], cwd=demo, env=env))
    assert made["id"] == 5 and (made["connection"], made["model"]) == ("demo", "demo")
    run_worker()  # make run's worker takes it meanwhile
    shown = bash([show], cwd=demo, env=env)
    assert shown.startswith("#5 review Summarise") and "verdict: approved" in shown
    assert "answer:\n  I wrote report.md." in shown  # the scripted demo model says what it did
    assert "artifacts: report.md" in shown and "input files: notes.txt" in shown
    bash([artifact], cwd=demo, env=env)
    assert (demo / "report.md").read_text().startswith("# Report")
    assert bash([close], cwd=demo, env=env).strip() == "task 5: done"
    assert bash([pending], cwd=demo, env=env).strip() == "no open operations"
    assert Task.objects.get(pk=5).status == TaskStatus.DONE


def test_the_curl_example_works_as_written(demo, env, live_server):
    commands = sh_block("## Script it over HTTP")
    waits = [i for i, c in enumerate(commands) if "pending_approvals" in c or "/artifacts/" in c]
    create, approve, download = (
        commands[: waits[0]],
        commands[waits[0] : waits[1]],
        commands[waits[1] :],
    )
    run = {"cwd": demo, "base_url": live_server.url}
    token, task_id = bash(create, env=env, echo='echo "$TOKEN $TASK"', **run).split()
    task = Task.objects.get(pk=int(task_id))
    assert (task.connection.name, task.model.name) == ("demo", "demo")  # the default model
    assert task.tools == ["update_plan", "list_files", "write_artifact"]
    run_worker()  # make run's worker takes it to the approval meanwhile
    task.refresh_from_db()
    assert task.status == TaskStatus.AWAITING_APPROVAL
    env = {**env, "TOKEN": token, "TASK": task_id}
    approved = json.loads(bash(approve, env=env, **run))
    assert approved["id"] == task.pk and approved["status"] == "ready", approved
    run_worker()
    task.refresh_from_db()
    assert task.status == TaskStatus.REVIEW
    bash(download, env=env, **run)
    artifact = Artifact.objects.get(task=task, name="report.md")
    assert (demo / "report.md").stat().st_size == artifact.size > 0
