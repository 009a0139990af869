"""Chaos: real worker processes SIGKILLed at random while tasks with multi-turn conversations and
fetch_url calls run, PostgreSQL restarted once mid-run; then the invariants, from the database and
the web server's own counters.

The short version runs inside `make test` (40 tasks, 3 workers, a kill every 2 s for 20 s). `make
chaos` runs the full one (300 tasks, 4 workers, 60 s) through the same code, parametrised by
environment variables:

    CHAOS_TASKS, CHAOS_WORKERS, CHAOS_SECONDS, CHAOS_KILL_EVERY, CHAOS_PG_RESTART (1/0),
    CHAOS_SETTLE_SECONDS (how long the tasks may take to settle after the last kill)

The PostgreSQL restart happens only on the embedded server (DATABASE_URL unset): a server given
by DATABASE_URL is someone else's to restart.
"""

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
from django.db import InterfaceError, OperationalError, connection
from django.db.models import Count

from agents.engine.run.intake import task_create
from agents.models import AgentRun, Artifact, Connection, Model, ToolCall, Turn
from approvals.models import ReviewDecision
from approvals.states import ReviewChoice
from core.actors import Actor
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "chaos" / "chaos_server.py"

TASKS = int(os.environ.get("CHAOS_TASKS", "40"))
WORKERS = int(os.environ.get("CHAOS_WORKERS", "3"))
SECONDS = float(os.environ.get("CHAOS_SECONDS", "20"))
KILL_EVERY = float(os.environ.get("CHAOS_KILL_EVERY", "2"))
PG_RESTART = os.environ.get("CHAOS_PG_RESTART", "1") == "1"
SETTLE = float(os.environ.get("CHAOS_SETTLE_SECONDS", "60"))
EMBEDDED = not os.environ.get("DATABASE_URL", "").strip()

# Short leases so that a killed worker's task is recovered within seconds; many requeues allowed
# (a task may be hit by several kills: "lost twice → failed" is a policy, not what is tested here).
CHAOS_ENV = {
    "ACTHELM_HEARTBEAT_SECONDS": "0.3",
    "ACTHELM_LEASE_SECONDS": "1.5",
    "ACTHELM_POLL_SECONDS": "0.5",
    "ACTHELM_RECOVER_INTERVAL_SECONDS": "0.5",
    "ACTHELM_FETCH_ALLOW_PRIVATE": "true",
    "ACTHELM_MAX_REQUEUES": "1000",
    "ACTHELM_RETRY_DELAYS": "1,1,1",
    "ACTHELM_LOG_LEVEL": "WARNING",
}
SETTLED = {TaskStatus.REVIEW, TaskStatus.NEEDS_REVIEW}

pytestmark = [
    pytest.mark.serial,
    pytest.mark.django_db(transaction=True),
    pytest.mark.timeout(int(SECONDS + SETTLE + 240)),
]


