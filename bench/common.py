"""Shared pieces of the benchmarks: a scratch database on the project's PostgreSQL server, Django
pointed at it, child-process environments, machine facts, tables and the README's figures.

Every benchmark creates its own scratch database (``acthelm_bench_<name>``) on the server the
project uses (``DATABASE_URL``, else the embedded PostgreSQL), migrates it, and truncates it
between runs; the peers (Procrastinate, LangGraph) get their tables in the same database, so every
ratio is measured side by side on the same server in the same run.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from urllib.parse import quote, urlsplit, urlunsplit

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

README = Path(__file__).resolve().parent / "README.md"
# Decided before django_on() sets DATABASE_URL to the scratch database.
EMBEDDED = not os.environ.get("DATABASE_URL", "").strip()

RESULTS = Path(__file__).resolve().parent / "results"

# The worker settings every Acthelm process in a benchmark runs with (quiet logs; defaults
# otherwise). The idle poll stays at its default: workers wake on LISTEN/NOTIFY.
QUIET_ENV = {"ACTHELM_LOG_LEVEL": "WARNING", "PYTHONUNBUFFERED": "1"}


# --- the server and the scratch database ----------------------------------------------------


_BASE_URL = os.environ.get("DATABASE_URL", "").strip()


def server_url() -> str:
    """The project's PostgreSQL: DATABASE_URL (as this process started), else the embedded
    server (started if needed)."""
    if _BASE_URL:
        return _BASE_URL
    from core.embedded_pg import ensure_server

    return ensure_server()


def with_dbname(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(name)))


def libpq(url: str) -> str:
    """A libpq conninfo for psycopg.connect from a postgresql:// URL (host may be a socket dir)."""
    from psycopg.conninfo import make_conninfo

    from core.dburl import parse_database_url

    d = parse_database_url(url)
    params = {
        "dbname": d["NAME"],
        "user": d["USER"] or None,
        "password": d["PASSWORD"] or None,
        "host": d["HOST"] or None,
        "port": d["PORT"] or None,
    }
    return make_conninfo(**{k: v for k, v in params.items() if v}, **d["OPTIONS"])


def recreate_database(name: str) -> str:
    """Drop and create the scratch database `name`; return its URL."""
    import psycopg

    if not re.fullmatch(r"[a-z0-9_]+", name):
        raise ValueError(f"bad scratch database name {name!r}")
    base = server_url()
    with psycopg.connect(libpq(base), autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
        conn.execute(f"CREATE DATABASE {name}")
    return with_dbname(base, name)


def django_on(db_url: str, *, migrate: bool = True) -> None:
    """Point Django at the scratch database and migrate it (once per process)."""
    os.environ["DATABASE_URL"] = db_url
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "acthelm_site.settings")
    os.environ.setdefault("ACTHELM_LOG_LEVEL", "WARNING")
    import django

    django.setup()
    if migrate:
        from django.core.management import call_command

        call_command("migrate", verbosity=0, interactive=False)


ACTHELM_TABLES_SQL = """
SELECT string_agg(quote_ident(tablename), ', ')
FROM pg_tables
WHERE schemaname = 'public'
  AND (tablename LIKE 'tasks\\_%' OR tablename LIKE 'agents\\_%'
       OR tablename LIKE 'approvals\\_%' OR tablename LIKE 'memory\\_%')
"""


def truncate_acthelm() -> None:
    """Empty every Acthelm table of the scratch database (users and permissions stay)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(ACTHELM_TABLES_SQL)
        tables = cursor.fetchone()[0]
        cursor.execute(f"TRUNCATE {tables} RESTART IDENTITY CASCADE")


def child_env(db_url: str, **extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env.update(QUIET_ENV)
    env["DATABASE_URL"] = db_url
    env["DJANGO_SETTINGS_MODULE"] = "acthelm_site.settings"
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update({k: str(v) for k, v in extra.items()})
    return env


def spawn_worker(db_url: str, worker_id: str, *args: str, env: dict | None = None):
    """A real `manage.py acthelm_worker` process on the scratch database."""
    return subprocess.Popen(
        [
            sys.executable,
            str(ROOT / "manage.py"),
            "acthelm_worker",
            "--worker-id",
            worker_id,
            *args,
        ],
        env=child_env(db_url, **(env or {})),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_until(predicate, *, timeout: float, interval: float = 0.01, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}")


def listening_workers(prefix: str) -> int:
    """How many Acthelm workers whose id starts with `prefix` hold their LISTEN connection."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE %s",
            [f"acthelm-listen {prefix}%"],
        )
        return cursor.fetchone()[0]


