"""Many agents, few connections: N agents at once, each waiting L seconds per model turn.

    .venv/bin/python bench/fleet.py [--agents 1000] [--latency 20] [--turns 3] [--procs 2]
                                    [--engine-root PATH] [--label NAME] [--no-peer] [--debug]

A PostgreSQL of its own (pgserver, in var/bench-fleet-pg) started with `max_connections = 50`;
the scripted model of `tests/fakes/holding_model.py` (asyncio: it holds every request L
seconds, however many); N tasks (tools: list_files), then `--procs` real `manage.py
acthelm_worker` processes with `--concurrency N/procs`. Each task takes `turns` model turns
(turns - 1 read-only tool calls, then the answer), so the ideal elapsed time is turns × L.
Printed and recorded:

- peak connections to the benchmark database (pg_stat_activity, sampled every 0.1 s), agents per
  connection, `too many clients` in the server's log, warnings and errors in the workers' logs;
- effective concurrency = agents × turns × L ÷ elapsed (claim of the first task to the last task
  in review); goal ≥ 0.9 N;
- heartbeat commits/s per process (the process heartbeat's statements, from the workers' own
  count, over the elapsed time), worker memory per agent (RSS at the plateau minus an idle worker
  process's RSS, over its agents), server CPU per step (postmaster and children, over model turns);
- CPU per step, from the release of the tasks (held back by `not_before` until every worker
  listens, so that start-up is not counted) to the last one in review, over the model turns: the
  worker processes' user + system CPU (/proc/<pid>/stat) and the embedded PostgreSQL's (the
  postmaster and all its backends, from /proc; n/a for a server elsewhere). `--latency 0` makes it
  the CPU of a step with a zero-latency model (add `--no-peer --no-readme`);
- the peer, on the same server in the same run: Procrastinate running N jobs that each wait
  `turns` times L seconds (`asyncio.sleep`), in `--procs` worker processes of concurrency N/procs.

The workers run as deployed, with `DEBUG` off (`--debug`: on).

`--engine-root PATH` runs the workers from another checkout (for the "before" row: a worktree of
an earlier commit; its venv is this one). The fair-comparison note: both sides wait the same L
per step, on the same PostgreSQL; Acthelm also does its durable bookkeeping per step (turn, call,
event, checkpoint rows), Procrastinate only its job row — that is the point of the comparison.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

NAME = "fleet"
DB = "acthelm_bench_fleet"
MAX_CONNECTIONS = 50
PG_DIR = common.ROOT / "var" / "bench-fleet-pg"
GOAL_CONNECTIONS, MAX_GOAL_CONNECTIONS = 10, 20
DEBUG = False  # --debug: the workers run with DEBUG on (a developer's machine)
#: --prepare N: the workers' DATABASE_URL asks psycopg to prepare a statement run N times on a
#: connection (`?prepare_threshold=N`, a worker connected straight to PostgreSQL); None: unset.
PREPARE: int | None = None


# --- the server ---------------------------------------------------------------------------------


def start_server() -> tuple[str, str]:
    """The benchmark's own PostgreSQL with max_connections = 50; returns (URL, data dir)."""
    import pgserver
    import psycopg

    from core.embedded_pg import _quiet

    PG_DIR.parent.mkdir(parents=True, exist_ok=True)
    with _quiet():
        server = pgserver.get_server(PG_DIR, cleanup_mode=None)
    uri = server.get_uri()
    with psycopg.connect(common.libpq(uri), autocommit=True) as conn:
        current = conn.execute("SHOW max_connections").fetchone()[0]
        if int(current) != MAX_CONNECTIONS:
            conn.execute(f"ALTER SYSTEM SET max_connections = {MAX_CONNECTIONS}")
            conn.execute("ALTER SYSTEM SET logging_collector = off")
            restart = True
        else:
            restart = False
    if restart:
        from pgserver._commands import pg_ctl

        user = "pgserver" if os.geteuid() == 0 else None
        pg_ctl(["-w", "-m", "fast", "restart"], pgdata=PG_DIR, user=user, timeout=60)
        uri = server.get_uri()
    return uri, str(PG_DIR)


