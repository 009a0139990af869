"""Every shell example of the README, run as written on what `make run` starts (issues 24, 34).

`make run` seeds the demo (`acthelm_demo`) and starts three processes (`bin/run-demo`): the scripted
demo model, one worker and the console. Each block's test does the same against its test database:
the demo model, `manage.py acthelm_worker` and `manage.py runserver` as child processes, on free
ports. Then the fenced shell block of the README runs in bash, whole, from a folder of its own that
looks like the project's (`.venv` and `manage.py` linked, a `notes.txt` beside them); the one change
to its text is the console's address, `http://127.0.0.1:8000`, which becomes the test console's, and
its environment points the commands at the test database and media folder. A block must exit 0 (bash
without `set -e`, as a paste runs), twice in a row in the same folder, its task must have read
`notes.txt`, and the one file it writes must be that task's real output (the artifact's stored
SHA-256). The Ollama block, pasted without Ollama, must stop at its first failure with one clear
line, twice.

A block that cannot run here carries the marker `<!-- not run by tests/acthelm_site/test_readme.py:
REASON -->` on the line before its fence, and `NOT_RUN` below names each such block by its first
line: a marker on any other block, or a block in `NOT_RUN` without its marker, fails the test.
"""

import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import call_command

from agents.models import Artifact, ToolCall
from agents.states import ToolCallStatus
from tasks.models import Task
from tasks.states import TaskStatus
from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)

README = (ROOT / "README.md").read_text()
MARKER = "<!-- not run by tests/acthelm_site/test_readme.py: "
_BLOCK = re.compile(
    r"(?:^<!-- not run by tests/acthelm_site/test_readme\.py: (?P<why>.+?) -->\n)?"
    r"^```(?:sh|bash|shell)\n(?P<body>.*?)^```",
    re.S | re.M,
)
NOTES = "Decisions: ship on Friday; the launch moves to April.\n"
CONSOLE = "http://127.0.0.1:8000"

# The blocks that cannot run in a test, by the start of their first line, and a word of the
# reason their marker must give.
NOT_RUN = {
    "make run": "run until stopped",  # the services (the test starts them) and the whole suite
    "DATABASE_URL=postgresql://postgres@127.0.0.1:5432/": "PostgreSQL server of your own",
    ".venv/bin/python manage.py acthelm_connection add ollama": "Ollama",
    "llama-server": "llama-server",
}


@dataclass(frozen=True)
class Block:
    line: int  # where its fence is, for messages
    body: str
    why_not_run: str | None

    @property
    def first_line(self) -> str:
        return self.body.lstrip().splitlines()[0]


def blocks() -> list[Block]:
    return [
        Block(README.count("\n", 0, m.start("body")), m.group("body"), m.group("why"))
        for m in _BLOCK.finditer(README)
    ]


def runnable() -> list[Block]:
    return [b for b in blocks() if b.why_not_run is None]


def test_only_the_named_blocks_are_not_run():
    assert README.count(MARKER) == len([b for b in blocks() if b.why_not_run])  # none misplaced
    excluded = {}
    for block in blocks():
        if block.why_not_run is None:
            continue
        named = [start for start in NOT_RUN if block.first_line.startswith(start)]
        assert named, f"README line {block.line}: a marker on a block NOT_RUN does not name"
        excluded[named[0]] = block.why_not_run
    assert excluded.keys() == NOT_RUN.keys()
    for start, why in excluded.items():
        assert NOT_RUN[start] in why, (start, why)
    assert len(runnable()) >= 2  # the CLI example and the curl example


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(port: int, proc: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"nothing listens on {port}: {log.read_text()}")


@pytest.fixture
def make_run(worker_env, tmp_path, monkeypatch) -> Iterator[str]:
    """What `make run` starts, on free ports: the demo seeded, then the demo model, a worker and
    the console (bin/run-demo's three processes); yields the console's address."""
    model_port, console_port = free_port(), free_port()
    monkeypatch.setenv("ACTHELM_DEMO_MODEL_PORT", str(model_port))
    call_command("acthelm_demo", stdout=StringIO())
    env = {**worker_env, "ACTHELM_DEMO_MODEL_PORT": str(model_port)}
    python, manage = sys.executable, str(ROOT / "manage.py")
    commands = {
        "demo-model": [python, "-m", "acthelm_site.demo_model", "--port", str(model_port)],
        "worker": [python, manage, "acthelm_worker", "--worker-id", "demo-worker"],
        "console": [python, manage, "runserver", "--noreload", f"127.0.0.1:{console_port}"],
    }
    env["ACTHELM_RECONCILE_INTERVAL_SECONDS"] = "10"  # as bin/run-demo gives its worker
    procs: list[tuple[subprocess.Popen, Path]] = []
    try:
        for name, command in commands.items():
            log = tmp_path / f"{name}.log"
            with log.open("w") as out:
                procs.append(
                    (
                        subprocess.Popen(
                            command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
                        ),
                        log,
                    )
                )
        wait_for_port(model_port, *procs[0])
        wait_for_port(console_port, *procs[2])
        yield f"http://127.0.0.1:{console_port}"
    finally:
        for proc, _log in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)  # once: the worker hands a running task back
        for proc, _log in procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def project_folder(path: Path) -> Path:
    """A folder that looks like the project's to the README's commands, with a notes.txt."""
    path.mkdir()
    (path / ".venv").symlink_to(ROOT / ".venv")
    (path / "manage.py").symlink_to(ROOT / "manage.py")
    (path / "notes.txt").write_text(NOTES)
    return path