# --- the scripted model -----------------------------------------------------------------------


def scripted_connection(server, *, name: str = "bench", context_window: int = 1_000_000):
    """A zero-cost openai-compatible connection to a scripted server (or its base URL); tested."""
    from agents.models import Connection, Model

    conn = Connection.objects.create(
        name=name,
        kind="openai_compatible",
        base_url=server if isinstance(server, str) else server.url,
        cost_tier="zero_cost",
        timeout_seconds=60,
    )
    return Model.objects.create(
        connection=conn,
        name="test-model",
        supports_tools=True,
        test_status="passed",
        context_window=context_window,
    )


# --- facts, numbers, tables -------------------------------------------------------------------


def versions(*packages: str) -> dict[str, str]:
    out = {"python": platform.python_version()}
    for name in ("Django", "psycopg", *packages):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def machine() -> dict:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SHOW server_version")
        pg = cursor.fetchone()[0]
        cursor.execute("SHOW synchronous_commit")
        sync = cursor.fetchone()[0]
    mem_kb = 0
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                mem_kb = int(line.split()[1])
    except OSError:
        pass
    return {
        "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "nproc": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "cpu": _cpu_model(),
        "postgresql": pg,
        "synchronous_commit": sync,
        "embedded": EMBEDDED,
        "load_average": [round(x, 1) for x in os.getloadavg()],
    }


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def pct(values: list[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[k]


def median(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def verdict(ok: bool) -> str:
    return "met" if ok else "MISSED"


def markdown_table(headers: list[str], rows: list[list]) -> str:
    def cell(value) -> str:
        if isinstance(value, float):
            return f"{value:,.2f}" if abs(value) < 100 else f"{value:,.0f}"
        return str(value)

    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join(" --- " for _ in headers) + "|"]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines)


def print_table(title: str, headers: list[str], rows: list[list]) -> str:
    text = markdown_table(headers, rows)
    print(f"\n## {title}\n\n{text}\n", flush=True)
    return text


def facts_line(facts: dict, vers: dict) -> str:
    v = ", ".join(f"{k} {val}" for k, val in vers.items())
    return (
        f"Measured {facts['date']} on {facts['nproc']} CPU ({facts['cpu']}), "
        f"{facts['memory_gib']} GiB, PostgreSQL {facts['postgresql']} "
        f"(synchronous_commit={facts['synchronous_commit']}, "
        f"{'embedded' if facts['embedded'] else 'DATABASE_URL'}); load average at the end "
        f"{' / '.join(str(x) for x in facts['load_average'])}; {v}."
    )


BENCH_ORDER = (
    "dispatch",
    "steps",
    "boundary",
    "wakeup",
    "console",
    "fleet",
    "fleet_1000",
    "fleet_3000",
    "fleet_10000",
    "fleet_signals",
)


def record(name: str, section_markdown: str, data: dict, goals: list[list[str]]) -> None:
    """Write the figures to bench/results/<name>.json, replace this benchmark's section of
    bench/README.md (between <!-- name:begin --> and <!-- name:end -->) and rebuild the summary of
    every goal from the latest results of each benchmark."""
    RESULTS.mkdir(exist_ok=True)
    data = {**data, "goals": goals}
    (RESULTS / f"{name}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
    if os.environ.get("ACTHELM_BENCH_NO_README"):
        return
    text = README.read_text() if README.exists() else ""
    text = _replace_section(text, name, section_markdown)
    rows = []
    for bench in BENCH_ORDER:
        path = RESULTS / f"{bench}.json"
        if path.exists():
            saved = json.loads(path.read_text())
            date = saved.get("facts", {}).get("date", "")
            rows += [[bench, *goal, date] for goal in saved.get("goals", [])]
    summary = markdown_table(["benchmark", "goal", "measured", "verdict", "run"], rows)
    text = _replace_section(text, "summary", summary)
    README.write_text(text)


def _replace_section(text: str, name: str, body: str) -> str:
    begin, end = f"<!-- {name}:begin -->", f"<!-- {name}:end -->"
    block = f"{begin}\n{body.strip()}\n{end}"
    if begin in text and end in text:
        return re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _: block, text, flags=re.S)
    return text.rstrip() + "\n\n" + block + "\n"


def verdict_min(value: float, goal: float, minimum: float, *, lower_is_better=False) -> str:
    """`met` at the goal, `minimum met` between the minimum and the goal, else `MISSED`."""

    def ok(bound: float) -> bool:
        return value <= bound if lower_is_better else value >= bound

    if ok(goal):
        return "met"
    return "minimum met" if ok(minimum) else "MISSED"


# --- counting at the server -------------------------------------------------------------------
#
# What the worker processes do is counted where it happens, at the PostgreSQL server, with nothing
# else running on the scratch database:
# - transactions: pg_stat_database.xact_commit of the scratch database (every transaction that
#   ended in COMMIT, read-only ones included: Django's autocommit SELECTs count one each);
# - commits: the COMMIT records in the WAL between two LSNs (transactions that wrote something,
#   i.e. each one a WAL flush under synchronous_commit=on), read with pg_waldump from the server's
#   own pg_wal (local servers only: the embedded one, or DATABASE_URL on this machine and
#   readable). Cluster-wide: keep other databases of the server quiet while measuring;
# - WAL bytes (pg_current_wal_lsn), rows written (pg_stat_database tup_*);
# - server CPU: user + system time of the postmaster and all its children, terminated ones
#   included (/proc, local servers only).
# pg_stat_statements would count statements at the server too, but the embedded server does not
# ship it; statements are counted in an in-process measuring slot instead (see Meter below).


def _admin_conn():
    """An autocommit psycopg connection to the server's `postgres` database (so that what it does
    never shows in the scratch database's counters)."""
    import psycopg

    return psycopg.connect(libpq(with_dbname(server_url(), "postgres")), autocommit=True)


def server_snapshot(dbname: str) -> dict:
    with _admin_conn() as conn:
        conn.execute("SELECT pg_stat_clear_snapshot()")
        row = conn.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted + tup_updated + tup_deleted, "
            "pg_current_wal_lsn()::text, current_setting('data_directory') "
            "FROM pg_stat_database WHERE datname = %s",
            [dbname],
        ).fetchone()
    commits, rollbacks, tuples, lsn, datadir = row
    return {
        "xact_commit": int(commits),
        "xact_rollback": int(rollbacks),
        "tuples": int(tuples),
        "lsn": lsn,
        "datadir": datadir,
        "cpu_s": postgres_cpu_seconds(datadir),
        "at": time.monotonic(),
    }