def server_log_lines(pattern: str) -> int | None:
    """Lines of the server's log matching `pattern` (pgserver logs to <pgdata>/log)."""
    count, paths = 0, list(PG_DIR.glob("**/*.log"))
    if not paths:
        return None  # the server logs to its own stderr here: the workers' logs still count
    for path in paths:
        try:
            count += len(re.findall(pattern, path.read_text(errors="replace")))
        except OSError:
            continue
    return count


# --- the model ----------------------------------------------------------------------------------


def start_model(latency: float, turns: int):
    from tests.fakes.holding_model import HoldingModel

    model = HoldingModel(latency, turns)
    return model, model.url


def stop_model(model) -> dict:
    return model.close()


# --- memory -------------------------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --- Acthelm ------------------------------------------------------------------------------------


#: What a deployment runs with (docs/operations.md): DEBUG off, hence a secret key of its own.
PRODUCTION_ENV = {"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": "fleet-bench-" + "k" * 50}


def spawn(db_url: str, worker_id: str, concurrency: int, root: Path, log_path: Path, **extra):
    if PREPARE is not None:
        db_url += ("&" if "?" in db_url else "?") + f"prepare_threshold={PREPARE}"
    env = common.child_env(
        db_url,
        ACTHELM_LOG_LEVEL="INFO",
        ACTHELM_LOG_FORMAT="json",
        PYTHONPATH=str(root),
        **({} if DEBUG else PRODUCTION_ENV),
        **extra,
    )
    return subprocess.Popen(
        [
            sys.executable,
            str(root / "manage.py"),
            "acthelm_worker",
            "--worker-id",
            worker_id,
            "--concurrency",
            str(concurrency),
        ],
        env=env,
        cwd=str(root),
        stdout=subprocess.DEVNULL,
        stderr=log_path.open("w"),
        start_new_session=True,
    )


def stop_workers(children) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def read_logs(paths: list[Path]) -> dict:
    problems, beats, samples = 0, [], []
    for path in paths:
        for line in path.read_text(errors="replace").splitlines():
            try:
                entry = json.loads(line)
            except ValueError:
                if "Traceback" in line or "Error" in line:
                    problems += 1
                continue
            if entry.get("level") in ("WARNING", "ERROR", "CRITICAL"):
                problems += 1
                if len(samples) < 5:
                    samples.append(entry.get("event"))
            if entry.get("event") == "worker.stopped":
                beats.append(entry.get("heartbeats"))
    return {"problems": problems, "samples": samples, "heartbeats": beats}


