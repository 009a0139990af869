"""The SQL a migration applied, as it applied it: each database function's text is kept in
`agents/migrations/sql/<migration number>_<function>.sql` and the migration that applies it names
the text's SHA-256. The current text is rendered from a template of the run's store
(agents/engine/store/sql/); tests/agents/test_store_functions.py fails when it no longer matches
the newest frozen file, or when a frozen file changes."""

import hashlib
from pathlib import Path

DIR = Path(__file__).resolve().parent / "sql"


def text(name: str) -> str:
    """The text in `sql/<name>` without its file's final newline."""
    content = (DIR / name).read_text(encoding="utf-8")
    return content.removesuffix("\n")


def sha256(sql: str) -> str:
    return hashlib.sha256(sql.encode("utf-8")).hexdigest()


def applied(name: str, digest: str) -> str:
    """The text a migration applied, checked against the SHA-256 it recorded: a frozen file that
    changed stops the migration rather than install another function than the one it did."""
    sql = text(name)
    if sha256(sql) != digest:
        raise RuntimeError(f"agents/migrations/sql/{name} changed since its migration applied it")
    return sql
