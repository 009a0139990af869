"""Many agents, few connections: N agents at once, each waiting L seconds per model turn.

    .venv/bin/python bench/fleet.py [--agents 1000] [--latency 20] [--turns 3] [--procs 2]
                                    [--deadline S] [--peer sleep,http] [--peer-client shared]
                                    [--threaded-model] [--precheck] [--section NAME]
                                    [--engine-root PATH] [--label NAME] [--no-peer] [--debug]
    .venv/bin/python bench/fleet.py --model-alone 10000 --turns 2 --latency 30  # the model alone

A PostgreSQL of its own (pgserver, in var/bench-fleet-pg) started with `max_connections = 50`;
the scripted model of `tests/fakes/holding_model.py` (asyncio, a process of its own: it holds
every request L seconds, however many); N tasks (tools: list_files), then `--procs` real
`manage.py acthelm_worker` processes with `--concurrency N/procs`. Each task takes `turns` model
turns (turns - 1 read-only tool calls, then the answer), so the ideal elapsed time is turns × L.
Printed and recorded:

- peak connections to the benchmark database (pg_stat_activity, sampled every 0.1 s), agents per
  connection, `too many clients` in the server's log, warnings and errors in the workers' logs;
- effective concurrency = agents × turns × L ÷ elapsed (claim of the first task to the last task
  in review); goal ≥ 0.9 N. With `--deadline S` the run stops S seconds after the release of the
  tasks and reports what reached review by then (effective concurrency n/a unless all did);
- lost and limit counts, from the database at the end: runs ended `worker_lost`, runs after a
  task's first (re-runs: paid model requests repeated), runs and tasks ended `limit_runtime`,
  every other run error code, the tasks by status; and requests the model answered beyond one a
  turn;
- heartbeat commits/s per process (the process heartbeat's statements, from the workers' own
  count, over the elapsed time), worker memory per agent (RSS at the plateau — every agent past
  its first answer, else the peak — minus an idle worker process's RSS, over its agents), server
  CPU per step (postmaster and children, over model turns);
- CPU per step, from the release of the tasks (held back by `not_before` until every worker
  listens, so that start-up is not counted) to the last one in review, over the model turns: the
  worker processes' user + system CPU (/proc/<pid>/stat) and the embedded PostgreSQL's (the
  postmaster and all its backends, from /proc; n/a for a server elsewhere). `--latency 0` makes it
  the CPU of a step with a zero-latency model (add `--no-peer --no-readme`);
- the model's side, for each run: requests held at once (peak), when the first and the last
  request of each turn arrived (seconds after the release), how late its answers left (seconds
  past L: a starved model shows here) and its CPU seconds; and the peak 1-minute load average;
- the peers, on the same server in the same run, each in `--procs` Procrastinate worker processes
  of concurrency N/procs: `sleep`, N jobs that each wait `turns` times L seconds
  (`asyncio.sleep`); `http` (the fair peer), N jobs that each make `turns` requests to a holding
  model of their own (the same L) with the bodies of an Acthelm run's turns (same shape, padded
  to the same bytes), from one `httpx.AsyncClient` per worker process (`--peer-client shared`,
  no pool limit), one per job (`per-job`) or one per SHARD jobs (`sharded`: httpcore's pool
  stalls at ~1,000 connections, encode/httpcore #1035); `both` runs shared and per-job, `all`
  the three. Each peer row: elapsed,
  effective concurrency, peak connections, worker CPU a job-turn, worker KiB a job (peak RSS less
  the process's own before the jobs were deferred), failed jobs.

`--model-alone N` measures only the scripted model: N concurrent conversations of `turns`
requests (the bodies of an Acthelm turn) from a raw asyncio client in this process, each on one
keep-alive connection; prints elapsed, the model's CPU and lateness (`--precheck` runs it for
`--agents` before the rows). `--threaded-model` swaps in the threaded model (a thread per held
request sharing the cores with the workers: issue 51's overload) for every run, peers included.

The open-file limit is raised to its hard limit in this process, so the model, the workers and
the peers inherit it (a socket per held request on each side); the workers' limit is printed.

The workers run as deployed, with `DEBUG` off (`--debug`: on). `--section NAME` records the run
as bench/README.md's section NAME (default `fleet`; issue 51's rows: `fleet_1000`, `fleet_3000`,
`fleet_10000`).

`--engine-root PATH` runs the workers from another checkout (for the "before" row: a worktree of
an earlier commit; its venv is this one). The fair-comparison note: both sides wait the same L
per step, on the same PostgreSQL; Acthelm also does its durable bookkeeping per step (turn, call,
event, checkpoint rows), Procrastinate only its job row — that is the point of the comparison.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import re
import resource
import signal
import ssl
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

#: --peer-client sharded: jobs per httpx.AsyncClient of the fair peer.
SHARD = 100
THREADED_MODEL = False  # --threaded-model: a thread per held request (issue 51's overload)
#: Bytes of an Acthelm request body by turn (0: the first request), used for the fair peer and
#: the model-alone check when no Acthelm run of this invocation measured them: the first two
#: measured (a 200 × 2 run of this tree, 2026-12-07), the later ones grown by the same step.
DEFAULT_BODY_BYTES = [1316 + 324 * k for k in range(8)]


#: --model-nice N: the asyncio model's scheduling priority (a provider elsewhere does not share
#: the workers' cores; lowering N below 0 needs root, else it stays 0). The threaded model of the
#: overload rows keeps 0: sharing the cores is its point.
DEFAULT_MODEL_NICE = -10
MODEL_NICE = DEFAULT_MODEL_NICE


def start_model(latency: float, turns: int):
    from tests.fakes.holding_model import HoldingModel

    model = HoldingModel(latency, turns, threaded=THREADED_MODEL)
    if MODEL_NICE and not THREADED_MODEL:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, model.pid, MODEL_NICE)
    return model, model.url


def model_nice(model) -> int | None:
    try:
        return os.getpriority(os.PRIO_PROCESS, model.pid)
    except OSError:
        return None


def stop_model(model) -> dict:
    return model.close()


def model_summary(stats: dict, released: float) -> dict:
    """The model's counts, times made relative to `released` (Unix time)."""
    turns = {
        k: {
            "arrived": v["arrived"],
            "first_s": v["first"] - released,
            "last_s": v["last"] - released,
            "body_bytes": v["bytes"] / max(1, v["arrived"]),
        }
        for k, v in (stats.get("turns") or {}).items()
    }
    return {**{k: v for k, v in stats.items() if k != "turns"}, "turns": turns}