def run_acthelm(args, db_url: str, datadir: str, root: Path) -> dict:
    from datetime import timedelta

    from django.db import connection
    from django.utils import timezone

    from agents.engine.run.intake import task_create
    from agents.models import AgentRun, Turn
    from core.actors import Actor
    from tasks.models import Task
    from tasks.transitions import READY_CHANNEL

    common.truncate_acthelm()
    model_proc, url = start_model(args.latency, args.turns)
    model = common.scripted_connection(url, name="fleet")
    for i in range(args.agents):
        task_create(
            actor=Actor.system("bench"),
            title=f"fleet {i}",
            instruction="List the files, twice, then answer.",
            tools=["list_files"],
            model=model,
            limits={"limit_turns": args.turns + 2},
        )
    # Held back until the workers have started, so that their start-up (imports, connections)
    # is not counted in the CPU per step: released by one UPDATE and a NOTIFY below.
    Task.objects.update(not_before=timezone.now() + timedelta(days=1))
    connection.close()
    too_many_before = server_log_lines("too many clients")
    per_proc = args.agents // args.procs
    logs = [Path(tempfile.mkstemp(prefix="fleet-", suffix=".log")[1]) for _ in range(args.procs)]
    # An idle worker process's memory: one more process with no work to claim.
    before = common.server_snapshot(DB)
    children = []
    with connection.cursor() as cursor:  # the benchmark's own connection is not the workers'
        cursor.execute("SELECT pg_backend_pid()")
        own = cursor.fetchone()[0]
    cpu: dict[str, float | None] = {}
    with common.ConnectionSampler(DB, exclude=(own,)) as sampler:
        try:
            children = [
                spawn(db_url, f"fleet-{i}", per_proc, root, logs[i]) for i in range(args.procs)
            ]
            common.wait_until(
                lambda: common.listening_workers("fleet-") >= args.procs,
                timeout=120,
                what="workers listening",
            )
            time.sleep(1.0)  # past their first maintenance pass
            cpu["workers_before"] = sum(common.cpu_seconds(c.pid) for c in children)
            cpu["server_before"] = common.postgres_cpu_seconds(datadir)
            with connection.cursor() as cursor:
                cursor.execute("UPDATE tasks_task SET not_before = NULL")
                cursor.execute("SELECT pg_notify(%s, '')", [READY_CHANNEL])
            plateau = []

            def all_waiting():
                return Turn.objects.filter(role="assistant").count() >= args.agents

            def finished():
                return Task.objects.filter(status="review").count() >= args.agents

            deadline = time.monotonic() + args.turns * args.latency * 4 + 120
            sampled = False
            while time.monotonic() < deadline:
                if not sampled and all_waiting():
                    plateau = [rss_kb(c.pid) for c in children]
                    sampled = True
                if finished():
                    break
                time.sleep(0.5)
            cpu["workers_after"] = sum(common.cpu_seconds(c.pid) for c in children)
            cpu["server_after"] = common.postgres_cpu_seconds(datadir)
            if not sampled:
                plateau = [rss_kb(c.pid) for c in children]
        finally:
            stop_workers(children)
    common.settle_stats()
    after = common.server_snapshot(DB)
    delta = common.server_delta(before, after)
    model_stats = stop_model(model_proc)
    in_review = Task.objects.filter(status="review").count()
    runs = AgentRun.objects.filter(task__title__startswith="fleet ")
    first = runs.order_by("started_at").values_list("started_at", flat=True).first()
    last = (
        Task.objects.filter(status="review").order_by("-updated_at").values_list("updated_at")
    ).first()
    elapsed = (last[0] - first).total_seconds() if first and last else float("nan")
    turns = Turn.objects.filter(role="assistant").count()
    idle_kb = idle_worker_rss(db_url, root)
    log = read_logs(logs)
    beats = [b for b in log["heartbeats"] if b is not None]
    for path in logs:
        path.unlink()
    per_agent_kb = [(p - idle_kb) / max(1, per_proc) for p in plateau]
    worker_cpu_s = cpu["workers_after"] - cpu["workers_before"]  # type: ignore[operator]
    server_cpu_s = (
        None
        if cpu["server_before"] is None or cpu["server_after"] is None
        else cpu["server_after"] - cpu["server_before"]
    )
    return {
        "agents": args.agents,
        "procs": args.procs,
        "latency": args.latency,
        "turns_per_agent": args.turns,
        "in_review": in_review,
        "model_turns": turns,
        "elapsed_s": elapsed,
        "effective_concurrency": args.agents * args.turns * args.latency / elapsed,
        "peak_connections": sampler.peak,
        "distinct_connections": sampler.distinct,
        "too_many_clients": None
        if too_many_before is None
        else server_log_lines("too many clients") - too_many_before,
        "log_problems": log["problems"],
        "log_samples": log["samples"],
        "heartbeat_commits_per_s_per_proc": (sum(beats) / len(beats) / elapsed) if beats else None,
        "worker_rss_mb": [p / 1024 for p in plateau],
        "idle_worker_rss_mb": idle_kb / 1024,
        "memory_per_agent_kb": sum(per_agent_kb) / len(per_agent_kb) if per_agent_kb else None,
        "server_cpu_ms_per_step": (delta["server_cpu_ms"] / turns)
        if delta["server_cpu_ms"] is not None and turns
        else None,
        # From the release of the tasks to the last one in review, over the model turns: the
        # worker processes' user + system CPU (/proc), and the embedded server's (postmaster and
        # every backend, the benchmark's own sampling included; n/a for a server elsewhere).
        "worker_cpu_s": worker_cpu_s,
        "pg_cpu_s": server_cpu_s,
        "worker_cpu_ms_per_step": worker_cpu_s * 1000 / turns if turns else None,
        "pg_cpu_ms_per_step": server_cpu_s * 1000 / turns
        if server_cpu_s is not None and turns
        else None,
        "debug": DEBUG,
        "commits": delta["commits"],
        "model_server": model_stats,
    }


def idle_worker_rss(db_url: str, root: Path) -> int:
    """RSS of a worker process that has started and found nothing to claim."""
    log = Path(tempfile.mkstemp(prefix="fleet-idle-", suffix=".log")[1])
    child = spawn(db_url, "fleet-idle", 1, root, log)
    try:
        common.wait_until(
            lambda: common.listening_workers("fleet-idle") >= 1, timeout=60, what="idle worker"
        )
        time.sleep(1.0)
        return rss_kb(child.pid)
    finally:
        stop_workers([child])
        log.unlink()


