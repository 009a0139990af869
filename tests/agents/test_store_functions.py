"""The database functions of the run's store (`acthelm_step`, `acthelm_claim`) live once, as
templates in agents/engine/store/sql/ whose statuses come from the enums. A migration applies the
text frozen as of that migration (agents/migrations/sql/<migration>_<function>.sql) and records
its SHA-256. These tests fail when the current templates render another text than the newest
frozen one (a change needs a new migration with a new frozen file), and when a frozen file — the
text an old migration applied — changes."""

import importlib
import pkgutil
import re
from pathlib import Path

import pytest
from django.db import connection

import agents.migrations
from agents.engine.store import functions
from agents.migrations import _frozen
from agents.states import RunStatus, ToolCallStatus
from tasks.states import TaskStatus

#: Every frozen file and the SHA-256 of the text its migration applied. A new migration adds a
#: line; an existing line never changes (that would change what an old migration installed).
FROZEN = {
    "0015_acthelm_step.sql": "4e15c482da29658ec7f997243a70d5a2b6618cd854675a085a2c802191f8560c",
    "0016_acthelm_step.sql": "05c1cd6a49d33e0aab79ef28d9a855f40111927c51b18bff0a7d66164ef4d9d5",
    "0018_acthelm_step.sql": "0e02ecd14d781fd1a774492257cc58b90394f4c5bb7db3a8f5b6a06c7cf4ec72",
    "0019_acthelm_step.sql": "528df65e23140fc0a483617d14976f4b7dd5d1a2cffcbad30ae97f03411b7bfc",
    "0020_acthelm_step.sql": "a9297517fec659569ef40510e48a40b2e09a5d60d67801924b9596f9349b4502",
    "0021_acthelm_claim.sql": "edb9c30afb180307021d0dd122e14284df349b9b1614a24b3302343cc1c5d9af",
    "0022_acthelm_step.sql": "3462778817d5d7fa4cdecb9036f8eb960b5cdcd920f61c0834ae09cdc3c77020",
}
MIGRATIONS = Path(agents.migrations.__file__).resolve().parent
_APPLIED = re.compile(r'applied\(\s*"([^"]+)",\s*"([0-9a-f]{64})"\s*\)')


def _newest(function: str) -> str:
    """The newest frozen text of `function` (by migration number)."""
    names = sorted(name for name in FROZEN if name.endswith(f"_{function}.sql"))
    assert names, f"no migration applies {function}"
    return _frozen.text(names[-1])


def test_every_frozen_text_is_the_one_its_migration_applied():
    on_disk = {p.name for p in _frozen.DIR.glob("*.sql")}
    assert on_disk == set(FROZEN), "a frozen file was added or removed: list it in FROZEN"
    for name, digest in FROZEN.items():
        assert _frozen.sha256(_frozen.text(name)) == digest, (
            f"agents/migrations/sql/{name} changed: an old migration's text never changes; "
            "add a migration with a new frozen file instead"
        )


def test_each_migration_records_the_hash_of_the_frozen_text_it_applies():
    recorded: dict[str, str] = {}
    for info in sorted(pkgutil.iter_modules(agents.migrations.__path__), key=lambda m: m.name):
        if info.name.startswith("_"):
            continue
        source = (MIGRATIONS / f"{info.name}.py").read_text(encoding="utf-8")
        for name, digest in _APPLIED.findall(source):
            assert name.startswith(info.name[:4]), f"{info.name} applies another's text {name}"
            recorded[name] = digest
        importlib.import_module(f"agents.migrations.{info.name}")  # applied() checks the hash
    assert recorded == FROZEN


def test_a_frozen_file_that_changed_stops_its_migration(tmp_path, monkeypatch):
    changed = tmp_path / "0020_acthelm_step.sql"
    changed.write_text(_frozen.text("0020_acthelm_step.sql") + "\n-- edited\n", encoding="utf-8")
    monkeypatch.setattr(_frozen, "DIR", tmp_path)
    with pytest.raises(RuntimeError, match="changed since its migration applied it"):
        _frozen.applied("0020_acthelm_step.sql", FROZEN["0020_acthelm_step.sql"])


def test_the_templates_render_the_newest_frozen_texts():
    """A change of a template or of the models' columns it lists needs a migration that applies
    the new text (with its frozen file)."""
    assert functions.step_function_sql() == _newest("acthelm_step"), (
        "the step function changed: add a migration that applies "
        "agents.engine.store.functions.step_function_sql()'s text as a new frozen file"
    )
    assert functions.claim_function_sql() == _newest("acthelm_claim"), (
        "the claim function changed: add a migration that applies "
        "agents.engine.store.functions.claim_function_sql()'s text as a new frozen file"
    )


@pytest.mark.parametrize("template", ["acthelm_step.sql", "acthelm_claim.sql"])
def test_no_status_is_typed_into_a_template(template):
    """Statuses come from the enums at render time: a template holds none as a literal."""
    text = (functions.DIR / template).read_text(encoding="utf-8")
    for enum in (TaskStatus, RunStatus, ToolCallStatus):
        for value in enum.values:
            assert f"'{value}'" not in text, f"{template} types {enum.__name__} {value!r}"


def test_a_placeholder_without_its_value_fails_at_render():
    with pytest.raises(KeyError, match="placeholders"):
        functions.render("acthelm_claim.sql", {"ready": "'ready'"})


@pytest.mark.django_db
def test_the_installed_functions_are_the_ones_the_templates_make():
    """The test database is migrated: each function's body is the one its template renders."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT proname, prosrc FROM pg_proc WHERE proname IN ('acthelm_step', 'acthelm_claim')"
            " ORDER BY proname"
        )
        bodies = cursor.fetchall()
    assert bodies == [
        ("acthelm_claim", functions.claim_function_sql().split("$fn$")[1]),
        ("acthelm_step", functions.step_function_sql().split("$fn$")[1]),
    ]