def body_bytes(model: dict | None, turns: int) -> list[int]:
    """Mean body bytes of each turn's requests an Acthelm run sent (else the defaults)."""
    measured = (model or {}).get("turns") or {}
    return [
        round(measured[str(k)]["body_bytes"])
        if str(k) in measured
        else DEFAULT_BODY_BYTES[min(k, len(DEFAULT_BODY_BYTES) - 1)]
        for k in range(turns)
    ]


def request_bodies(sizes: list[int]) -> list[bytes]:
    """Chat-completion bodies shaped as an agent's turns (system, user, then per earlier turn an
    assistant tool call and its result), the system message padded to the bytes of `sizes`."""
    out = []
    for k, size in enumerate(sizes):
        messages: list[dict] = [
            {"role": "system", "content": ""},
            {"role": "user", "content": "List the files, twice, then answer."},
        ]
        for i in range(k):
            call = {"id": f"call_{i}", "type": "function"}
            call["function"] = {"name": "list_files", "arguments": "{}"}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
            messages.append({"role": "tool", "tool_call_id": f"call_{i}", "content": "[]"})
        request = {"model": "test-model", "messages": messages, "tools": []}
        base = len(json.dumps(request).encode())
        messages[0]["content"] = "x" * max(0, size - base)
        out.append(json.dumps(request).encode())
    return out


