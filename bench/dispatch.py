"""Dispatch throughput: tasks/s through claim → one scripted model turn → supervisor → review,
for 1, 2 and 8 worker processes, against Procrastinate running no-op jobs with the same process and
concurrency counts, and against the floor: a raw psycopg loop per process of one SKIP LOCKED claim
UPDATE and one fenced completion UPDATE per job.

    .venv/bin/python bench/dispatch.py [--tasks 400] [--procs 1,2,8] [--no-profile]

Each system gets the same shape of run: its worker processes are started first and wait idle
(LISTEN), then all N jobs become visible in one commit; the clock runs from just after that commit
to the last job's completion time as recorded in the database. Process start-up is not counted.
The scripted model answers at once from the benchmark process (an OpenAI-compatible server on
loopback, default reply "done", no tools offered).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

NAME = "dispatch"
DB = "acthelm_bench_dispatch"
GOAL_VS_PROCRASTINATE = 1.0
GOAL_VS_FLOOR = 0.5


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


# --- Procrastinate: no-op jobs ----------------------------------------------------------------


def procrastinate_app(conninfo: str):
    import logging

    import procrastinate

    # It warns that the app lives in __main__ (this script): true, and harmless here.
    logging.getLogger("procrastinate.blueprints").setLevel(logging.ERROR)

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=conninfo))

    @app.task(name="noop")
    def noop() -> None:
        return None

    return app


def procrastinate_worker(conninfo: str, name: str) -> int:
    app = procrastinate_app(conninfo)
    with app.open():
        app.run_worker(
            concurrency=1,
            wait=True,
            name=name,
            listen_notify=True,
            install_signal_handlers=True,
            delete_jobs="never",
        )
    return 0


def run_procrastinate(db_url: str, procs: int, jobs: int) -> dict:
    import psycopg

    conninfo = common.libpq(db_url)
    app = procrastinate_app(conninfo)
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
    children = [
        subprocess.Popen(
            [sys.executable, __file__, "--procrastinate-worker", conninfo, f"pq-{i}"],
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
            with app.open():
                app.tasks["noop"].batch_defer(*([{}] * jobs))
            t0 = time.time()

            def finished():
                return (
                    conn.execute(
                        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded'"
                    ).fetchone()[0]
                    == jobs
                )

            common.wait_until(finished, timeout=600, interval=0.05, what="procrastinate jobs")
            end = conn.execute(
                "SELECT extract(epoch FROM max(at)) FROM procrastinate_events "
                "WHERE type = 'succeeded'"
            ).fetchone()[0]
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
    return {"jobs": jobs, "seconds": elapsed, "per_s": jobs / elapsed}


# --- Acthelm ----------------------------------------------------------------------------------


def create_tasks(model, n: int, *, prefix: str = "T") -> None:
    """N ready tasks in ONE commit (one NOTIFY wakes the idle workers)."""
    from django.db import transaction

    from tasks.actors import Actor
    from tasks.services import task_create

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


def run_acthelm(db_url: str, server, procs: int, jobs: int, *, entry: str | None = None) -> dict:
    from django.db.models import Count, Max

    from agents.models import AgentRun
    from tasks.models import Task

    common.truncate_acthelm()
    model = common.scripted_connection(server)
    prefix = f"dispatch-{procs}-"
    if entry is None:
        children = [common.spawn_worker(db_url, f"{prefix}{i}") for i in range(procs)]
    else:  # a bench-local experiment (see --experiment)
        children = [
            subprocess.Popen(
                [sys.executable, __file__, "--experiment-worker", entry, f"{prefix}{i}"],
                env=common.child_env(db_url),
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,
            )
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
        create_tasks(model, jobs)
        t0 = time.time()
        common.wait_until(
            lambda: Task.objects.filter(status="review").count() == jobs,
            timeout=900,
            interval=0.1,
            what="every task in review",
        )
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
    return {"jobs": jobs, "seconds": elapsed, "per_s": jobs / elapsed}


# --- where the time goes ----------------------------------------------------------------------

_KIND = re.compile(r"^\s*(WITH|SELECT|INSERT|UPDATE|DELETE|SAVEPOINT|RELEASE|BEGIN|COMMIT)", re.I)


def _label(sql: str) -> str:
    m = _KIND.match(sql)
    kind = m.group(1).upper() if m else sql.split()[0].upper()
    table = re.search(r'(?:FROM|INTO|UPDATE)\s+"?([a-z_]+)"?', sql, re.I)
    return f"{kind} {table.group(1) if table else ''}".strip()


def prepare_profile(server, tasks: int) -> None:
    """N ready tasks for one in-process slot (run in a child process: see profile_run)."""
    common.truncate_acthelm()
    model = common.scripted_connection(server)
    create_tasks(model, tasks)


def profile_run(entry: str, tasks: int, with_cprofile: bool) -> int:
    """Child process: one worker slot, in this process's main thread, over the prepared tasks,
    with a proposed change applied (entry != "none"); every query captured, cProfile optional.
    Prints one JSON line."""
    import json

    common.django_on(os.environ["DATABASE_URL"], migrate=False)
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from agents.worker import Worker

    if entry != "none":
        import experiments

        getattr(experiments, entry)()
    profiler = cProfile.Profile() if with_cprofile else None
    worker = Worker(worker_id="profile", burst=True)
    started = time.perf_counter()
    with CaptureQueriesContext(connection) as ctx:
        if profiler:
            profiler.enable()
        worker._slot(0)  # one slot, in this thread, so that cProfile sees it
        if profiler:
            profiler.disable()
        done = worker.processed
    elapsed = time.perf_counter() - started
    captured = ctx.captured_queries
    if done != tasks:
        raise SystemExit(f"profile: {done} of {tasks} tasks processed")
    by_label = Counter(_label(q["sql"]) for q in captured)
    out = {
        "entry": entry,
        "tasks": tasks,
        "seconds": elapsed,
        "ms_per_task": elapsed / tasks * 1000,
        "queries_per_task": len(captured) / tasks,
        "by_statement": {k: v / tasks for k, v in by_label.most_common()},
    }
    if profiler:
        stream = io.StringIO()
        stats = pstats.Stats(profiler, stream=stream)
        stats.sort_stats("cumulative").print_stats(40)
        top = []
        for func, (_cc, nc, tt, ct, _callers) in stats.stats.items():
            top.append((ct, tt, nc, f"{Path(func[0]).name}:{func[1]}({func[2]})"))
        keys = ("loop.py", "outcomes.py", "transitions.py", "supervisor.py", "_http.py")
        keys += ("openai_compat.py", "limits.py", "memory", "worker.py:1")
        out["top"] = [
            {"cum_ms_per_task": ct / tasks * 1000, "own_ms_per_task": tt / tasks * 1000, "f": f}
            for ct, tt, _nc, f in sorted(top, reverse=True)
            if any(k in f for k in keys)
        ][:25]
        out["pstats"] = stream.getvalue()
    print(json.dumps(out))
    return 0


def profile_acthelm(
    db_url: str, server, tasks: int, entry: str = "none", *, cprofile: bool = False
) -> dict:
    import json

    prepare_profile(server, tasks)
    child = subprocess.run(
        [sys.executable, __file__, "--profile-run", entry, str(tasks)]
        + (["--cprofile"] if cprofile else []),
        env=common.child_env(db_url),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if child.returncode != 0:
        raise RuntimeError(f"profile run {entry} failed: {child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


# --- experiments: bench-local monkeypatches that measure a proposed change -------------------


def experiment_worker(entry: str, worker_id: str, burst: bool = False) -> int:
    """A worker process with a proposed change applied in memory (no project file is edited)."""
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "acthelm_site.settings")
    import django

    django.setup()
    import experiments

    getattr(experiments, entry)()
    from agents.worker import Worker

    worker = Worker(worker_id=worker_id, concurrency=1, burst=burst)
    worker.install_signal_handlers()
    return worker.run()


# --- main -------------------------------------------------------------------------------------


def median_run(runs: list[dict]) -> dict:
    ordered = sorted(runs, key=lambda r: r["per_s"])
    chosen = dict(ordered[len(ordered) // 2])
    chosen["all_per_s"] = [round(r["per_s"], 1) for r in runs]
    return chosen


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=400)
    parser.add_argument("--procs", default="1,2,8")
    parser.add_argument("--profile-tasks", type=int, default=150)
    parser.add_argument("--no-profile", action="store_true")
    parser.add_argument(
        "--experiment",
        action="append",
        default=None,
        help="throughput with a proposed change from bench/experiments.py (default: lean)",
    )
    parser.add_argument("--floor-worker", nargs=2, metavar=("CONNINFO", "NAME"))
    parser.add_argument("--procrastinate-worker", nargs=2, metavar=("CONNINFO", "NAME"))
    parser.add_argument("--experiment-worker", nargs=2, metavar=("ENTRY", "NAME"))
    parser.add_argument("--profile-run", nargs=2, metavar=("ENTRY", "TASKS"))
    parser.add_argument("--cprofile", action="store_true")
    parser.add_argument("--burst", action="store_true", help="with --experiment-worker")
    parser.add_argument("--repeat", type=int, default=3, help="runs of the peers (median)")
    args = parser.parse_args()
    if args.profile_run:
        return profile_run(args.profile_run[0], int(args.profile_run[1]), args.cprofile)
    if args.floor_worker:
        return floor_worker(*args.floor_worker)
    if args.procrastinate_worker:
        return procrastinate_worker(*args.procrastinate_worker)
    if args.experiment_worker:
        return experiment_worker(*args.experiment_worker, burst=args.burst)

    db_url = common.recreate_database(DB)
    common.django_on(db_url)
    import experiments

    from tests.fakes.model_server import ScriptedModelServer, reply_text

    procs_list = [int(p) for p in args.procs.split(",")]
    experiments_run = ["lean"] if args.experiment is None else args.experiment
    reps = range(args.repeat)
    results = []
    with ScriptedModelServer([], default=reply_text("done")) as server:
        for procs in procs_list:
            print(f"… {procs} process(es): Acthelm", flush=True)
            acthelm = run_acthelm(db_url, server, procs, args.tasks)
            print(f"… {procs} process(es): Procrastinate ×{args.repeat}", flush=True)
            pq = median_run([run_procrastinate(db_url, procs, args.tasks) for _ in reps])
            print(f"… {procs} process(es): floor ×{args.repeat}", flush=True)
            floor = median_run([run_floor(db_url, procs, args.tasks) for _ in reps])
            extra = {}
            for name in experiments_run:
                print(f"… {procs} process(es): Acthelm with experiment {name}", flush=True)
                extra[name] = run_acthelm(db_url, server, procs, args.tasks, entry=name)
            results.append(
                {"procs": procs, "acthelm": acthelm, "procrastinate": pq, "floor": floor, **extra}
            )
        profile, profile_plain, proposals = None, None, []
        if not args.no_profile:
            print(f"… profile: one in-process slot over {args.profile_tasks} tasks", flush=True)
            profile = profile_acthelm(db_url, server, args.profile_tasks, cprofile=True)
            # Unchanged and each proposed change, interleaved, `--repeat` rounds; the median
            # time of each (the statement counts are the same every round).
            rounds: dict[str, list[dict]] = {name: [] for name in ["none", *experiments.ALL]}
            for r in range(args.repeat):
                for name in rounds:
                    print(f"… profile round {r + 1}: {name}", flush=True)
                    rounds[name].append(profile_acthelm(db_url, server, args.profile_tasks, name))
            medians = {
                name: sorted(runs, key=lambda p: p["ms_per_task"])[len(runs) // 2]
                for name, runs in rounds.items()
            }
            profile_plain = medians.pop("none")
            proposals = list(medians.values())

    facts = common.machine()
    vers = common.versions("procrastinate")
    rows = []
    for r in results:
        a, p, f = r["acthelm"]["per_s"], r["procrastinate"]["per_s"], r["floor"]["per_s"]
        rows.append(
            [
                r["procs"],
                a,
                p,
                f,
                f"{a / p:.2f}× ({common.verdict(a / p >= GOAL_VS_PROCRASTINATE)})",
                f"{a / f:.3f}× ({common.verdict(a / f >= GOAL_VS_FLOOR)})",
            ]
        )
    headers = [
        "worker processes",
        "Acthelm tasks/s",
        "Procrastinate no-op jobs/s",
        "floor jobs/s",
        f"Acthelm ÷ Procrastinate (goal ≥ {GOAL_VS_PROCRASTINATE}×)",
        f"Acthelm ÷ floor (goal ≥ {GOAL_VS_FLOOR}×)",
    ]
    table = common.print_table(f"dispatch: {args.tasks} tasks per run", headers, rows)
    exp_table = ""
    if experiments_run:
        exp_rows = [
            [r["procs"], name, r[name]["per_s"], f"{r[name]['per_s'] / r['acthelm']['per_s']:.2f}×"]
            for r in results
            for name in experiments_run
        ]
        exp_table = common.print_table(
            "dispatch: bench-local experiments (proposed changes, applied in memory)",
            ["worker processes", "experiment", "tasks/s", "vs unchanged"],
            exp_rows,
        )
    prof_md = ""
    if profile:
        print(
            f"\nprofile: {profile['tasks']} tasks in one in-process slot: "
            f"{profile['ms_per_task']:.1f} ms/task, {profile['queries_per_task']:.1f} queries/task"
        )
        stmt_rows = [[k, f"{v:.2f}"] for k, v in profile["by_statement"].items()]
        stmt_table = common.print_table(
            "dispatch profile: SQL statements per task", ["statement", "per task"], stmt_rows
        )
        top_rows = [
            [t["f"], f"{t['cum_ms_per_task']:.2f}", f"{t['own_ms_per_task']:.2f}"]
            for t in profile["top"][:15]
        ]
        top_table = common.print_table(
            "dispatch profile: where the time goes (cProfile, per task)",
            ["function", "cumulative ms", "own ms"],
            top_rows,
        )
        prop_rows = [
            [
                "(unchanged)",
                f"{profile_plain['queries_per_task']:.1f}",
                "",
                f"{profile_plain['ms_per_task']:.1f}",
                "1.00×",
            ]
        ]
        for p in proposals:
            prop_rows.append(
                [
                    p["entry"],
                    f"{p['queries_per_task']:.1f}",
                    f"{p['queries_per_task'] - profile_plain['queries_per_task']:+.1f}",
                    f"{p['ms_per_task']:.1f}",
                    f"{profile_plain['ms_per_task'] / p['ms_per_task']:.2f}×",
                ]
            )
        prop_table = common.print_table(
            "dispatch: proposed changes, measured in one in-process slot",
            ["change", "SQL statements/task", "Δ statements", "ms/task", "speed vs unchanged"],
            prop_rows,
        )
        prof_md = (
            f"Profile (one in-process slot, {profile['tasks']} tasks, cProfile; proposed changes "
            f"timed in {args.repeat} interleaved rounds, median): "
            f"**{profile['ms_per_task']:.1f} ms and {profile['queries_per_task']:.1f} SQL "
            f"statements per task** ({profile_plain['ms_per_task']:.1f} ms/task without the "
            f"profiler).\n\n{stmt_table}\n\n{top_table}\n\n"
            "Proposed changes (bench/experiments.py, applied in memory to the measuring process "
            f"only; no project file is changed):\n\n{prop_table}\n"
        )
    goals = []
    for r in results:
        a, p, f = r["acthelm"]["per_s"], r["procrastinate"]["per_s"], r["floor"]["per_s"]
        goals.append(
            [
                f"{r['procs']} process(es): ≥ {GOAL_VS_PROCRASTINATE}× Procrastinate",
                f"{a / p:.2f}× ({a:.1f} vs {p:.0f} /s)",
                common.verdict(a / p >= GOAL_VS_PROCRASTINATE),
            ]
        )
        goals.append(
            [
                f"{r['procs']} process(es): ≥ {GOAL_VS_FLOOR}× the raw-SQL floor",
                f"{a / f:.3f}× ({a:.1f} vs {f:.0f} /s)",
                common.verdict(a / f >= GOAL_VS_FLOOR),
            ]
        )
    section = (
        f"### dispatch\n\n`.venv/bin/python bench/dispatch.py --tasks {args.tasks}`\n\n"
        f"{common.facts_line(facts, vers)}\n\n{table}\n\n{exp_table}\n\n{prof_md}"
    )
    common.record(
        NAME,
        section,
        {
            "facts": facts,
            "versions": vers,
            "results": results,
            "profile": profile,
            "profile_plain": profile_plain,
            "proposals": proposals,
        },
        goals,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