def server_delta(before: dict, after: dict) -> dict:
    """What the server did between two snapshots (see above); None where it cannot be read."""
    with _admin_conn() as conn:
        wal = conn.execute(
            "SELECT pg_wal_lsn_diff(%s::pg_lsn, %s::pg_lsn)", [after["lsn"], before["lsn"]]
        ).fetchone()[0]
    cpu = None
    if before["cpu_s"] is not None and after["cpu_s"] is not None:
        cpu = after["cpu_s"] - before["cpu_s"]
    return {
        "transactions": after["xact_commit"] - before["xact_commit"],
        "rollbacks": after["xact_rollback"] - before["xact_rollback"],
        "commits": wal_commits(before["datadir"], before["lsn"], after["lsn"]),
        "wal_bytes": int(wal),
        "tuples": after["tuples"] - before["tuples"],
        "server_cpu_ms": None if cpu is None else cpu * 1000,
        "seconds": after["at"] - before["at"],
    }


def settle_stats(seconds: float = 1.2) -> None:
    """Backends publish their statistics at most once a second: wait for them."""
    time.sleep(seconds)


def _pg_bin(name: str) -> str | None:
    import shutil

    try:
        import pgserver  # noqa: F401

        candidate = Path(pgserver.__file__).parent / "pginstall" / "bin" / name
        if candidate.exists():
            return str(candidate)
    except ImportError:
        pass
    return shutil.which(name)