# --- Procrastinate ------------------------------------------------------------------------------


def procrastinate_app(conninfo: str, latency: float, turns: int = 3):
    import asyncio
    import logging

    import procrastinate

    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="waits")
    async def waits() -> None:
        for _ in range(turns):
            await asyncio.sleep(latency)

    return app


def procrastinate_worker(
    conninfo: str, name: str, concurrency: int, latency: float, turns: int
) -> int:
    app = procrastinate_app(conninfo, latency, turns)
    with app.open():
        app.run_worker(
            concurrency=concurrency,
            wait=True,
            name=name,
            listen_notify=True,
            install_signal_handlers=True,
            delete_jobs="never",
        )
    return 0


def run_procrastinate(args, db_url: str) -> dict:
    import psycopg

    conninfo = common.libpq(db_url)
    app = procrastinate_app(conninfo, args.latency, args.turns)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        exists = conn.execute("SELECT to_regclass('procrastinate_jobs') IS NOT NULL").fetchone()[0]
    with app.open():
        if not exists:
            app.schema_manager.apply_schema()
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(
            "TRUNCATE procrastinate_events, procrastinate_jobs, procrastinate_workers "
            "RESTART IDENTITY CASCADE"
        )
    with app.open():
        app.tasks["waits"].batch_defer(*([{}] * args.agents))
    per_proc = args.agents // args.procs
    children = []
    poll = psycopg.connect(conninfo, autocommit=True)
    own = poll.execute("SELECT pg_backend_pid()").fetchone()[0]
    with poll, common.ConnectionSampler(DB, exclude=(own,)) as sampler:
        try:
            t0 = time.time()
            children = [
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--procrastinate-worker",
                        conninfo,
                        f"pq-{i}",
                        str(per_proc),
                        str(args.latency),
                        str(args.turns),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                for i in range(args.procs)
            ]

            def finished():
                return (
                    poll.execute(
                        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
                    ).fetchone()[0]
                    >= args.agents
                )

            common.wait_until(
                finished,
                timeout=args.turns * args.latency * 4 + 120,
                interval=0.5,
                what="procrastinate jobs",
            )
            start, end = poll.execute(
                "SELECT extract(epoch FROM min(at) FILTER (WHERE type = 'started')), "
                "extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')) "
                "FROM procrastinate_events"
            ).fetchone()
        finally:
            stop_workers(children)
    elapsed = float(end) - float(start or t0)
    return {
        "jobs": args.agents,
        "elapsed_s": elapsed,
        "effective_concurrency": args.agents * args.turns * args.latency / elapsed,
        "peak_connections": sampler.peak,
    }


# --- a person's action: pause and cancel latency ------------------------------------------------


