"""Checks the benchmarks' counters against a workload whose counts are known, on the project's
PostgreSQL (run it on a quiet server: WAL and CPU are counted cluster-wide).

    .venv/bin/python bench/check_counters.py

In a process of its own, on the scratch database `acthelm_bench_check`, the workload: 3 autocommit
INSERTs, 2 autocommit SELECTs, one transaction.atomic() block with 2 INSERTs and a SAVEPOINT block
inside it, one block with 1 INSERT that rolls back. Expected per workload: 10 statements (3 + 2 +
2 + 2 savepoint statements + 1), 6 committed transactions of which 4 wrote (4 COMMIT records in
the WAL), 1 rollback — at the server and in the in-process Meter alike. Measured as the benchmarks
measure a step: a process running the workload 11 times minus one running it once, divided by 10
(what a process pays once, e.g. Django's connection set-up, drops out). The server's counters of a
database also count autovacuum's transactions there, so they may be off by a tenth or two; the
in-process counts must be exact. Exits 1 on a mismatch.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

DB = "acthelm_bench_check"
REPEAT = 10


def workload(times: int) -> int:
    """The child: the known workload `times` times, measured by a Meter; prints its counts."""
    common.django_on(os.environ["DATABASE_URL"], migrate=False)
    from django.db import connection

    meter = common.Meter()
    meter.install()
    for _ in range(times):
        once()
    connection.close()
    print(json.dumps(common.sum_intervals(meter.finish())))
    return 0


def once() -> None:
    from django.db import connection, transaction

    with connection.cursor() as cursor:
        for i in range(3):
            cursor.execute("INSERT INTO bench_check (x) VALUES (%s)", [i])
        cursor.execute("SELECT count(*) FROM bench_check")
        cursor.execute("SELECT max(x) FROM bench_check")
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("INSERT INTO bench_check (x) VALUES (10)")
            cursor.execute("INSERT INTO bench_check (x) VALUES (11)")
        with transaction.atomic():  # SAVEPOINT … RELEASE SAVEPOINT
            pass
    try:
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("INSERT INTO bench_check (x) VALUES (20)")
            raise RuntimeError("roll back")
    except RuntimeError:
        pass


def measure(url: str, times: int) -> dict:
    common.settle_stats()
    before = common.server_snapshot(DB)
    with common.StatementLog(DB) as log:
        child = subprocess.run(
            [sys.executable, __file__, "--child", str(times)],
            env=common.child_env(url),
            capture_output=True,
            text=True,
            timeout=120,
        )
    if child.returncode != 0:
        raise RuntimeError(child.stderr[-3000:])
    common.settle_stats()
    server = common.server_delta(before, common.server_snapshot(DB))
    server["statements"] = log.count
    return {"server": server, "inproc": json.loads(child.stdout.strip().splitlines()[-1])}


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        return workload(int(sys.argv[2]))
    import psycopg

    url = common.recreate_database(DB)
    with psycopg.connect(common.libpq(url), autocommit=True) as conn:
        conn.execute("CREATE TABLE bench_check (id bigserial PRIMARY KEY, x integer)")
    one, many = measure(url, 1), measure(url, 1 + REPEAT)

    def per(side: str, key: str):
        a, b = one[side].get(key), many[side].get(key)
        return None if a is None or b is None else (b - a) / REPEAT

    checks = [
        ("statements at the server (log)", per("server", "statements"), 10),
        ("transactions at the server (xact_commit)", per("server", "transactions"), 6),
        ("rollbacks at the server", per("server", "rollbacks"), 1),
        ("commits at the server (COMMIT records in the WAL)", per("server", "commits"), 4),
        ("statements in process", per("inproc", "statements"), 10),
        ("transactions in process", per("inproc", "transactions"), 6),
        ("write commits in process", per("inproc", "write_commits"), 4),
        ("rollbacks in process", per("inproc", "rollbacks"), 1),
    ]
    failed = 0
    for what, got, want in checks:
        if got is None:
            ok = "server" in what  # n/a: the server is not on this machine
        else:
            ok = abs(got - want) <= (0.25 if "server" in what else 0)
        failed += not ok
        print(f"{'ok ' if ok else 'BAD'} {what}: {got} (expected {want})")
    with psycopg.connect(common.libpq(common.server_url()), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {DB} WITH (FORCE)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
