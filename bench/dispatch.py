"""Dispatch throughput: tasks/s through claim → one scripted model turn → supervisor → review,
for 1, 2 and 8 worker processes, against Procrastinate running no-op jobs with the same process and
concurrency counts, and against the floor: a raw psycopg loop per process of one SKIP LOCKED claim
UPDATE and one fenced completion UPDATE per job.

    .venv/bin/python bench/dispatch.py [--tasks 400] [--procs 1,2,8] [--count-tasks 100]
                                       [--profile-tasks 150] [--no-profile] [--concurrency 1]
                                       [--repeat 3]

`--concurrency C`: each worker process of both systems runs C at once (Acthelm's
`acthelm_worker --concurrency C`, whose dispatcher claims for its free places in one statement;
Procrastinate's `run_worker(concurrency=C)`); its results go to a section of their own
(`dispatch_c<C>`), next to the concurrency-1 one.

Acthelm and both Procrastinate peers run `--repeat` times (3), interleaved run by run, and each
keeps its median run; the floor runs as often, after them. Each system gets the same shape of run:
its worker processes are started first and wait idle (LISTEN), then all N jobs become visible in
one commit; the clock runs from just after that commit to the last job's completion time as
recorded in the database.
Process start-up is not counted.
The scripted model (`bench/model_server.py done`, a process of its own, OpenAI-compatible on
loopback) answers "done" at once; no tools are offered. Goals (issue 12): at 2 processes
≥ 1.0× Procrastinate's no-op jobs/s, at least 0.3×; the floor is for reference.

That goal's peer is not a fair comparison, and the table says so: a no-op job pays no model I/O,
stores nothing and has no verdict. Beside it, the fair peer: Procrastinate jobs that each ask the
same scripted model what a one-turn task asks (one keep-alive httpx client per process) and store
its answer in a row — the same model I/O and the same database, with Procrastinate's durability
(the answer's commit and the job's). Acthelm still does more per task (the conversation, the
turn, the verdict, the task's move to review and its event); no goal is set against it.

One task, counted: one worker process (--burst) over --count-tasks tasks with nothing else on
the scratch database; the server's statements (logged), transactions, COMMIT records in the WAL
(goal ≤ 2 per task), WAL bytes, rows and CPU, per task (common.server_snapshot). Then the same
tasks through the in-process measuring slot (bench/inline.py): SQL statements per task by kind,
and a task's time split into SQL, model HTTP and Python; and once more under cProfile.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from model_server import ModelServerProcess  # noqa: E402

NAME = "dispatch"
DB = "acthelm_bench_dispatch"
GOAL_PROCS = 2
GOAL_VS_PROCRASTINATE, MIN_VS_PROCRASTINATE = 1.0, 0.3
GOAL_COMMITS = 2


# --- the floor: a raw psycopg loop -------------------------------------------------------------

FLOOR_SCHEMA = """
DROP TABLE IF EXISTS bench_floor;
CREATE TABLE bench_floor (
    id bigserial PRIMARY KEY,
    status text NOT NULL DEFAULT 'ready',
    claim_count integer NOT NULL DEFAULT 0,
    worker text NOT NULL DEFAULT '',
    finished_at timestamptz
);
CREATE INDEX bench_floor_ready ON bench_floor (id) WHERE status = 'ready';
"""
FLOOR_CLAIM = """
WITH c AS (
    SELECT id FROM bench_floor WHERE status = 'ready' ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED
)
UPDATE bench_floor f SET status = 'running', claim_count = f.claim_count + 1, worker = %s
FROM c WHERE f.id = c.id RETURNING f.id, f.claim_count
"""
FLOOR_DONE = """
UPDATE bench_floor SET status = 'done', finished_at = clock_timestamp()
WHERE id = %s AND claim_count = %s AND status = 'running'
"""


def floor_worker(conninfo: str, name: str) -> int:
    """One process of the floor: claim, complete (fenced by the claim counter), repeat."""
    import psycopg

    with psycopg.connect(conninfo, autocommit=True) as conn:
        print("ready", flush=True)
        sys.stdin.readline()  # the go signal
        done = 0
        while True:
            row = conn.execute(FLOOR_CLAIM, [name]).fetchone()
            if row is None:
                break
            if conn.execute(FLOOR_DONE, row).rowcount != 1:
                raise SystemExit("floor: the fenced completion updated no row")
            done += 1
    return 0


def run_floor(db_url: str, procs: int, jobs: int) -> dict:
    import psycopg

    conninfo = common.libpq(db_url)
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute(FLOOR_SCHEMA)
        conn.execute(
            "INSERT INTO bench_floor (status) SELECT 'ready' FROM generate_series(1, %s)", [jobs]
        )
        conn.execute("ANALYZE bench_floor")
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--floor-worker", conninfo, f"floor-{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(procs)
    ]
    for child in children:
        assert child.stdout.readline().strip() == "ready"
    t0 = time.time()
    for child in children:
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        if child.wait(600) != 0:
            raise RuntimeError("a floor worker failed")
    with psycopg.connect(conninfo, autocommit=True) as conn:
        count, end = conn.execute(
            "SELECT count(*), extract(epoch FROM max(finished_at)) FROM bench_floor "
            "WHERE status = 'done'"
        ).fetchone()
    if count != jobs:
        raise RuntimeError(f"floor: {count} of {jobs} jobs done")
    elapsed = float(end) - t0
    return {"jobs": jobs, "seconds": elapsed, "per_s": jobs / elapsed}


# --- Procrastinate: no-op jobs, and jobs that pay a task's model I/O --------------------------

#: The fair peer's job (`--peer-model`): what a one-turn Acthelm task asks the scripted model —
#: the same server, a system prompt of the length Acthelm's is for a task with no tools, the
#: task's instruction — over one keep-alive HTTP client per process; the answer is stored in a
#: row of its own (a commit), as a job that asks a model would keep it.
PEER_SYSTEM = "You are a careful assistant working on one task. " * 5
PEER_ANSWERS = """
CREATE TABLE IF NOT EXISTS bench_answers (job bigint PRIMARY KEY, answer text NOT NULL);
TRUNCATE bench_answers;
"""


def procrastinate_app(conninfo: str, model_url: str | None = None):
    import logging

    import procrastinate

    # It warns that the app lives in __main__ (this script): true, and harmless here.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="noop")
    def noop() -> None:
        return None

    client = None

    @app.task(name="model_turn")
    async def model_turn(job: int) -> None:
        import httpx

        nonlocal client
        if client is None:
            client = httpx.AsyncClient(timeout=60)
        response = await client.post(
            f"{model_url}/chat/completions",
            json={
                "model": "test-model",
                "messages": [
                    {"role": "system", "content": PEER_SYSTEM},
                    {"role": "user", "content": "Answer with one word."},
                ],
            },
        )
        response.raise_for_status()
        answer = response.json()["choices"][0]["message"]["content"]
        await app.connector.execute_query_async(
            "INSERT INTO bench_answers (job, answer) VALUES (%(job)s, %(answer)s)",
            job=job,
            answer=answer,
        )

    return app


def procrastinate_worker(
    conninfo: str, name: str, concurrency: int = 1, model_url: str | None = None
) -> int:
    app = procrastinate_app(conninfo, model_url)
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


def run_procrastinate(
    db_url: str, procs: int, jobs: int, concurrency: int = 1, model_url: str | None = None
) -> dict:
    """N no-op jobs, or with `model_url` N jobs that each ask the model and store its answer."""
    import psycopg

    conninfo = common.libpq(db_url)
    app = procrastinate_app(conninfo, model_url)
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
        if model_url:
            conn.execute(PEER_ANSWERS)
    children = [
        subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--procrastinate-worker",
                conninfo,
                f"pq-{i}",
                "--concurrency",
                str(concurrency),
                *(["--model-url", model_url] if model_url else []),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for i in range(procs)
    ]
    try:
        with psycopg.connect(conninfo, autocommit=True) as conn:

            def registered():
                return (
                    conn.execute("SELECT count(*) FROM procrastinate_workers").fetchone()[0]
                    >= procs
                    and conn.execute(
                        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                        "AND query ILIKE 'LISTEN%%'"
                    ).fetchone()[0]
                    >= procs
                )

            common.wait_until(registered, timeout=60, interval=0.05, what="procrastinate workers")
            meter = CpuMeter(children)
            with app.open():
                if model_url:
                    app.tasks["model_turn"].batch_defer(*({"job": i} for i in range(jobs)))
                else:
                    app.tasks["noop"].batch_defer(*([{}] * jobs))
            t0 = time.time()
            meter.jobs_visible()

            def finished():
                done, failed = conn.execute(
                    "SELECT count(*) FILTER (WHERE status = 'succeeded'), "
                    "count(*) FILTER (WHERE status = 'failed') FROM procrastinate_jobs"
                ).fetchone()
                if failed:
                    raise RuntimeError(f"procrastinate: {failed} jobs failed")
                return done == jobs

            common.wait_until(finished, timeout=600, interval=0.05, what="procrastinate jobs")
            cpu = meter.done(jobs)
            end = conn.execute(
                "SELECT extract(epoch FROM max(at)) FROM procrastinate_events "
                "WHERE type = 'succeeded'"
            ).fetchone()[0]
            if model_url:
                stored = conn.execute("SELECT count(*) FROM bench_answers").fetchone()[0]
                if stored != jobs:
                    raise RuntimeError(f"procrastinate: {stored} of {jobs} answers stored")
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    elapsed = float(end) - t0
    return {"jobs": jobs, "seconds": elapsed, "per_s": jobs / elapsed, **cpu}


# --- CPU a job -------------------------------------------------------------------------------


class CpuMeter:
    """The CPU one run cost, per job: its worker processes' (from just before the jobs became
    visible; their start-up is not counted) and the server's (from just after: the jobs' insert
    is not counted), until the last job was done. /proc, so only for a server on this machine."""

    def __init__(self, children) -> None:
        self.children = children
        self.datadir = common.server_snapshot(DB)["datadir"]
        self.workers = sum(common.cpu_seconds(c.pid) for c in children)

    def jobs_visible(self) -> None:
        self.server = common.postgres_cpu_seconds(self.datadir)

    def done(self, jobs: int) -> dict:
        workers = sum(common.cpu_seconds(c.pid) for c in self.children) - self.workers
        server = common.postgres_cpu_seconds(self.datadir)
        return {
            "worker_cpu_ms": workers * 1000 / jobs,
            "server_cpu_ms": None
            if server is None or self.server is None
            else (server - self.server) * 1000 / jobs,
        }


# --- Acthelm ----------------------------------------------------------------------------------


def create_tasks(model, n: int, *, prefix: str = "T") -> None:
    """N ready tasks in ONE commit (one NOTIFY wakes the idle workers)."""
    from django.db import transaction

    from agents.engine.run.intake import task_create
    from core.actors import Actor

    actor = Actor.system("bench")
    with transaction.atomic():
        for i in range(n):
            task_create(
                actor=actor,
                title=f"{prefix}{i}",
                instruction="Answer with one word.",
                tools=[],
                model=model,
            )


def run_acthelm(db_url: str, model_url: str, procs: int, jobs: int, concurrency: int = 1) -> dict:
    from django.db.models import Count, Max

    from agents.models import AgentRun
    from tasks.models import Task

    common.truncate_acthelm()
    model = common.scripted_connection(model_url)
    prefix = f"dispatch-{procs}-"
    children = [
        common.spawn_worker(db_url, f"{prefix}{i}", "--concurrency", str(concurrency))
        for i in range(procs)
    ]
    try:
        common.wait_until(
            lambda: common.listening_workers(prefix) >= procs,
            timeout=120,
            interval=0.05,
            what="idle Acthelm workers",
        )
        time.sleep(0.3)  # let each worker's first maintenance pass finish
        meter = CpuMeter(children)
        create_tasks(model, jobs)
        t0 = time.time()
        meter.jobs_visible()
        common.wait_until(
            lambda: Task.objects.filter(status="review").count() == jobs,
            timeout=900,
            interval=0.1,
            what="every task in review",
        )
        cpu = meter.done(jobs)
        end = AgentRun.objects.aggregate(end=Max("finished_at"))["end"].timestamp()
    finally:
        for child in children:
            child.send_signal(signal.SIGTERM)
        for child in children:
            try:
                child.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(child.pid, signal.SIGKILL)
                child.wait()
    runs = AgentRun.objects.values("task_id").annotate(n=Count("id")).filter(n__gt=1).count()
    if runs:
        raise RuntimeError(f"{runs} tasks were run more than once")
    elapsed = end - t0
    return {"jobs": jobs, "seconds": elapsed, "per_s": jobs / elapsed, **cpu}


# --- what one task costs, counted --------------------------------------------------------------


def count_acthelm(db_url: str, model_url: str, tasks: int) -> dict:
    """One worker process (--burst) over `tasks` ready tasks with nothing else on the scratch
    database: what the server did, per task (common.server_snapshot, common.StatementLog; the
    statement log costs time, so this run is not timed)."""
    from tasks.models import Task

    common.truncate_acthelm()
    model = common.scripted_connection(model_url)
    create_tasks(model, tasks)
    from django.db import connection

    connection.close()  # publish this session's statistics before the window opens
    common.settle_stats()
    before = common.server_snapshot(DB)
    with common.StatementLog(DB) as log:
        worker = common.spawn_worker(db_url, "dispatch-count", "--burst")
        _, err = worker.communicate(timeout=1800)
    if worker.returncode != 0:
        raise RuntimeError(f"worker failed: {err[-2000:]}")
    common.settle_stats()
    after = common.server_snapshot(DB)
    server = common.server_delta(before, after)
    server["statements"] = log.count
    done = Task.objects.filter(status="review").count()
    if done != tasks:
        raise RuntimeError(f"count run: {done} of {tasks} tasks in review")
    per_task = {k: (None if v is None else v / tasks) for k, v in server.items()}
    return {"tasks": tasks, "server": server, "per_task": per_task}


def profile_acthelm(db_url: str, model_url: str, tasks: int, *, cprofile: bool) -> dict:
    """`tasks` one-turn tasks through the in-process measuring slot (bench/inline.py)."""
    common.truncate_acthelm()
    create_tasks(common.scripted_connection(model_url), tasks)
    out = common.inline_child(db_url, "dispatch-inline", cprofile=cprofile)
    if out["tasks"] != tasks:
        raise RuntimeError(f"profile: {out['tasks']} of {tasks} tasks processed")
    total = common.sum_intervals(out["intervals"])
    total["python_ms"] = total["wall_ms"] - total["sql_ms"] - total["http_ms"]
    per_task = {k: v / tasks for k, v in total.items() if k != "by_statement"}
    by = sorted(total["by_statement"].items(), key=lambda kv: -kv[1])
    return {
        "tasks": tasks,
        "per_task": per_task,
        "by_statement": {k: v / tasks for k, v in by},
        "top": [
            {**t, "cum_ms": t["cum_ms"] / tasks, "own_ms": t["own_ms"] / tasks}
            for t in out.get("top", [])
        ],
    }


# --- main -------------------------------------------------------------------------------------


def median_run(runs: list[dict]) -> dict:
    ordered = sorted(runs, key=lambda r: r["per_s"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["all_per_s"] = [round(r["per_s"], 1) for r in runs]
    return chosen


def fmt(value, spec: str = ".2f") -> str:
    return "n/a" if value is None else format(value, spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--procs", default="1,2,8")
    parser.add_argument("--count-tasks", type=int, default=100)
    parser.add_argument("--profile-tasks", type=int, default=150)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument("--floor-worker", nargs=2, metavar=("CONNINFO", "NAME"))
    parser.add_argument("--procrastinate-worker", nargs=2, metavar=("CONNINFO", "NAME"))
    parser.add_argument("--model-url", help=argparse.SUPPRESS)  # a Procrastinate worker's
    parser.add_argument(
        "--concurrency", type=int, default=1, help="runs at once in each worker process (both)"
    )
    parser.add_argument(
        "--repeat", type=int, default=3, help="interleaved runs of each system (median)"
    )
    args = parser.parse_args()
    if args.floor_worker:
        return floor_worker(*args.floor_worker)
    if args.procrastinate_worker:
        return procrastinate_worker(
            *args.procrastinate_worker, concurrency=args.concurrency, model_url=args.model_url
        )

    db_url = common.recreate_database(DB)
    common.django_on(db_url)

    procs_list = [int(p) for p in args.procs.split(",")]
    reps = range(args.repeat)
    results = []
    with ModelServerProcess("done") as model_url:
        for procs in procs_list:
            # The three interleaved, run by run, so that a machine whose speed drifts during
            # the benchmark moves them alike; each system's median run is kept.
            runs: dict[str, list[dict]] = {"acthelm": [], "pq": [], "pq_model": []}
            for rep in reps:
                print(f"… {procs} process(es), round {rep + 1}/{args.repeat}", flush=True)
                runs["acthelm"].append(
                    run_acthelm(db_url, model_url, procs, args.tasks, args.concurrency)
                )
                runs["pq"].append(run_procrastinate(db_url, procs, args.tasks, args.concurrency))
                runs["pq_model"].append(
                    run_procrastinate(db_url, procs, args.tasks, args.concurrency, model_url)
                )
            acthelm, pq, pq_model = (median_run(runs[k]) for k in ("acthelm", "pq", "pq_model"))
            print(f"… {procs} process(es): floor ×{args.repeat}", flush=True)
            floor = median_run([run_floor(db_url, procs, args.tasks) for _ in reps])
            results.append(
                {
                    "procs": procs,
                    "acthelm": acthelm,
                    "procrastinate": pq,
                    "procrastinate_model": pq_model,
                    "floor": floor,
                }
            )
        print(f"… counted: one worker process over {args.count_tasks} tasks", flush=True)
        counted = count_acthelm(db_url, model_url, args.count_tasks)
        profile = top = None
        if not args.no_profile:
            print(f"… profile: one in-process slot over {args.profile_tasks} tasks", flush=True)
            profile = profile_acthelm(db_url, model_url, args.profile_tasks, cprofile=False)
            top = profile_acthelm(db_url, model_url, args.profile_tasks, cprofile=True)["top"]

    facts = common.machine()
    vers = common.versions("procrastinate")
    rows = []
    for r in results:
        a, p, f = r["acthelm"]["per_s"], r["procrastinate"]["per_s"], r["floor"]["per_s"]
        pm = r["procrastinate_model"]["per_s"]
        goal = ""
        if r["procs"] == GOAL_PROCS:
            goal = f" ({common.verdict_min(a / p, GOAL_VS_PROCRASTINATE, MIN_VS_PROCRASTINATE)})"
        rows.append(
            [r["procs"], a, p, pm, f, f"{a / p:.2f}×{goal}", f"{a / pm:.2f}×", f"{a / f:.3f}×"]
        )
    headers = [
        "worker processes",
        "Acthelm tasks/s",
        "Procrastinate no-op jobs/s",
        "Procrastinate jobs asking the model /s",
        "floor jobs/s",
        f"Acthelm ÷ Procrastinate no-op (goal ≥ {GOAL_VS_PROCRASTINATE}× at {GOAL_PROCS} "
        f"processes, at least {MIN_VS_PROCRASTINATE}×)",
        "Acthelm ÷ Procrastinate asking the model (same model I/O; no goal)",
        "Acthelm ÷ floor",
    ]
    table = common.print_table(f"dispatch: {args.tasks} tasks per run", headers, rows)

    def cpu(run: dict) -> str:
        return f"{fmt(run.get('worker_cpu_ms'))} / {fmt(run.get('server_cpu_ms'))}"

    cpu_table = common.print_table(
        "dispatch: CPU ms a task or job, worker processes / PostgreSQL (each system's median run)",
        ["worker processes", "Acthelm", "Procrastinate no-op", "Procrastinate asking the model"],
        [
            [
                r["procs"],
                cpu(r["acthelm"]),
                cpu(r["procrastinate"]),
                cpu(r["procrastinate_model"]),
            ]
            for r in results
        ],
    )
    ct = counted["per_task"]
    pt = profile["per_task"] if profile else {}
    count_rows = [
        ["SQL statements per task (server log)", fmt(ct["statements"], ".1f")],
        ["SQL statements per task (in-process slot)", fmt(pt.get("statements"), ".1f")],
        ["transactions per task (server, read-only included)", fmt(ct["transactions"])],
        ["commits per task (server, COMMIT records in the WAL)", fmt(ct["commits"])],
        [
            "transactions / write commits per task (in-process slot)",
            f"{fmt(pt.get('transactions'))} / {fmt(pt.get('write_commits'))}",
        ],
        ["WAL bytes per task (server)", fmt(ct["wal_bytes"], ",.0f")],
        ["rows written per task (server)", fmt(ct["tuples"], ".1f")],
        ["server CPU ms per task", fmt(ct["server_cpu_ms"])],
    ]
    count_table = common.print_table(
        f"dispatch: one task, counted (one worker process over {args.count_tasks} tasks; "
        f"in-process slot over {args.profile_tasks})",
        ["measure", "per task"],
        count_rows,
    )
    prof_md = ""
    if profile:
        stmt_rows = [[k, f"{v:.2f}"] for k, v in profile["by_statement"].items()]
        stmt_table = common.print_table(
            "dispatch: SQL statements per task by kind", ["statement", "per task"], stmt_rows
        )
        wall = pt["wall_ms"]
        split_table = common.print_table(
            "dispatch: where one task's time goes (in-process slot)",
            ["ms/task", "SQL ms", "model HTTP ms", "Python ms (the rest)"],
            [
                [
                    f"{wall:.2f}",
                    f"{pt['sql_ms']:.2f} ({pt['sql_ms'] / wall:.0%})",
                    f"{pt['http_ms']:.2f} ({pt['http_ms'] / wall:.0%})",
                    f"{pt['python_ms']:.2f} ({pt['python_ms'] / wall:.0%})",
                ]
            ],
        )
        top_rows = [[t["f"], f"{t['cum_ms']:.2f}", f"{t['own_ms']:.2f}"] for t in (top or [])[:15]]
        top_table = common.print_table(
            "dispatch: where the time goes (cProfile, per task)",
            ["function", "cumulative ms", "own ms"],
            top_rows,
        )
        prof_md = f"{stmt_table}\n\n{split_table}\n\n{top_table}\n"
    goals = []
    for r in results:
        if r["procs"] != GOAL_PROCS:
            continue
        a, p = r["acthelm"]["per_s"], r["procrastinate"]["per_s"]
        goals.append(
            [
                f"{GOAL_PROCS} processes: ≥ {GOAL_VS_PROCRASTINATE}× Procrastinate's no-op jobs/s; "
                f"at least {MIN_VS_PROCRASTINATE}×",
                f"{a / p:.2f}× ({a:.1f} vs {p:.0f} /s)",
                common.verdict_min(a / p, GOAL_VS_PROCRASTINATE, MIN_VS_PROCRASTINATE),
            ]
        )
    commits = ct["commits"] if ct["commits"] is not None else pt.get("write_commits")
    source = "server WAL" if ct["commits"] is not None else "in-process"
    if commits is not None:
        goals.append(
            [
                f"≤ {GOAL_COMMITS} commits per task on the happy path (claim → answer → review)",
                f"{commits:.2f} ({source}; {fmt(ct['statements'], '.1f')} statements)",
                common.verdict(round(commits, 1) <= GOAL_COMMITS),
            ]
        )
    goals_table = common.print_table("dispatch: goals", ["goal", "measured", "verdict"], goals)
    command = (
        f"`.venv/bin/python bench/dispatch.py --tasks {args.tasks} --procs {args.procs} "
        f"--count-tasks {args.count_tasks} --profile-tasks {args.profile_tasks}"
        f"{f' --concurrency {args.concurrency}' if args.concurrency != 1 else ''}"
        f"{f' --repeat {args.repeat}' if args.repeat != 3 else ''}`"
    )
    name = NAME if args.concurrency == 1 else f"{NAME}_c{args.concurrency}"
    section = (
        f"### {name}\n\n{command}\n\n{common.facts_line(facts, vers)}\n\n{table}\n\n"
        f"{cpu_table}\n\n{goals_table}\n\n{count_table}\n\n{prof_md}"
    )
    common.record(
        name,
        section,
        {
            "facts": facts,
            "versions": vers,
            "results": results,
            "counted": counted,
            "profile": profile,
            "top": top,
        },
        goals,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