def run_signals(args, db_url: str, root: Path, samples: int = 5, turn_s: float = 2.0) -> dict:
    """Pause and cancel with 2-s turns and the default 10-s heartbeat, on one worker process.

    Pause: a task whose every turn calls list_files after `turn_s`; after its 2nd request, pause;
    measured: seconds from the pause's commit to `paused`, and model requests started after the
    pause's commit (goal: pause ≤ one turn; no request after the one in flight).
    Cancel: the model answers with a write_artifact call after `turn_s`; cancel while that request
    is in flight; measured: seconds from the cancel's commit to the worker dropping the request
    (the model server sees the client close), and write_artifact effects (goal: none)."""
    from django.conf import settings
    from django.db import connection

    from agents.actions.task import task_cancel, task_pause
    from agents.engine.run.intake import task_create
    from agents.models import Artifact
    from core.actors import Actor
    from tasks.models import Task
    from tasks.workspace import artifacts_dir
    from tests.fakes.model_server import ScriptedModelServer, reply_tool_calls

    actor = Actor.system("bench")
    pauses, cancels = [], []
    log = Path(tempfile.mkstemp(prefix="fleet-signals-", suffix=".log")[1])
    common.truncate_acthelm()

    def program(request_json):
        text = json.dumps(request_json.get("messages", []))
        if "cancel-me" in text:
            return reply_tool_calls(
                [("write_artifact", {"name": "late.md", "content": "written"})], delay=turn_s
            )
        return reply_tool_calls([("list_files", {})], delay=turn_s)

    with ScriptedModelServer([program] * 1000) as server:
        model = common.scripted_connection(server, name="signals")
        media = tempfile.mkdtemp(prefix="fleet-media-")
        settings.ACTHELM_MEDIA_ROOT = Path(media)  # where the worker writes, seen from here
        worker = spawn(db_url, "signals-0", 4, root, log, ACTHELM_MEDIA_ROOT=media)
        try:
            common.wait_until(
                lambda: common.listening_workers("signals-0") >= 1, timeout=60, what="worker"
            )
            for i in range(samples):
                task = task_create(
                    actor=actor,
                    title=f"pause {i}",
                    instruction="Keep listing the files.",
                    tools=["list_files"],
                    model=model,
                    limits={"limit_turns": 100},
                )
                start = len(server.requests)
                common.wait_until(
                    lambda s=start: len(server.requests) >= s + 2, timeout=60, what="2 requests"
                )
                task_pause(actor=actor, task_id=task.pk)
                t0, sent = time.monotonic(), len(server.requests)
                common.wait_until(
                    lambda t=task: Task.objects.get(pk=t.pk).status == "paused",
                    timeout=60,
                    interval=0.01,
                    what="paused",
                )
                pauses.append(
                    {
                        "seconds": time.monotonic() - t0,
                        "requests_after": len(server.requests) - sent,
                    }
                )
            for i in range(samples):
                task = task_create(
                    actor=actor,
                    title=f"cancel {i}",
                    instruction="cancel-me: write the file.",
                    tools=["write_artifact"],
                    model=model,
                )
                start = len(server.requests)
                common.wait_until(
                    lambda s=start: len(server.requests) >= s + 1, timeout=60, what="request"
                )
                time.sleep(turn_s / 2)
                task_cancel(actor=actor, task_id=task.pk)
                t0 = time.monotonic()
                try:
                    common.wait_until(
                        lambda: server.aborts, timeout=15, interval=0.01, what="an abort"
                    )
                    seconds = time.monotonic() - t0
                except TimeoutError:  # the request finished first: nothing dropped it
                    seconds = None
                server.aborts.clear()
                time.sleep(turn_s)  # an effect that would start late has had its chance
                # An effect is the file on disk, recorded or not (a fenced-out run records
                # nothing, but a file it wrote is written).
                wrote = (artifacts_dir(task.pk) / "late.md").exists()
                recorded = Artifact.objects.filter(task=task).count()
                cancels.append({"seconds": seconds, "effects": int(wrote or recorded > 0)})
        finally:
            stop_workers([worker])
            log.unlink()
    connection.close()
    return {"turn_s": turn_s, "pause": pauses, "cancel": cancels}


# --- report -------------------------------------------------------------------------------------


def signals_main(args) -> int:
    uri, _ = start_server()
    common._BASE_URL = uri
    db_url = common.recreate_database(DB)
    common.django_on(db_url)
    print("… pause and cancel, 2-s turns, 10-s heartbeat", flush=True)
    out = run_signals(args, db_url, args.engine_root.resolve())
    pause_s = [p["seconds"] for p in out["pause"]]
    cancel_s = [c["seconds"] for c in out["cancel"] if c["seconds"] is not None]
    undropped = len(out["cancel"]) - len(cancel_s)
    late_requests = max(p["requests_after"] for p in out["pause"])
    effects = sum(c["effects"] for c in out["cancel"])
    rows = [
        [
            "pause: commit → paused",
            f"{common.median(pause_s):.2f} s (max {max(pause_s):.2f})",
            f"model requests started after the pause: at most {late_requests}",
        ],
        [
            "cancel: commit → in-flight request dropped",
            f"{common.median(cancel_s):.3f} s (max {max(cancel_s):.3f})" if cancel_s else "n/a",
            f"write_artifact effects after the cancel: {effects}; requests not dropped: "
            f"{undropped}",
        ],
    ]
    table = common.print_table(f"Pause and cancel: {args.label}", ["action", "median", ""], rows)
    facts = common.machine()
    goals = [
        [
            "pause ≤ one turn (the request in flight finishes first), no request after it",
            f"{max(pause_s):.2f} s, {late_requests} after",
            common.verdict(max(pause_s) <= out["turn_s"] + 0.25 and late_requests == 0),
        ],
        [
            "no side-effect tool started after a cancel",
            f"{effects}",
            common.verdict(effects == 0),
        ],
    ]
    section = (
        "## Fleet: pause and cancel\n\n`.venv/bin/python bench/fleet.py --signals` "
        f"({facts.get('date', '')}), {len(pause_s)} of each, one worker process, "
        f"ACTHELM_HEARTBEAT_SECONDS = 10:\n\n{table}\n"
    )
    if not args.no_readme:  # --no-readme: print only (a "before" run keeps the results as they are)
        common.record("fleet_signals", section, {"facts": facts, **out}, goals)
    return 0