class Peers:
    """The chaos server process (model + web target)."""

    def __init__(self, tmp: Path):
        self.ready = tmp / "ready.json"
        self.counts = tmp / "counts.txt"
        self.proc = subprocess.Popen(
            [
                sys.executable,
                str(SERVER),
                "--ready-file",
                str(self.ready),
                "--count-file",
                str(self.counts),
            ],
            stdout=subprocess.DEVNULL,
            stderr=open(tmp / "server.log", "w"),  # noqa: SIM115 - closed with the process
        )
        deadline = time.monotonic() + 30
        while not self.ready.exists():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise AssertionError("the chaos server did not start")
            time.sleep(0.05)
        urls = json.loads(self.ready.read_text())
        self.model_url, self.target_url = urls["model"], urls["target"]

    def fetches(self) -> Counter:
        if not self.counts.exists():
            return Counter()
        return Counter(
            line.split()[1] for line in self.counts.read_text().splitlines() if line.strip()
        )

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Fleet:
    """WORKERS slots, each running one `manage.py acthelm_worker` process (output to a file)."""

    def __init__(self, env: dict, tmp: Path):
        self.env = env
        self.tmp = tmp
        self.generation = Counter()
        self.procs: dict[int, tuple[str, subprocess.Popen]] = {}
        self.exited: list[tuple[str, int]] = []

    def start(self, slot: int) -> str:
        self.generation[slot] += 1
        worker_id = f"chaos-{slot}-{self.generation[slot]}"
        log = open(self.tmp / f"{worker_id}.log", "w")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "acthelm_worker", "--worker-id", worker_id],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        self.procs[slot] = (worker_id, proc)
        return worker_id

    def kill(self, slot: int) -> str:
        worker_id, proc = self.procs[slot]
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
        return worker_id

    def dead(self) -> list[tuple[str, int]]:
        """Workers that exited by themselves (a crash or a wedge-turned-exit is a bug)."""
        return [(wid, p.returncode) for wid, p in self.procs.values() if p.poll() is not None]

    def stop(self) -> None:
        for _, proc in self.procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for _, proc in self.procs.values():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()

    def tail(self, lines: int = 30) -> str:
        out = []
        for path in sorted(self.tmp.glob("chaos-*.log")):
            text = path.read_text(errors="replace").splitlines()[-lines:]
            if text:
                out.append(f"--- {path.name}\n" + "\n".join(text))
        return "\n".join(out)[-12_000:]


def db_retry(func, attempts: int = 40):
    """Run a query from the test process; ride out the PostgreSQL restart."""
    for _ in range(attempts):
        try:
            return func()
        except (OperationalError, InterfaceError):
            connection.close()
            time.sleep(0.25)
    return func()


def status_counts(ids) -> Counter:
    return Counter(
        dict(
            Task.objects.filter(pk__in=ids)
            .values_list("status")
            .annotate(n=Count("id"))
            .values_list("status", "n")
        )
    )


def restart_postgres() -> float:
    from core.embedded_pg import pg_ctl, pgdata_path

    started = time.monotonic()
    # -l: the restarted server keeps logging to the file pgserver set up (the benches read it).
    pg_ctl("-w", "-m", "fast", "-l", str(pgdata_path() / "log"), "restart")
    connection.close()
    return time.monotonic() - started


