"""The run's store (agents/engine/store/) is the only place in the engine's app that runs SQL for a
run: the claim, the fence, the step, the run's end, recovery's look for lost workers. Elsewhere in
agents/ no module opens a cursor, runs a raw statement or builds one with `core.fastsql` — except
the few listed here, each with its reason. The ORM is not raw SQL and stays where it is."""

import re
from pathlib import Path

import agents

AGENTS = Path(agents.__file__).resolve().parent
STORE = AGENTS / "engine" / "store"
MIGRATIONS = AGENTS / "migrations"

#: What counts as running SQL by hand.
RAW_SQL = re.compile(
    r"\.cursor\(|\b(?:cursor|conn|connection|db)\.execute\(|\bRawSQL\b|\.raw\("
    r"|\bfastsql\.(?:execute|Insert|Update|Row)\b|from core\.fastsql import"
)

#: Modules outside the store that may, and why. Each entry must still need it (see below).
ALLOWED = {
    # LISTEN on the worker's own connection, outside the pool, for wake-ups: no run's rows.
    "engine/runtime/worker.py": 'conn.execute(f"LISTEN',
    # The verdict's read of a task's artifacts and calls (read only, one statement): what the
    # verdict's checks read, in the verdict's room.
    "engine/verdict/evidence.py": "fastsql.execute(_RECORD_SQL",
}


def _offenders() -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for path in sorted(AGENTS.rglob("*.py")):
        if path.is_relative_to(STORE) or path.is_relative_to(MIGRATIONS):
            continue
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if RAW_SQL.search(line):
                found.setdefault(path.relative_to(AGENTS).as_posix(), []).append(
                    f"{n}: {line.strip()}"
                )
    return found


def test_no_module_outside_the_store_runs_sql_for_a_run():
    strays = {
        name: lines
        for name, lines in _offenders().items()
        if not (name in ALLOWED and all(ALLOWED[name] in line for line in lines))
    }
    assert strays == {}, "SQL outside agents/engine/store/: move it into the store"


def test_every_exception_is_still_needed():
    offenders = _offenders()
    assert set(ALLOWED) <= set(offenders), "an allowed module no longer runs SQL: drop its entry"


def test_the_pattern_finds_what_it_looks_for():
    for line in (
        "with connection.cursor() as cursor:",
        "cursor.execute(SQL, params)",
        "fastsql.execute(_CALL, params)",
        "fastsql.Insert.of(Turn).rows(rows, now)",
        "Task.objects.raw('SELECT 1')",
        "qs.annotate(x=RawSQL('SELECT 1', []))",
    ):
        assert RAW_SQL.search(line), line
    assert not RAW_SQL.search("fastsql.Select(_task_with_run, 'task', 'run')")