def paste(script: str, *, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """As a person pastes it: bash reading the block, no `set -e`; the block's own exit status."""
    return subprocess.run(
        ["bash"], input=script, cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )


def run_block(block: Block, *, cwd: Path, env: dict[str, str], console: str) -> str:
    result = paste(block.body.replace(CONSOLE, console), cwd=cwd, env=env)
    assert result.returncode == 0, (
        f"README line {block.line} exited {result.returncode}\n--- stdout\n{result.stdout}"
        f"\n--- stderr\n{result.stderr}"
    )
    return result.stdout


def shell_env(worker_env: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in worker_env.items() if k != "PYTHONPATH"}  # a person's shell
    env["PATH"] = os.environ["PATH"]
    return env


@pytest.mark.parametrize("block", runnable(), ids=lambda block: f"README-line-{block.line}")
def test_every_readme_example_runs_as_written_twice_in_a_row(block, make_run, worker_env, tmp_path):
    """Each block is pasted twice into the same folder (issue 49, item 7: the second paste of
    the curl block stopped at "founder already has a live token named 'laptop'"). One test per
    block, each on its own `make run`, so the suite's processes run the blocks side by side."""
    env = shell_env(worker_env)
    folder = project_folder(tmp_path / "example")
    for _paste in range(2):
        newest = Task.objects.order_by("-pk").values_list("pk", flat=True).first() or 0
        out = run_block(block, cwd=folder, env=env, console=make_run)
        [task] = Task.objects.filter(pk__gt=newest, title="Summarise")  # the one it made
        assert task.status in (TaskStatus.DONE, TaskStatus.REVIEW), (block.line, task.status, out)
        # It read the file it summarises: the task had read_file, and used it.
        assert ToolCall.objects.filter(
            task=task,
            tool="read_file",
            arguments__path="notes.txt",
            status=ToolCallStatus.SUCCEEDED,
        ).exists(), f"README line {block.line}: task {task.pk} never read notes.txt"
        written = {
            p.name for p in folder.iterdir() if p.name not in (".venv", "manage.py", "notes.txt")
        }
        assert written == {"summary.md"}, (block.line, written)
        artifact = Artifact.objects.get(task=task, name="summary.md")
        data = (folder / "summary.md").read_bytes()
        assert hashlib.sha256(data).hexdigest() == artifact.sha256, (block.line, data[:300])
        assert data.startswith(b"# Report\n\nTask: Summarise notes.txt in three bullet points")


def test_the_ollama_example_without_ollama_fails_once_clearly_and_again_the_same_way(
    worker_env, tmp_path
):
    """Issue 49, item 7: without Ollama, the block stops at the connection test's one clear
    line — no `KeyError: 'id'` from the task's one-liner, no `invalid int value: ''` from
    `show` — and a second paste fails the same way (the connection is not refused as existing).
    Ollama's address becomes a port nothing listens on, so the test holds where Ollama runs."""
    from tests.factories import UserFactory

    user = UserFactory(username="founder")
    user.is_superuser = user.is_staff = True
    user.save()
    [block] = [
        b
        for b in blocks()
        if b.first_line.startswith(".venv/bin/python manage.py acthelm_connection add ollama")
    ]
    absent = f"http://127.0.0.1:{free_port()}"
    assert "http://127.0.0.1:11434" in block.body
    script = block.body.replace("http://127.0.0.1:11434", absent)
    folder = project_folder(tmp_path / "ollama")
    for attempt in (1, 2):
        result = paste(script, cwd=folder, env=shell_env(worker_env))
        said = result.stdout + result.stderr
        assert result.returncode != 0, (attempt, said)
        lines = [line for line in said.splitlines() if line.strip()]
        assert lines[-1].startswith(
            f"qwen3:8b: FAILED — provider_unreachable: cannot connect to {absent}"
        ), (attempt, said)
        assert said.count("provider_unreachable") == 1, (attempt, said)
        for noise in ("Traceback", "KeyError", "invalid int value", "Error:"):
            assert noise not in said, (attempt, noise, said)
        assert not Task.objects.exists()  # it never got as far as creating one