def test_chaos_nothing_lost_nothing_repeated_nothing_written_by_a_fenced_out_attempt(
    worker_env, tmp_path
):
    rng = random.Random(int(os.environ.get("CHAOS_SEED", "8")))
    peers = Peers(tmp_path)
    fleet = Fleet({**worker_env, **CHAOS_ENV}, tmp_path)
    try:
        conn = Connection.objects.create(
            name="chaos",
            kind="openai_compatible",
            base_url=peers.model_url,
            cost_tier="zero_cost",
            timeout_seconds=30,
        )
        model = Model.objects.create(
            connection=conn, name="test-model", test_status="passed", context_window=100_000
        )
        tasks = [
            task_create(
                actor=Actor.system("chaos"),
                title=f"k{i:04d}",
                instruction=f"chaos-key:k{i:04d} Fetch your page, then write a note about it.",
                tools=["update_plan", "fetch_url", "write_artifact"],
                allowed_domains=["127.0.0.1"],
                model=model,
            )
            for i in range(TASKS)
        ]
        ids = [t.pk for t in tasks]
        key_of = {t.pk: t.title for t in tasks}
        before = {
            t.pk: (list(t.tools), dict(t.tool_policies), list(t.allowed_domains)) for t in tasks
        }

        started = time.monotonic()
        for slot in range(WORKERS):
            fleet.start(slot)
        kills: list[dict] = []
        restarts: list[float] = []
        # The chaos is counted in kills, not in seconds: a slow PostgreSQL restart on a loaded
        # machine must not shorten it.
        planned_kills = max(1, int(SECONDS / KILL_EVERY))
        restart_after = planned_kills // 2 if (PG_RESTART and EMBEDDED) else None
        next_kill = started + KILL_EVERY
        while len(kills) < planned_kills:
            now = time.monotonic()
            if restart_after is not None and len(kills) >= restart_after:
                restarts.append(restart_postgres())
                restart_after = None
                next_kill = time.monotonic() + KILL_EVERY
            if now >= next_kill:
                # A worker that holds a task when one does: on a loaded machine a worker may take
                # longer to start than KILL_EVERY, and killing only starting workers proves nothing.
                holders = db_retry(
                    lambda: set(
                        Task.objects.filter(pk__in=ids, status=TaskStatus.IN_PROGRESS).values_list(
                            "lease_owner", flat=True
                        )
                    )
                )
                busy = [s for s, (wid, _) in sorted(fleet.procs.items()) if wid in holders]
                slot = rng.choice(busy) if busy else rng.randrange(WORKERS)
                victim = fleet.kill(slot)
                held = db_retry(
                    lambda victim=victim: list(
                        Task.objects.filter(lease_owner=victim).values_list("pk", flat=True)
                    )
                )
                kills.append({"worker": victim, "held": held, "at": round(now - started, 2)})
                fleet.start(slot)
                next_kill += KILL_EVERY
            assert not fleet.dead(), f"a worker exited by itself: {fleet.dead()}\n{fleet.tail()}"
            time.sleep(0.05)
        chaos_end = time.monotonic()

        # Settle: every task reaches review or needs_review; progress must not stall.
        last_progress, last_settled = time.monotonic(), -1
        while True:
            counts = db_retry(lambda: status_counts(ids))
            settled = sum(counts[s] for s in SETTLED)
            if settled == TASKS:
                break
            if settled != last_settled:
                last_progress, last_settled = time.monotonic(), settled
            assert not fleet.dead(), f"a worker exited by itself: {fleet.dead()}\n{fleet.tail()}"
            stalled = time.monotonic() - last_progress
            if stalled > 30 or time.monotonic() - chaos_end > SETTLE:
                stuck = list(
                    Task.objects.filter(pk__in=ids)
                    .exclude(status__in=SETTLED)
                    .values_list("pk", "status", "lease_owner", "failure_code")[:20]
                )
                raise AssertionError(
                    f"tasks did not settle ({dict(counts)}; stalled {stalled:.0f} s): {stuck}\n"
                    f"{fleet.tail()}"
                )
            time.sleep(0.2)
        settled_at = time.monotonic()
    finally:
        fleet.stop()
        peers.stop()

    connection.close()
    fetches = peers.fetches()
    counts = status_counts(ids)
    runs = AgentRun.objects.filter(task_id__in=ids)
    lost_events = TaskEvent.objects.filter(task_id__in=ids, kind=EventKind.LOST).count()
    figures = {
        "tasks": TASKS,
        "workers": WORKERS,
        "chaos_seconds": SECONDS,
        "kills": len(kills),
        "kills_holding_a_task": sum(1 for k in kills if k["held"]),
        "postgres_restarts": len(restarts),
        "postgres_restart_seconds": [round(r, 2) for r in restarts],
        "recoveries (lost events)": lost_events,
        "runs": runs.count(),
        "max_runs_per_task": max(
            runs.values("task_id").annotate(n=Count("id")).values_list("n", flat=True)
        ),
        "review": counts[TaskStatus.REVIEW],
        "needs_review": counts[TaskStatus.NEEDS_REVIEW],
        "fetch_requests": sum(fetches.values()),
        "seconds_to_settle": round(settled_at - started, 1),
        "tasks_per_second": round(TASKS / (settled_at - started), 2),
    }
    print("\nchaos figures: " + json.dumps(figures, indent=2))

    # 1. No task lost: every task reached review or needs_review.
    assert set(counts) <= SETTLED and sum(counts.values()) == TASKS, dict(counts)
    for task_id in Task.objects.filter(pk__in=ids, status=TaskStatus.NEEDS_REVIEW).values_list(
        "pk", flat=True
    ):
        # needs_review only for a fetch whose outcome is unknown, with a decision to make.
        assert ToolCall.objects.filter(task_id=task_id, tool="fetch_url", status="unknown").exists()
        assert ReviewDecision.objects.filter(task_id=task_id, choice=ReviewChoice.PENDING).exists()
    for task_id in Task.objects.filter(pk__in=ids, status=TaskStatus.REVIEW).values_list(
        "pk", flat=True
    ):
        assert Artifact.objects.filter(task_id=task_id, name=f"{key_of[task_id]}.md").exists()

    # Nothing widened: the tools, policies and domains of every task are what they were.
    for task in Task.objects.filter(pk__in=ids):
        assert (task.tools, task.tool_policies, task.allowed_domains) == before[task.pk]

    # 2. No duplicated transcript turn: each step of each task was taken once.
    dup_turns = (
        Turn.objects.filter(task_id__in=ids, role="assistant", discarded=False)
        .values("task_id", "content")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    assert not dup_turns.exists(), list(dup_turns[:10])
    dup_calls = (
        ToolCall.objects.filter(task_id__in=ids)
        .values("task_id", "tool")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
    )
    assert not dup_calls.exists(), list(dup_calls[:10])
    assert not ToolCall.objects.filter(task_id__in=ids, run_count__gt=1, tool="fetch_url").exists()

    # 3. No external request repeated without a person's decision; every review task's page was
    #    fetched exactly once, and a fetch the record calls succeeded really happened.
    run_again = set(
        ReviewDecision.objects.filter(task_id__in=ids, choice=ReviewChoice.RUN_AGAIN).values_list(
            "task_id", flat=True
        )
    )
    for task_id in ids:
        n = fetches[f"/t/{key_of[task_id]}"]
        assert n <= 1 or task_id in run_again, (task_id, n)
    for call in ToolCall.objects.filter(task_id__in=ids, tool="fetch_url", status="succeeded"):
        assert fetches[f"/t/{key_of[call.task_id]}"] == 1, call.task_id

    # 4. No write by a fenced-out attempt: every turn, tool result and step event was written
    #    while its run was still started (before the run's end was recorded).
    late_turns = [
        (t.task_id, t.index, t.run_id)
        for t in Turn.objects.filter(task_id__in=ids).select_related("run")
        if t.run.finished_at is not None and t.created_at > t.run.finished_at
    ]
    assert not late_turns, late_turns[:10]
    late_calls = [
        (c.task_id, c.tool, c.run_id)
        for c in ToolCall.objects.filter(task_id__in=ids, finished_at__isnull=False).select_related(
            "run"
        )
        if c.run.finished_at is not None and c.finished_at > c.run.finished_at
    ]
    assert not late_calls, late_calls[:10]
    late_events = [
        (e.task_id, e.kind, e.run_id)
        for e in TaskEvent.objects.filter(
            task_id__in=ids, kind__in=[EventKind.MODEL_TURN, EventKind.TOOL_RESULT]
        ).select_related("run")
        if e.run is not None and e.run.finished_at is not None and e.created_at > e.run.finished_at
    ]
    assert not late_events, late_events[:10]

    # 5. Every claim has its event.
    claimed = TaskEvent.objects.filter(task_id__in=ids, kind=EventKind.CLAIMED)
    assert runs.count() == claimed.count()
    assert not runs.filter(claim_event__isnull=True).exists()
    assert set(claimed.values_list("run_id", flat=True)) == set(runs.values_list("pk", flat=True))

    # The chaos really happened.
    assert len(kills) == max(1, int(SECONDS / KILL_EVERY))
    assert lost_events >= 1
    if PG_RESTART and EMBEDDED:
        assert len(restarts) == 1