def step_cpu_main(args, db_url: str, datadir: str) -> int:
    """The CPU of one read-only tool step, what a task pays once taken out: the same agents run
    with A turns and with B turns (zero-latency model); per step = the difference in CPU over the
    difference in model turns. Each side is printed too (CPU over all its turns)."""
    short, long = (int(x) for x in args.step_cpu.split(","))
    out = {}
    for turns in (short, long):
        print(f"… {args.agents} agents × {turns} turns, L = {args.latency:g} s", flush=True)
        out[turns] = run_acthelm(
            argparse.Namespace(**{**vars(args), "turns": turns}),
            db_url,
            datadir,
            args.engine_root.resolve(),
        )
    a, b = out[short], out[long]
    steps = b["model_turns"] - a["model_turns"]
    worker = (b["worker_cpu_s"] - a["worker_cpu_s"]) * 1000 / steps
    pg = (
        (b["pg_cpu_s"] - a["pg_cpu_s"]) * 1000 / steps
        if a["pg_cpu_s"] is not None and b["pg_cpu_s"] is not None
        else None
    )
    rows = [
        [
            f"{turns} turns",
            out[turns]["in_review"],
            out[turns]["model_turns"],
            fmt(out[turns]["worker_cpu_ms_per_step"], ".2f"),
            fmt(out[turns]["pg_cpu_ms_per_step"], ".2f"),
        ]
        for turns in (short, long)
    ]
    rows.append(
        [
            f"a read-only tool step ({long} − {short} turns)",
            "",
            steps,
            fmt(worker, ".2f"),
            fmt(pg, ".2f"),
        ]
    )
    common.print_table(
        f"CPU per step: {args.label}, {args.agents} agents, {args.procs} processes, DEBUG "
        f"{'on' if args.debug else 'off'}",
        ["run", "in review", "model turns", "worker CPU ms / step", "PostgreSQL CPU ms / step"],
        rows,
    )
    print(
        json.dumps(
            {"worker_ms_per_step": worker, "pg_ms_per_step": pg, "runs": out}, indent=2, default=str
        )
    )
    return 0