_WALDUMP_COMMIT = re.compile(r"^Transaction/COMMIT\s+(\d+)", re.M)


def wal_commits(datadir: str, start: str, end: str) -> int | None:
    """COMMIT records in the WAL between two LSNs (None if pg_wal is not readable here)."""
    waldump = _pg_bin("pg_waldump")
    wal_dir = Path(datadir) / "pg_wal"
    if not waldump or start == end:
        return 0 if waldump and start == end else None
    try:
        if not wal_dir.is_dir():
            return None
        out = subprocess.run(
            [waldump, "-p", str(wal_dir), "-s", start, "-e", end, "--stats=record"],
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _WALDUMP_COMMIT.search(out.stdout)
    if match:
        return int(match.group(1))
    return 0 if out.returncode == 0 else None


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (/proc/<pid>/stat, its own threads only)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def postgres_cpu_seconds(datadir: str) -> float | None:
    """User + system CPU seconds of the postmaster and all its children (those that exited are in
    the postmaster's cutime/cstime). None if the server is not on this machine."""
    try:
        pid = int((Path(datadir) / "postmaster.pid").read_text().split()[0])
        tick = os.sysconf("SC_CLK_TCK")

        def stat(p: int) -> list[str]:
            text = Path(f"/proc/{p}/stat").read_text()
            return text[text.rindex(")") + 2 :].split()

        fields = stat(pid)
        total = sum(int(x) for x in fields[11:15])  # utime stime cutime cstime
        for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split():
            try:
                f = stat(int(child))
                total += int(f[11]) + int(f[12])
            except (OSError, ValueError):
                continue
        return total / tick
    except (OSError, ValueError, IndexError):
        return None


class ConnectionSampler:
    """Samples, in a thread, the server connections to the scratch database (from the `postgres`
    database, so that sampling adds nothing to the scratch database's counters): the most at one
    sample (`peak`) and every backend seen (`distinct`: the connections the processes opened;
    a worker's threads keep theirs for their lifetime, so this is what they hold together)."""

    def __init__(self, dbname: str, interval: float = 0.1, exclude: tuple[int, ...] = ()):
        import threading

        self.dbname = dbname
        self.interval = interval
        self.peak = 0
        self.pids: set[int] = set()
        self.exclude = set(exclude)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    @property
    def distinct(self) -> int:
        return len(self.pids)

    def _run(self) -> None:
        with _admin_conn() as conn:
            while not self._stop.wait(self.interval):
                pids = {
                    row[0]
                    for row in conn.execute(
                        "SELECT pid FROM pg_stat_activity WHERE datname = %s", [self.dbname]
                    ).fetchall()
                } - self.exclude
                self.peak = max(self.peak, len(pids))
                self.pids |= pids

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(5)


# --- the engine: the few internals the benchmarks use (adapt here after an engine change) -----


def engine_run_inline(worker_id: str) -> int:
    """Run one worker slot in THIS thread until nothing is claimable (what `acthelm_worker
    --burst --concurrency 1` does in its slot thread), so that a measuring process sees every
    statement and model call of the runs on its own thread's connection, and cProfile sees the
    slot. Returns how many tasks it processed.

    The only place a benchmark touches engine internals: `agents.engine.runtime.worker.Worker` and
    its
    private
    `drain()` method (claim → run → outcome in this thread until nothing is claimable)."""
    from agents.engine.runtime.worker import Worker

    worker = Worker(worker_id=worker_id, concurrency=1, burst=True)
    worker.drain()
    return worker.processed


def provider_class(kind: str = "openai_compatible"):
    """The provider class the engine builds for a connection of `kind` (public registry)."""
    from agents.catalogue.providers import get_provider_class

    return get_provider_class(kind)


# --- the in-process measuring slot --------------------------------------------------------------

_KIND = re.compile(
    r"^\s*(WITH|SELECT|INSERT|UPDATE|DELETE|SAVEPOINT|RELEASE|ROLLBACK|BEGIN|COMMIT)", re.I
)
_WRITE = re.compile(r"^\s*(INSERT|UPDATE|DELETE)\b|\bFOR\s+(NO\s+KEY\s+)?UPDATE\b", re.I)
_WRITE_CTE = re.compile(r"\b(INSERT\s+INTO|UPDATE\s+\S+\s+SET|DELETE\s+FROM)\b", re.I)


def statement_label(sql: str) -> str:
    m = _KIND.match(sql)
    kind = m.group(1).upper() if m else sql.split()[0].upper()
    table = re.search(r'(?:FROM|INTO|UPDATE)\s+"?([a-z_]+)"?', sql, re.I)
    return f"{kind} {table.group(1) if table else ''}".strip()


#: A function that writes, called by a SELECT: the step function and the claim
#: (agents.engine.store.functions: step_function_sql, claim_function_sql).
_WRITE_FUNCTION = re.compile(r"\bacthelm_(step|claim)\s*\(", re.I)


def is_write(sql: str) -> bool:
    return bool(
        _WRITE.search(sql)
        or (sql.lstrip()[:4].upper() == "WITH" and _WRITE_CTE.search(sql))
        or _WRITE_FUNCTION.search(sql)
    )


class Meter:
    """Counts what one worker slot does in THIS thread: every SQL statement Django sends on the
    thread's connection (an execute_wrapper) with its wall time, every transaction it ends
    (Django's commit/rollback; an autocommit statement is a transaction of its own), and the wall
    time inside the provider's `complete` (the model's HTTP request). Each model call starts a new
    interval: interval 0 is the claim and the set-up before the first model call; interval k is
    model call k and everything the slot does until model call k+1 (one agent step); the last
    interval is the final answer, the supervisor and the outcome."""

    def __init__(self):
        import threading

        self.thread = threading.get_ident()
        self.intervals: list[dict] = []
        self._writes = False
        self._new()

    def _new(self) -> None:
        self.cur = {
            "start": time.perf_counter(),
            "statements": 0,
            "sql_ms": 0.0,
            "http_ms": 0.0,
            "model_calls": 0,
            "transactions": 0,
            "write_commits": 0,
            "rollbacks": 0,
            "by_statement": {},
        }
        self.intervals.append(self.cur)

    def install(self) -> None:
        from django.db import connections

        conn = connections["default"]
        conn.execute_wrappers.append(self._sql)
        commit, rollback = conn.commit, conn.rollback

        def counted_commit():
            commit()
            self._end_transaction(commit=True)

        def counted_rollback():
            rollback()
            self._end_transaction(commit=False)

        conn.commit, conn.rollback = counted_commit, counted_rollback
        cls = provider_class()
        complete = cls.complete
        meter = self

        def timed_complete(provider, *args, **kwargs):
            import threading

            if threading.get_ident() != meter.thread:
                return complete(provider, *args, **kwargs)
            meter._close()
            meter._new()
            meter.cur["model_calls"] += 1
            t0 = time.perf_counter()
            try:
                return complete(provider, *args, **kwargs)
            finally:
                meter.cur["http_ms"] += (time.perf_counter() - t0) * 1000

        cls.complete = timed_complete

    def _end_transaction(self, *, commit: bool) -> None:
        if commit:
            self.cur["transactions"] += 1
            self.cur["write_commits"] += int(self._writes)
        else:
            self.cur["rollbacks"] += 1
        self._writes = False

    def _sql(self, execute, sql, params, many, context):
        t0 = time.perf_counter()
        try:
            return execute(sql, params, many, context)
        finally:
            cur = self.cur
            cur["sql_ms"] += (time.perf_counter() - t0) * 1000
            cur["statements"] += 1
            label = statement_label(sql)
            cur["by_statement"][label] = cur["by_statement"].get(label, 0) + 1
            write = is_write(sql)
            conn = context["connection"]
            if conn.get_autocommit() and not conn.in_atomic_block:
                cur["transactions"] += 1
                cur["write_commits"] += int(write)
            else:
                self._writes = self._writes or write

    def _close(self) -> None:
        self.cur["wall_ms"] = (time.perf_counter() - self.cur["start"]) * 1000

    def finish(self) -> list[dict]:
        self._close()
        for interval in self.intervals:
            interval.pop("start", None)
        return self.intervals


def inline_child(db_url: str, worker_id: str, *, cprofile: bool = False, env=None) -> dict:
    """Run `bench/inline.py` (one measured slot in its own process) over the ready tasks of the
    scratch database and return what it measured."""
    args = [sys.executable, str(Path(__file__).resolve().parent / "inline.py"), worker_id]
    if cprofile:
        args.append("--cprofile")
    child = subprocess.run(
        args,
        env=child_env(db_url, **(env or {})),
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if child.returncode != 0:
        raise RuntimeError(f"inline slot failed: {child.stderr[-3000:]}")
    return json.loads(child.stdout.strip().splitlines()[-1])


def sum_intervals(intervals: list[dict]) -> dict:
    out: dict = {"by_statement": {}}
    for interval in intervals:
        for key, value in interval.items():
            if key == "by_statement":
                for k, v in value.items():
                    out["by_statement"][k] = out["by_statement"].get(k, 0) + v
            else:
                out[key] = out.get(key, 0) + value
    return out


# --- statements, at the server -----------------------------------------------------------------

_LOGGED = re.compile(r"\] LOG:  (?:statement|execute [^:]*):\s*(\w+)")
_TX_CONTROL = {"BEGIN", "COMMIT", "ROLLBACK", "START", "END"}


class StatementLog:
    """Counts the SQL statements the server runs for the scratch database while open: sets
    `log_statement = 'all'` on that database only (new sessions pick it up, so start the processes
    to measure inside the block) and counts the statements logged meanwhile, transaction control
    (BEGIN/COMMIT/ROLLBACK, which psycopg sends itself) left out; SAVEPOINT/RELEASE count. Reads
    the server's log file, so only where it is on this machine: the embedded server logs to
    `<data_directory>/log` (else `count` stays None). Not for timed runs: logging costs time."""

    def __init__(self, dbname: str):
        if not re.fullmatch(r"[a-z0-9_]+", dbname):
            raise ValueError(dbname)
        self.dbname = dbname
        self.count: int | None = None
        self.by_kind: dict[str, int] = {}
        self._path: Path | None = None
        self._offset = 0

    def __enter__(self):
        with _admin_conn() as conn:
            datadir = conn.execute("SHOW data_directory").fetchone()[0]
            conn.execute(f"ALTER DATABASE {self.dbname} SET log_statement = 'all'")
        path = Path(datadir) / "log"
        try:
            if path.is_file():
                self._path, self._offset = path, path.stat().st_size
        except OSError:
            self._path = None
        return self

    def __exit__(self, *exc):
        with _admin_conn() as conn:
            conn.execute(f"ALTER DATABASE {self.dbname} RESET log_statement")
        if self._path is None:
            return
        try:
            with self._path.open("rb") as fh:
                fh.seek(self._offset)
                text = fh.read().decode("utf-8", "replace")
        except OSError:
            return
        kinds: dict[str, int] = {}
        for match in _LOGGED.finditer(text):
            kind = match.group(1).upper()
            if kind not in _TX_CONTROL:
                kinds[kind] = kinds.get(kind, 0) + 1
        self.by_kind = kinds
        self.count = sum(kinds.values())
