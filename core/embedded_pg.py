"""The embedded PostgreSQL that Acthelm uses when DATABASE_URL is unset.

A `pgserver` instance lives in a data folder of the project (`.pgdata/`, ignored by git). It keeps
running between commands, so the console, every worker and the test suite share one server; `make
stop` stops it. It listens on a Unix socket inside the data folder only, never on a TCP port.
"""

import os
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

DEFAULT_PGDATA = Path(__file__).resolve().parent.parent / ".pgdata"


def pgdata_path() -> Path:
    return Path(os.environ.get("ACTHELM_PGDATA", DEFAULT_PGDATA)).resolve()


@contextmanager
def _quiet() -> Iterator[None]:
    """pgserver asks platformdirs for a runtime folder, which warns when XDG_RUNTIME_DIR is
    unset (as on servers and in CI) and then uses /tmp: expected here, not worth a warning."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="XDG_RUNTIME_DIR is not set")
        yield


def _running_uri(pgdata: Path) -> str | None:
    """The URI of a server already running on pgdata, read from postmaster.pid (no lock taken)."""
    try:
        lines = (pgdata / "postmaster.pid").read_text().splitlines()
        pid, port, socket_dir, status = int(lines[0]), lines[3], lines[4], lines[7].strip()
    except (OSError, IndexError, ValueError):
        return None
    if status != "ready":
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, owned by the pgserver system user
    return f"postgresql://postgres:@/postgres?host={socket_dir}&port={port}"


def ensure_server(pgdata: Path | None = None) -> str:
    """Start the embedded server unless it runs already, and return its connection URI."""
    pgdata = pgdata or pgdata_path()
    uri = _running_uri(pgdata)
    if uri:
        return uri
    try:
        with _quiet():
            import pgserver.postgres_server
    except ImportError as exc:  # Python 3.13+ has no pgserver wheel
        raise RuntimeError(
            "DATABASE_URL is unset and the embedded PostgreSQL (pgserver) is not installed; "
            "use Python 3.12, or set DATABASE_URL=postgresql://user@host:5432/dbname"
        ) from exc
    pgdata.mkdir(parents=True, exist_ok=True)
    with _quiet():
        pgserver.postgres_server.get_server(pgdata, cleanup_mode=None)
    uri = _running_uri(pgdata)
    if not uri:
        raise RuntimeError(f"the embedded PostgreSQL in {pgdata} did not start; see {pgdata}/log")
    return uri


def pg_ctl(*args: str) -> str:
    """Run pgserver's pg_ctl on the data folder, as the user that owns it."""
    with _quiet():
        # pgserver makes one function per binary it ships at import time, so no type names pg_ctl.
        from pgserver._commands import pg_ctl as _pg_ctl  # type: ignore[attr-defined]

    pgdata = pgdata_path()
    user = "pgserver" if os.geteuid() == 0 else None
    output: str = _pg_ctl(list(args), pgdata=pgdata, user=user, timeout=60)
    return output


def stop() -> None:
    if _running_uri(pgdata_path()):
        pg_ctl("-w", "-m", "fast", "stop")


def main(argv: list[str]) -> int:
    command = argv[1] if len(argv) > 1 else "uri"
    if command == "stop":
        stop()
        print("embedded PostgreSQL stopped")
    elif command in ("start", "uri"):
        print(ensure_server())
    else:
        print("usage: python -m core.embedded_pg [start|uri|stop]", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