async def _converse(host: str, port: int, bodies: list[bytes]) -> None:
    """One conversation on one keep-alive connection: each body in turn, each answer read."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        for body in bodies:
            writer.write(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: model\r\n"
                b"content-type: application/json\r\n"
                + f"content-length: {len(body)}\r\n\r\n".encode()
                + body
            )
            await writer.drain()
            head = await reader.readuntil(b"\r\n\r\n")
            length = re.search(rb"content-length: (\d+)", head, re.I)
            data = await reader.readexactly(int(length.group(1)) if length else 0)
            json.loads(data)
    finally:
        writer.close()


def model_alone(conversations: int, turns: int, latency: float, sizes: list[int]) -> dict:
    """The scripted model alone: `conversations` at once, `turns` requests each, from a raw
    asyncio client in this process. Elapsed, the model's CPU and lateness, the client's CPU."""
    from urllib.parse import urlsplit

    model, url = start_model(latency, turns)
    nice = model_nice(model)
    parts = urlsplit(url)
    bodies = request_bodies(sizes)

    async def fire() -> list:
        return await asyncio.gather(
            *(_converse(parts.hostname, parts.port, bodies) for _ in range(conversations)),
            return_exceptions=True,
        )

    # The client at the model's priority too, so that a loaded box measures the model, not the
    # start of this process's 10,000 connections; back to its own after.
    own_nice = os.getpriority(os.PRIO_PROCESS, 0)
    if MODEL_NICE and not THREADED_MODEL:
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, MODEL_NICE)
    client_nice = os.getpriority(os.PRIO_PROCESS, 0)
    client0 = common.cpu_seconds(os.getpid())
    released = time.time()
    t0 = time.monotonic()
    try:
        results = asyncio.run(fire())
        elapsed = time.monotonic() - t0
        client_cpu = common.cpu_seconds(os.getpid()) - client0
    finally:
        stats = model_summary(stop_model(model), released)
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, 0, own_nice)
    errors = [r for r in results if isinstance(r, BaseException)]
    first = (stats["turns"].get("0") or {}).get("first_s")
    return {
        "conversations": conversations,
        "turns": turns,
        "latency": latency,
        "threaded": THREADED_MODEL,
        "body_bytes": sizes,
        "elapsed_s": elapsed,
        "ideal_s": turns * latency,
        # The client's own start (10,000 connections opened by one Python process) left out.
        "from_first_arrival_s": None if first is None else elapsed - first,
        "failed": len(errors),
        "errors": sorted({type(e).__name__ + ": " + str(e)[:80] for e in errors})[:5],
        "client_cpu_s": client_cpu,
        "model_nice": nice,
        "client_nice": client_nice,
        "model": stats,
    }


def print_model_alone(out: dict) -> None:
    model = out["model"]
    common.print_table(
        f"The scripted model alone ({'threaded' if out['threaded'] else 'asyncio'}, nice "
        f"{out['model_nice']}): "
        f"{out['conversations']} conversations × {out['turns']} requests, L = {out['latency']:g} s",
        [
            "conversations done",
            "elapsed s (ideal)",
            "from the first arrival s",
            "peak requests held",
            "model CPU s",
            "late p50 / p99 / max s",
            "turn arrivals, first → last s",
            "client CPU s",
        ],
        [
            [
                f"{out['conversations'] - out['failed']}/{out['conversations']}",
                f"{out['elapsed_s']:.1f} ({out['ideal_s']:g})",
                fmt(out["from_first_arrival_s"]),
                model.get("peak"),
                fmt(model.get("cpu_s"), ".1f"),
                " / ".join(
                    fmt(model.get(k), ".2f") for k in ("late_p50_s", "late_p99_s", "late_max_s")
                ),
                arrivals(model),
                fmt(out["client_cpu_s"], ".1f"),
            ]
        ],
    )
    if out["errors"]:
        print("errors:", out["errors"])


def arrivals(model: dict | None) -> str:
    """`turn k: count, first → last s` for each turn the model saw."""
    turns = (model or {}).get("turns") or {}
    return "; ".join(
        f"{int(k) + 1}: {v['arrived']}, {v['first_s']:.1f} → {v['last_s']:.1f}"
        for k, v in sorted(turns.items(), key=lambda kv: int(kv[0]))
    )


# --- memory -------------------------------------------------------------------------------------


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


# --- open files ---------------------------------------------------------------------------------


def raise_nofile() -> int:
    """This process's soft limit of open files raised to the hard one; the children inherit it
    (the model, the workers and the peers each hold a socket per request in flight)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def nofile(pid: int) -> int | None:
    """A live process's soft limit of open files (/proc/<pid>/limits)."""
    try:
        for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
            if line.startswith("Max open files"):
                return int(line.split()[3])
    except (OSError, ValueError, IndexError):
        pass
    return None