def fmt(value, spec=".1f"):
    return "n/a" if value is None else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=20.0)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--engine-root", type=Path, default=common.ROOT)
    parser.add_argument("--label", default="this commit")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument(
        "--no-readme", action="store_true", help="print only; keep the README and the results"
    )
    parser.add_argument(
        "--signals", action="store_true", help="only the pause and cancel latency (2-s turns)"
    )
    parser.add_argument(
        "--debug", action="store_true", help="workers with DEBUG on (default: off, as deployed)"
    )
    parser.add_argument(
        "--step-cpu",
        metavar="A,B",
        help="only the CPU of a read-only tool step: A and B turns (use --latency 0), difference",
    )
    parser.add_argument(
        "--prepare",
        type=int,
        metavar="N",
        help="workers prepare a statement run N times on a connection (prepare_threshold)",
    )
    parser.add_argument("--procrastinate-worker", nargs=5)
    args = parser.parse_args()
    if args.procrastinate_worker:
        conninfo, name, concurrency, latency, turns = args.procrastinate_worker
        return procrastinate_worker(conninfo, name, int(concurrency), float(latency), int(turns))
    global DEBUG, PREPARE
    DEBUG = args.debug
    PREPARE = args.prepare
    if args.signals:
        return signals_main(args)

    uri, datadir = start_server()
    common._BASE_URL = uri  # every scratch database of this benchmark lives on its own server
    db_url = common.recreate_database(DB)
    common.django_on(db_url)
    if args.step_cpu:
        return step_cpu_main(args, db_url, datadir)
    print(
        f"… {args.label}: {args.agents} agents in {args.procs} processes, "
        f"{args.turns} turns of {args.latency:g} s, max_connections = {MAX_CONNECTIONS}",
        flush=True,
    )
    acthelm = run_acthelm(args, db_url, datadir, args.engine_root.resolve())
    peer = None
    if not args.no_peer:
        print("… Procrastinate: the same waits", flush=True)
        peer = run_procrastinate(args, db_url)
    rows = [
        [
            f"Acthelm ({args.label})",
            f"{acthelm['in_review']}/{args.agents} in review",
            acthelm["peak_connections"],
            fmt(args.agents / max(1, acthelm["peak_connections"])),
            fmt(acthelm["elapsed_s"]),
            fmt(acthelm["effective_concurrency"], ".0f"),
            fmt(acthelm["too_many_clients"], "d"),
            acthelm["log_problems"],
            fmt(acthelm["heartbeat_commits_per_s_per_proc"], ".2f"),
            fmt(acthelm["memory_per_agent_kb"], ".0f"),
            fmt(acthelm["server_cpu_ms_per_step"], ".2f"),
            fmt(acthelm["worker_cpu_ms_per_step"], ".2f"),
            fmt(acthelm["pg_cpu_ms_per_step"], ".2f"),
        ]
    ]
    if peer:
        rows.append(
            [
                f"Procrastinate ({args.turns} × asyncio.sleep)",
                f"{args.agents} jobs",
                peer["peak_connections"],
                fmt(args.agents / max(1, peer["peak_connections"])),
                fmt(peer["elapsed_s"]),
                fmt(peer["effective_concurrency"], ".0f"),
                "",
                "",
                "",
                "",
                "",
                "",
                "",
            ]
        )
    headers = [
        "engine",
        "done",
        "peak connections",
        "agents / connection",
        "elapsed s",
        "effective concurrency",
        "too many clients",
        "log warnings+errors",
        "heartbeat commits/s/proc",
        "worker KiB / agent",
        "server CPU ms / step",
        "worker CPU ms / step (release → last in review)",
        "PostgreSQL CPU ms / step (same interval)",
    ]
    table = common.print_table(f"Fleet: {args.label}", headers, rows)
    facts = common.machine()
    vers = common.versions("procrastinate", "psycopg-pool")
    data = {"facts": facts, "versions": vers, "acthelm": acthelm, "procrastinate": peer}
    ok_conn = acthelm["peak_connections"] <= max(
        MAX_GOAL_CONNECTIONS, peer["peak_connections"] if peer else 0
    )
    goals = [
        [
            f"{args.agents} agents, {args.procs} processes, L = {args.latency:g} s: all in review",
            f"{acthelm['in_review']}/{args.agents}",
            common.verdict(acthelm["in_review"] == args.agents),
        ],
        [
            "peak connections ≤ Procrastinate's (≤ 20)",
            f"{acthelm['peak_connections']} (Procrastinate "
            f"{peer['peak_connections'] if peer else 'n/a'})",
            common.verdict(ok_conn),
        ],
        [
            "effective concurrency ≥ 0.9 N",
            fmt(acthelm["effective_concurrency"], ".0f"),
            common.verdict(acthelm["effective_concurrency"] >= 0.9 * args.agents),
        ],
        [
            "no errors in the logs",
            f"{acthelm['log_problems']} warnings/errors, {acthelm['too_many_clients']} too many "
            "clients",
            common.verdict(acthelm["log_problems"] == 0 and not acthelm["too_many_clients"]),
        ],
    ]
    section = (
        f"## Fleet\n\n`.venv/bin/python bench/fleet.py --agents {args.agents} --latency "
        f"{args.latency:g} --turns {args.turns} --procs {args.procs}"
        f"{' --debug' if args.debug else ''}` ({facts.get('date', '')}, DEBUG "
        f"{'on' if args.debug else 'off'}):\n\n{table}\n\n"
        f"{common.facts_line(facts, vers)}\n"
    )
    if not args.no_readme:  # --no-readme: print only (a "before" run keeps the results as they are)
        common.record(NAME, section, data, goals)
    print(json.dumps({"acthelm": acthelm, "procrastinate": peer}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
