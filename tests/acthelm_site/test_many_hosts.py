"""Workers as separate processes with their own ids and database connections against one
PostgreSQL server — the many-hosts deployment on one machine. One worker's connections are cut
with pg_terminate_backend mid-task: it reconnects, and no task is lost."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from django.db import connection

from agents.engine.run.intake import task_create
from agents.models import AgentRun, Connection, Model
from agents.states import RunStatus
from core.actors import Actor
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.conftest import ROOT

SCRIPTED_CLI = str(ROOT / "tests" / "fakes" / "scripted_cli.py")
FAST = {
    "ACTHELM_HEARTBEAT_SECONDS": "0.3",
    "ACTHELM_LEASE_SECONDS": "3",
    "ACTHELM_POLL_SECONDS": "0.5",
    "ACTHELM_RECOVER_INTERVAL_SECONDS": "0.5",
    "ACTHELM_LOG_FORMAT": "json",
}
HOSTS = ("host-a:101", "host-b:202", "host-c:303")
CUT = "host-b:202"


def _wait_for(predicate, timeout=60.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def _app_name(worker_id: str) -> str:
    return "acthelm-test " + worker_id


def _backends(*names: str) -> set[int]:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = ANY(%s)", [list(names)]
        )
        return {row[0] for row in cursor.fetchall()}


class Fleet:
    def __init__(self, env):
        self.env = env
        self.procs: dict[str, subprocess.Popen] = {}

    def start(self, worker_id: str) -> None:
        sep = "&" if "?" in self.env["DATABASE_URL"] else "?"
        env = {
            **self.env,
            **FAST,
            # Each "host" labels its connections, as an operator would per machine.
            "DATABASE_URL": f"{self.env['DATABASE_URL']}{sep}application_name="
            + _app_name(worker_id).replace(" ", "%20"),
        }
        self.procs[worker_id] = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "acthelm_worker", "--worker-id", worker_id],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    def stop(self, worker_id: str, timeout: float = 60) -> tuple[int, str]:
        proc = self.procs[worker_id]
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=timeout)
        return proc.returncode, output

    def kill_all(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)


@pytest.fixture
def fleet(worker_env):
    fleet = Fleet(worker_env)
    yield fleet
    fleet.kill_all()


@pytest.fixture
def sleepy_model(transactional_db, tmp_path):
    calls = tmp_path / "calls.jsonl"
    conn = Connection.objects.create(
        name="sleepy",
        kind="cli",
        cost_tier="zero_cost",
        command=[sys.executable, SCRIPTED_CLI, "--count-file", str(calls), "--mode", "sleep",
                 "--seconds", "1.5", "--text", "Summary: fine."],
    )  # fmt: skip
    model = Model.objects.create(
        connection=conn, name="scripted", supports_tools=False, test_status="passed"
    )
    model.calls = calls
    return model


def _tasks(model, n: int, prefix: str) -> list[int]:
    return [
        task_create(
            actor=Actor.system("test"),
            title=f"{prefix} {i}",
            instruction="Summarise the quarter.",
            tools=[],
            model=model,
        ).pk
        for i in range(n)
    ]


def _calls(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


@pytest.mark.slow
def test_workers_on_many_hosts_survive_a_cut_connection_and_lose_nothing(
    fleet, sleepy_model, settings, tmp_path
):
    settings.ACTHELM_MEDIA_ROOT = tmp_path / "media"
    fleet.env["ACTHELM_MEDIA_ROOT"] = str(settings.ACTHELM_MEDIA_ROOT)
    first = _tasks(sleepy_model, 6, "batch one")
    for worker_id in HOSTS:
        fleet.start(worker_id)

    # Worker b holds a task and its model call is in flight.
    cut_task = _wait_for(
        lambda: (
            Task.objects.filter(lease_owner=CUT, status=TaskStatus.IN_PROGRESS)
            .values_list("pk", flat=True)
            .first()
        ),
        what="worker b to claim a task",
    )
    # The heartbeat renews the task's lease (and only that): a later expiry than the claim's.
    claimed_lease = Task.objects.values_list("lease_expires_at", flat=True).get(pk=cut_task)
    _wait_for(
        lambda: Task.objects.filter(
            pk=cut_task, status=TaskStatus.IN_PROGRESS, lease_expires_at__gt=claimed_lease
        ).exists(),
        what="worker b's first heartbeat",
    )
    # Every connection of worker b: its slot, heartbeat and maintenance connections (labelled
    # through DATABASE_URL) and its LISTEN connection (labelled by the worker).
    names = (_app_name(CUT), f"acthelm-listen {CUT}")
    before = _wait_for(lambda: _backends(*names) if len(_backends(*names)) >= 3 else None)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", [list(before)]
        )
        assert all(ok for (ok,) in cursor.fetchall())

    # Nothing is lost: every task of the batch reaches review, each through one succeeded run.
    _wait_for(
        lambda: Task.objects.filter(pk__in=first, status=TaskStatus.REVIEW).count() == len(first),
        timeout=90,
        what="the first batch to reach review",
    )
    # Worker b reconnected: new backends, its LISTEN connection included.
    after = _wait_for(
        lambda: _backends(*names) - before if _backends(f"acthelm-listen {CUT}") - before else None,
        what="worker b to reconnect",
    )
    assert after

    # The cut task was continued or recovered, and finished exactly once either way.
    runs = list(AgentRun.objects.filter(task_id=cut_task).order_by("number"))
    assert [r.status for r in runs].count(RunStatus.SUCCEEDED) == 1
    recovered = TaskEvent.objects.filter(task_id=cut_task, kind=EventKind.LOST).exists()
    if recovered:
        assert runs[0].status == RunStatus.FAILED and runs[0].error_code == "worker_lost"
        assert TaskEvent.objects.filter(task_id=cut_task, kind=EventKind.REQUEUED).exists()
    else:
        assert len(runs) == 1 and runs[0].worker_id == CUT

    # Worker b still works: with the others stopped, it alone runs a second batch.
    for worker_id in HOSTS:
        if worker_id != CUT:
            code, output = fleet.stop(worker_id)
            assert code == 0, output
    second = _tasks(sleepy_model, 2, "batch two")
    _wait_for(
        lambda: Task.objects.filter(pk__in=second, status=TaskStatus.REVIEW).count() == 2,
        timeout=60,
        what="worker b to run the second batch",
    )
    assert set(
        AgentRun.objects.filter(task_id__in=second, status=RunStatus.SUCCEEDED).values_list(
            "worker_id", flat=True
        )
    ) == {CUT}

    for task_id in first + second:
        assert AgentRun.objects.filter(task_id=task_id, status=RunStatus.SUCCEEDED).count() == 1
    assert not Task.objects.filter(status=TaskStatus.FAILED).exists()
    assert _calls(sleepy_model.calls) >= len(first) + len(second)

    code, output = fleet.stop(CUT)
    assert code == 0, output
    records = [json.loads(line) for line in output.splitlines() if line.strip()]
    # It noticed the cut and said so in its (JSON) log: the LISTEN connection reconnected. The
    # pool's connections were replaced by the pool (docs/worker.md, "Connections"); a run that met
    # a dead one would have said so as a database error, and none ended in an error.
    assert "worker.listen_reconnect" in {r["event"] for r in records}
    assert not [r for r in records if r["level"] in ("ERROR", "CRITICAL")]
    # Each worker wrote its own id on its runs; three distinct ids did the first batch's work.
    assert AgentRun.objects.filter(task_id__in=first).values("worker_id").distinct().count() >= 2