def check_nofile(agents: int, procs: int) -> dict:
    """The limit here and what each side needs: the model a socket per agent, a worker (or a
    peer process) one per agent it runs, plus some for the rest."""
    limit = raise_nofile()
    need = {"model": agents + 64, "worker": agents // max(1, procs) + 256}
    short = [f"{side} needs ~{n}" for side, n in need.items() if n > limit]
    if short:
        print(f"!! RLIMIT_NOFILE is {limit}: {', '.join(short)}", flush=True)
    return {"limit": limit, "need": need}


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


def progress(label: str, t: float, done: int, total: int, model, extra: str = "") -> None:
    """One line a while: what reached review and what the model holds."""
    stats = model.stats(timeout=2) if model is not None else None
    held = "" if stats is None else f", model holds {stats['open']}"
    if stats and stats.get("turns"):
        held += (
            " (arrived by turn: "
            + ", ".join(f"{int(k) + 1}: {v['arrived']}" for k, v in sorted(stats["turns"].items()))
            + ")"
        )
    print(f"   {label} t={t:.0f} s: {done}/{total} done{extra}{held}", flush=True)


def run_outcomes() -> dict:
    """What became of the runs and tasks, from the database: issue 51's lost and limit counts."""
    from django.db.models import Count

    from agents.failure_codes import FailureCode
    from agents.models import AgentRun
    from tasks.models import Task

    runs = AgentRun.objects.filter(task__title__startswith="fleet ")
    tasks = Task.objects.filter(title__startswith="fleet ")
    codes = dict(
        runs.exclude(error_code="").values_list("error_code").annotate(n=Count("id")).order_by()
    )
    return {
        "runs": runs.count(),
        "worker_lost": codes.get(FailureCode.WORKER_LOST, 0),
        "reruns": runs.filter(number__gt=1).count(),
        "limit_runtime_runs": codes.get(FailureCode.LIMIT_RUNTIME, 0),
        "limit_runtime_tasks": tasks.filter(failure_code=FailureCode.LIMIT_RUNTIME).count(),
        "run_error_codes": codes,
        "task_failure_codes": dict(
            tasks.exclude(failure_code="")
            .values_list("failure_code")
            .annotate(n=Count("id"))
            .order_by()
        ),
        "tasks_by_status": dict(tasks.values_list("status").annotate(n=Count("id")).order_by()),
    }


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
    nice = model_nice(model_proc)
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
    worker_nofile: list[int | None] = []
    in_review_at_stop, turns_at_stop, load_peak = 0, 0, 0.0
    stopped_by_deadline = False
    released = time.time()
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
            worker_nofile = [nofile(c.pid) for c in children]
            time.sleep(1.0)  # past their first maintenance pass
            cpu["workers_before"] = sum(common.cpu_seconds(c.pid) for c in children)
            cpu["server_before"] = common.postgres_cpu_seconds(datadir)
            with connection.cursor() as cursor:
                cursor.execute("UPDATE tasks_task SET not_before = NULL")
                cursor.execute("SELECT pg_notify(%s, '')", [READY_CHANNEL])
            released = time.time()
            t_release = time.monotonic()
            plateau: list[int] = []
            peak_rss = [0] * len(children)

            def assistant_turns() -> int:
                return Turn.objects.filter(role="assistant").count()

            def in_review() -> int:
                return Task.objects.filter(status="review").count()

            limit = args.deadline or args.turns * args.latency * 4 + 120
            sampled, last_print = False, 0.0
            while True:
                now = time.monotonic() - t_release
                peak_rss = [max(p, rss_kb(c.pid)) for p, c in zip(peak_rss, children, strict=True)]
                load_peak = max(load_peak, os.getloadavg()[0])
                turns_at_stop, in_review_at_stop = assistant_turns(), in_review()
                if not sampled and turns_at_stop >= args.agents:
                    plateau = [rss_kb(c.pid) for c in children]
                    sampled = True
                if in_review_at_stop >= args.agents:
                    break
                if now >= limit:
                    stopped_by_deadline = True
                    break
                if now - last_print >= 15:
                    last_print = now
                    progress("Acthelm", now, in_review_at_stop, args.agents, model_proc)
                time.sleep(0.5)
            cpu["workers_after"] = sum(common.cpu_seconds(c.pid) for c in children)
            cpu["server_after"] = common.postgres_cpu_seconds(datadir)
            wall = time.monotonic() - t_release
            if not sampled:
                plateau = peak_rss
        finally:
            stop_workers(children)
    common.settle_stats()
    after = common.server_snapshot(DB)
    delta = common.server_delta(before, after)
    model_stats = model_summary(stop_model(model_proc), released)
    in_review = Task.objects.filter(status="review").count()
    runs = AgentRun.objects.filter(task__title__startswith="fleet ")
    first = runs.order_by("started_at").values_list("started_at", flat=True).first()
    last = (
        Task.objects.filter(status="review").order_by("-updated_at").values_list("updated_at")
    ).first()
    if in_review_at_stop >= args.agents and first and last:
        elapsed = (last[0] - first).total_seconds()
    else:
        elapsed = wall  # stopped by the deadline (or the safety limit): its own length
    turns = turns_at_stop
    final_turns = Turn.objects.filter(role="assistant").count()
    outcomes = run_outcomes()
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
    all_done = in_review_at_stop >= args.agents
    return {
        "agents": args.agents,
        "procs": args.procs,
        "latency": args.latency,
        "turns_per_agent": args.turns,
        "deadline_s": args.deadline,
        "stopped_by_deadline": stopped_by_deadline,
        "in_review_at_stop": in_review_at_stop,
        "in_review": in_review,
        "model_turns": turns,
        "elapsed_s": elapsed,
        "effective_concurrency": args.agents * args.turns * args.latency / elapsed
        if all_done
        else None,
        # What the turns done by the stop are worth, in agents waiting at once.
        "turns_concurrency": turns * args.latency / elapsed if elapsed else None,
        "peak_connections": sampler.peak,
        "distinct_connections": sampler.distinct,
        "too_many_clients": None
        if too_many_before is None
        else server_log_lines("too many clients") - too_many_before,
        "log_problems": log["problems"],
        "log_samples": log["samples"],
        "heartbeat_commits_per_s_per_proc": (sum(beats) / len(beats) / elapsed) if beats else None,
        "worker_rss_mb": [p / 1024 for p in plateau],
        "worker_peak_rss_mb": [p / 1024 for p in peak_rss],
        "rss_at_plateau": sampled,
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
        "outcomes": outcomes,
        # Requests the model answered beyond the turns stored: repeated (a re-run) or dropped.
        "model_requests_beyond_turns": (model_stats.get("answered") or 0) - final_turns,
        "load_average_peak": load_peak,
        "worker_nofile": worker_nofile,
        "model_server": {**model_stats, "nice": nice},
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


def procrastinate_app(
    conninfo: str,
    latency: float,
    turns: int = 3,
    model_url: str | None = None,
    sizes: list[int] | None = None,
    client_mode: str = "shared",
    concurrency: int = 1,
):
    import logging

    import procrastinate

    logging.getLogger("procrastinate").setLevel(logging.ERROR)
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="waits")
    async def waits() -> None:
        for _ in range(turns):
            await asyncio.sleep(latency)

    bodies = request_bodies(sizes or DEFAULT_BODY_BYTES[:turns])
    shared: dict = {}
    # One TLS context for every client of the process: httpx builds one per client otherwise
    # (loading the CA bundle: 50 ms of CPU a client on this loaded box), which a per-job client
    # would pay for a plain-HTTP model it never uses TLS with.
    tls = ssl.create_default_context()

    def new_client():
        import httpx

        # No pool limit (httpx's default is 100 connections): every job's request in flight.
        return httpx.AsyncClient(
            verify=tls,
            timeout=httpx.Timeout(latency * 4 + 600),
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        )

    async def converse(client) -> None:
        for body in bodies:
            response = await client.post(
                f"{model_url}/chat/completions",
                content=body,
                headers={"content-type": "application/json"},
            )
            response.raise_for_status()
            _ = response.json()["choices"][0]["message"]

    # sharded: a client for every SHARD jobs of the process, the jobs taken round-robin, so that
    # no pool holds more than ~SHARD connections (httpcore's pool scans all of its connections
    # for each idle one on every request: encode/httpcore #1035).
    clients = max(1, -(-concurrency // SHARD))
    turn = itertools.count()

    @app.task(name="asks")
    async def asks() -> None:
        if client_mode in ("shared", "sharded"):
            key = next(turn) % clients if client_mode == "sharded" else 0
            if key not in shared:
                shared[key] = new_client()
            await converse(shared[key])
        else:
            async with new_client() as client:
                await converse(client)

    return app


def procrastinate_worker(spec: dict) -> int:
    raise_nofile()
    app = procrastinate_app(
        spec["conninfo"],
        spec["latency"],
        spec["turns"],
        spec.get("model_url"),
        spec.get("sizes"),
        spec.get("client", "shared"),
        spec["concurrency"],
    )
    with app.open():
        app.run_worker(
            concurrency=spec["concurrency"],
            wait=True,
            name=spec["name"],
            listen_notify=True,
            install_signal_handlers=True,
            delete_jobs="never",
        )
    return 0


def run_procrastinate(
    args, db_url: str, kind: str = "sleep", client: str = "shared", sizes: list[int] | None = None
) -> dict:
    """N Procrastinate jobs in `--procs` processes: `sleep` (asyncio.sleep L, `turns` times) or
    `http` (`turns` requests to a holding model of their own, from a shared client or one a
    job)."""
    import psycopg

    conninfo = common.libpq(db_url)
    task_name = "waits" if kind == "sleep" else "asks"
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
    model = None
    model_url = None
    if kind == "http":
        model, model_url = start_model(args.latency, args.turns)
        nice = model_nice(model)
    per_proc = args.agents // args.procs
    children: list[subprocess.Popen] = []
    poll = psycopg.connect(conninfo, autocommit=True)
    own = poll.execute("SELECT pg_backend_pid()").fetchone()[0]
    label = f"Procrastinate {kind}" + (f" ({client} client)" if kind == "http" else "")
    released = time.time()
    load_peak, stopped_by_deadline = 0.0, False
    with poll, common.ConnectionSampler(DB, exclude=(own,)) as sampler:
        try:
            children = [
                subprocess.Popen(
                    [
                        sys.executable,
                        __file__,
                        "--procrastinate-worker",
                        json.dumps(
                            {
                                "conninfo": conninfo,
                                "name": f"pq-{i}",
                                "concurrency": per_proc,
                                "latency": args.latency,
                                "turns": args.turns,
                                "model_url": model_url,
                                "sizes": sizes,
                                "client": client,
                            }
                        ),
                    ],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    start_new_session=True,
                )
                for i in range(args.procs)
            ]

            def registered() -> bool:
                return (
                    poll.execute("SELECT count(*) FROM procrastinate_workers").fetchone()[0]
                    >= args.procs
                )

            common.wait_until(registered, timeout=120, interval=0.2, what="procrastinate workers")
            time.sleep(1.0)
            idle = [rss_kb(c.pid) for c in children]  # each process before its jobs
            cpu0 = sum(common.cpu_seconds(c.pid) for c in children)
            with app.open():
                app.tasks[task_name].batch_defer(*([{}] * args.agents))
            released = time.time()
            t_release = time.monotonic()
            peak = list(idle)
            limit = args.deadline or args.turns * args.latency * 4 + 120
            last_print = 0.0
            while True:
                now = time.monotonic() - t_release
                peak = [max(p, rss_kb(c.pid)) for p, c in zip(peak, children, strict=True)]
                load_peak = max(load_peak, os.getloadavg()[0])
                done, failed = poll.execute(
                    "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
                    "count(*) FILTER (WHERE status = 'failed') FROM procrastinate_jobs"
                ).fetchone()
                if done + failed >= args.agents:
                    break
                if now >= limit:
                    stopped_by_deadline = True
                    break
                if now - last_print >= 15:
                    last_print = now
                    progress(label, now, done, args.agents, model, f", {failed} failed")
                time.sleep(0.5)
            cpu1 = sum(common.cpu_seconds(c.pid) for c in children)
            wall = time.monotonic() - t_release
            start, end = poll.execute(
                "SELECT extract(epoch FROM min(at) FILTER (WHERE type = 'started')), "
                "extract(epoch FROM max(at) FILTER (WHERE type = 'succeeded')) "
                "FROM procrastinate_events"
            ).fetchone()
        finally:
            stop_workers(children)
            model_stats = (
                {**model_summary(stop_model(model), released), "nice": nice} if model else None
            )
    all_done = done >= args.agents
    turns_done = (model_stats or {}).get("answered", 0) if kind == "http" else done * args.turns
    elapsed = float(end) - float(start) if all_done and start and end else wall
    per_job_kb = [(p - i) / max(1, per_proc) for p, i in zip(peak, idle, strict=True)]
    return {
        "kind": kind,
        "client": client if kind == "http" else None,
        "label": label,
        "jobs": args.agents,
        "succeeded": done,
        "failed": failed,
        "stopped_by_deadline": stopped_by_deadline,
        "elapsed_s": elapsed,
        "effective_concurrency": args.agents * args.turns * args.latency / elapsed
        if all_done
        else None,
        "peak_connections": sampler.peak,
        "worker_cpu_s": cpu1 - cpu0,
        # Over the requests the model answered (http) or the sleeps of the jobs done (sleep).
        "worker_cpu_ms_per_job_turn": (cpu1 - cpu0) * 1000 / turns_done if turns_done else None,
        "worker_idle_rss_mb": [i / 1024 for i in idle],
        "worker_peak_rss_mb": [p / 1024 for p in peak],
        "memory_per_job_kb": sum(per_job_kb) / len(per_job_kb),
        "load_average_peak": load_peak,
        "body_bytes": sizes if kind == "http" else None,
        "model_server": model_stats,
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


def model_cell(model: dict | None) -> str:
    """The model's side of a run: peak held, CPU, lateness."""
    if not model:
        return ""
    return (
        f"peak {model.get('peak')}, CPU {fmt(model.get('cpu_s'), '.1f')} s, late max "
        f"{fmt(model.get('late_max_s'), '.2f')} s"
    )


def fleet_main(args, db_url: str, datadir: str, limits: dict) -> int:
    deadline = f", deadline {args.deadline:g} s" if args.deadline else ""
    print(
        f"… {args.label}: {args.agents} agents in {args.procs} processes, "
        f"{args.turns} turns of {args.latency:g} s{deadline}, max_connections = "
        f"{MAX_CONNECTIONS}, open files {limits['limit']}, "
        f"{'threaded model' if THREADED_MODEL else f'asyncio model (nice {MODEL_NICE})'}",
        flush=True,
    )
    precheck = None
    if args.precheck:
        print(f"… the model alone: {args.agents} × {args.turns}", flush=True)
        precheck = model_alone(
            args.agents, args.turns, args.latency, DEFAULT_BODY_BYTES[: args.turns]
        )
        print_model_alone(precheck)
    acthelm = run_acthelm(args, db_url, datadir, args.engine_root.resolve())
    sizes = body_bytes(acthelm["model_server"], args.turns)
    peers = []
    kinds = [] if args.no_peer else [k.strip() for k in args.peer.split(",") if k.strip()]
    clients = {
        "both": ["shared", "per-job"],
        "all": ["shared", "per-job", "sharded"],
    }.get(args.peer_client, [args.peer_client])
    for kind in kinds:
        for client in clients if kind == "http" else ["-"]:
            what = "its jobs sleep" if kind == "sleep" else f"HTTP, {client} client, {sizes} B"
            print(f"… Procrastinate: {what}", flush=True)
            peers.append(run_procrastinate(args, db_url, kind, client, sizes))
    a, o = acthelm, acthelm["outcomes"]
    done = f"{a['in_review_at_stop']}/{args.agents} in review"
    if a["stopped_by_deadline"]:
        done += f" at {a['elapsed_s']:.1f} s (deadline)"
    rows = [
        [
            f"Acthelm ({args.label})",
            done,
            fmt(a["elapsed_s"]),
            fmt(a["effective_concurrency"], ".0f"),
            a["peak_connections"],
            fmt(a["worker_cpu_ms_per_step"], ".2f"),
            fmt(a["memory_per_agent_kb"], ".0f"),
            f"{o['worker_lost']} / {o['reruns']}",
            f"{o['limit_runtime_runs']} / {o['limit_runtime_tasks']}",
            model_cell(a["model_server"]),
            fmt(a["load_average_peak"], ".0f"),
        ]
    ]
    for peer in peers:
        pdone = f"{peer['succeeded']}/{args.agents} jobs"
        if peer["failed"]:
            pdone += f", {peer['failed']} failed"
        if peer["stopped_by_deadline"]:
            pdone += f" at {peer['elapsed_s']:.1f} s (deadline)"
        rows.append(
            [
                peer["label"],
                pdone,
                fmt(peer["elapsed_s"]),
                fmt(peer["effective_concurrency"], ".0f"),
                peer["peak_connections"],
                fmt(peer["worker_cpu_ms_per_job_turn"], ".2f"),
                fmt(peer["memory_per_job_kb"], ".0f"),
                "",
                "",
                model_cell(peer["model_server"]),
                fmt(peer["load_average_peak"], ".0f"),
            ]
        )
    headers = [
        "engine",
        "done",
        "elapsed s",
        "effective concurrency",
        "peak connections",
        "worker CPU ms / step (peers: / job-turn)",
        "worker KiB / agent (job)",
        "worker_lost runs / re-runs",
        "limit_runtime runs / tasks",
        "scripted model",
        "peak load average",
    ]
    title = (
        f"Fleet: {args.label}, {args.agents} × {args.turns} turns, L = {args.latency:g} s, "
        f"{args.procs} processes"
    )
    table = common.print_table(title, headers, rows)
    detail_rows = [
        [
            a["peak_connections"],
            fmt(args.agents / max(1, a["peak_connections"])),
            fmt(a["too_many_clients"], "d"),
            a["log_problems"],
            fmt(a["heartbeat_commits_per_s_per_proc"], ".2f"),
            " / ".join(f"{x:.0f}" for x in a["worker_rss_mb"])
            + (" (plateau)" if a["rss_at_plateau"] else " (peak: no plateau)"),
            fmt(a["idle_worker_rss_mb"], ".0f"),
            fmt(a["server_cpu_ms_per_step"], ".2f"),
            fmt(a["pg_cpu_ms_per_step"], ".2f"),
            a["model_requests_beyond_turns"],
            arrivals(a["model_server"]),
            ", ".join(f"{k} {v}" for k, v in sorted(o["run_error_codes"].items())) or "none",
            ", ".join(f"{k} {v}" for k, v in sorted(o["tasks_by_status"].items())),
        ]
    ]
    detail = common.print_table(
        "Acthelm's run in detail",
        [
            "peak connections",
            "agents / connection",
            "too many clients",
            "log warnings+errors",
            "heartbeat commits/s/proc",
            "worker RSS MB",
            "idle worker MB",
            "server CPU ms / step",
            "PostgreSQL CPU ms / step",
            "model requests beyond the turns stored",
            "model arrivals by turn: count, first → last s after the release",
            "run error codes",
            "tasks by status",
        ],
        detail_rows,
    )
    if a["log_samples"]:
        print("log samples:", a["log_samples"])
    print(f"workers' open-file limit: {a['worker_nofile']}; needed: {limits['need']}")
    facts = common.machine()
    vers = common.versions("procrastinate", "psycopg-pool", "httpx", "httpcore")
    data = {
        "facts": facts,
        "versions": vers,
        "args": {k: str(v) for k, v in vars(args).items()},
        "nofile": limits,
        "model_alone": precheck,
        "acthelm": acthelm,
        "procrastinate": peers,
    }
    peer_conn = max([p["peak_connections"] for p in peers] or [0])
    ok_conn = a["peak_connections"] <= max(MAX_GOAL_CONNECTIONS, peer_conn)
    eff = a["effective_concurrency"]
    goals = [
        [
            f"{args.agents} agents × {args.turns}, {args.procs} processes, L = {args.latency:g} s: "
            "all in review" + (f" within {args.deadline:g} s" if args.deadline else ""),
            f"{a['in_review_at_stop']}/{args.agents}",
            common.verdict(a["in_review_at_stop"] == args.agents),
        ],
        [
            "peak connections ≤ Procrastinate's (≤ 20)",
            f"{a['peak_connections']} (Procrastinate {peer_conn if peers else 'n/a'})",
            common.verdict(ok_conn),
        ],
        [
            "effective concurrency ≥ 0.9 N",
            fmt(eff, ".0f"),
            common.verdict(eff is not None and eff >= 0.9 * args.agents),
        ],
        [
            "0 worker_lost, 0 limit_runtime",
            f"{o['worker_lost']} lost ({o['reruns']} re-runs), {o['limit_runtime_runs']} "
            "limit_runtime",
            common.verdict(o["worker_lost"] == 0 and o["limit_runtime_runs"] == 0),
        ],
        [
            "no errors in the logs",
            f"{a['log_problems']} warnings/errors, {a['too_many_clients']} too many clients",
            common.verdict(a["log_problems"] == 0 and not a["too_many_clients"]),
        ],
    ]
    if args.agents >= 1000:
        kb = a["memory_per_agent_kb"]
        goals.append(
            [
                "workers' memory ≤ 50 KB a waiting agent (issue 51)",
                fmt(kb, ".0f"),
                common.verdict(kb is not None and kb <= 50),
            ]
        )
    flags = (
        f"--agents {args.agents} --latency {args.latency:g} --turns {args.turns} "
        f"--procs {args.procs}"
        + (f" --deadline {args.deadline:g}" if args.deadline else "")
        + (" --precheck" if args.precheck else "")
        + (" --threaded-model" if THREADED_MODEL else "")
        + (f" --model-nice {MODEL_NICE}" if MODEL_NICE != DEFAULT_MODEL_NICE else "")
        + (f" --peer {args.peer}" if args.peer != "sleep,http" and not args.no_peer else "")
        + (" --no-peer" if args.no_peer else "")
        + (f" --peer-client {args.peer_client}" if args.peer_client != "shared" else "")
        + (" --debug" if args.debug else "")
        + (f" --section {args.section}" if args.section != NAME else "")
    )
    section = (
        f"## {'Fleet' if args.section == NAME else 'Fleet, ' + args.section}\n\n"
        f"`.venv/bin/python bench/fleet.py {flags}` ({facts.get('date', '')}, DEBUG "
        f"{'on' if args.debug else 'off'}):\n\n{table}\n\n{detail}\n\n"
        f"{common.facts_line(facts, vers)}\n"
    )
    if not args.no_readme:  # --no-readme: print only (a "before" run keeps the results as they are)
        common.record(args.section, section, data, goals)
    print(json.dumps(data, indent=2, default=str))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--agents", type=int, default=1000)
    parser.add_argument("--latency", type=float, default=20.0)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument(
        "--deadline",
        type=float,
        metavar="S",
        help="stop each run S seconds after its release and report what finished",
    )
    parser.add_argument("--engine-root", type=Path, default=common.ROOT)
    parser.add_argument("--label", default="this commit")
    parser.add_argument("--no-peer", action="store_true")
    parser.add_argument(
        "--peer", default="sleep,http", help="the Procrastinate peers to run: sleep, http or both"
    )
    parser.add_argument(
        "--peer-client",
        choices=("shared", "per-job", "sharded", "both", "all"),
        default="shared",
        help="the http peer's httpx.AsyncClient: one per worker process, one per job, one per "
        f"{SHARD} jobs; both: shared and per-job; all: the three",
    )
    parser.add_argument(
        "--threaded-model",
        action="store_true",
        help="a thread per held request in the scripted model (the overload of issue 51)",
    )
    parser.add_argument(
        "--model-nice",
        type=int,
        default=DEFAULT_MODEL_NICE,
        metavar="N",
        help=f"the asyncio model's niceness (default {DEFAULT_MODEL_NICE}; needs root below 0)",
    )
    parser.add_argument(
        "--model-alone",
        type=int,
        metavar="N",
        help="only the scripted model: N concurrent conversations of --turns requests",
    )
    parser.add_argument(
        "--precheck", action="store_true", help="the model alone at --agents before the rows"
    )
    parser.add_argument(
        "--section", default=NAME, help="bench/README.md section and results file (fleet_1000 …)"
    )
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
    parser.add_argument("--procrastinate-worker", metavar="JSON")
    args = parser.parse_args()
    if args.procrastinate_worker:
        return procrastinate_worker(json.loads(args.procrastinate_worker))
    global DEBUG, PREPARE, THREADED_MODEL, MODEL_NICE
    DEBUG = args.debug
    MODEL_NICE = args.model_nice
    PREPARE = args.prepare
    THREADED_MODEL = args.threaded_model
    if not re.fullmatch(r"fleet(_[a-z0-9_]+)?", args.section):
        parser.error("--section: fleet or fleet_<something>")
    size = args.model_alone or args.agents
    limits = check_nofile(size, 1 if args.model_alone else args.procs)
    if args.model_alone:
        out = model_alone(
            args.model_alone, args.turns, args.latency, DEFAULT_BODY_BYTES[: args.turns]
        )
        print_model_alone(out)
        print(json.dumps({"nofile": limits, **out}, indent=2, default=str))
        return 0 if not out["failed"] else 1
    if args.signals:
        return signals_main(args)

    uri, datadir = start_server()
    common._BASE_URL = uri  # every scratch database of this benchmark lives on its own server
    db_url = common.recreate_database(DB)
    common.django_on(db_url)
    if args.step_cpu:
        return step_cpu_main(args, db_url, datadir)
    return fleet_main(args, db_url, datadir, limits)


if __name__ == "__main__":
    raise SystemExit(main())
