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
    from acthelm_site.embedded_pg import ensure_server

    return ensure_server()


def with_dbname(url: str, name: str) -> str:
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path="/" + quote(name)))


def libpq(url: str) -> str:
    """A libpq conninfo for psycopg.connect from a postgresql:// URL (host may be a socket dir)."""
    from psycopg.conninfo import make_conninfo

    from acthelm_site.dburl import parse_database_url

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
    """A zero-cost openai-compatible connection to the in-process scripted server; tested."""
    from agents.models import Connection, Model

    conn = Connection.objects.create(
        name=name,
        kind="openai_compatible",
        base_url=server.url,
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
    k = max(0, min(len(ordered) - 1, int(round(q / 100 * len(ordered) + 0.5)) - 1))
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


BENCH_ORDER = ("dispatch", "steps", "wakeup", "console")


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
