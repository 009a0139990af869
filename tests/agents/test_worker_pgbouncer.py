"""A worker process behind a real PgBouncer (Debian's package), in session and in transaction
mode: a person's pause and cancel reach the run through the NOTIFY, not at the heartbeat.

In transaction mode PgBouncer hands the LISTEN's server connection to other clients, so the
worker's listener must go to PostgreSQL directly (ACTHELM_LISTEN_DATABASE_URL) while its pool
goes through the pooler. The heartbeat is 30 s here: only the NOTIFY explains a reaction within
seconds."""

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg
import pytest
from django.db import connection

from agents.actions.task import task_pause
from agents.models import AgentRun
from core.actors import Actor
from core.dburl import build_database_url
from tasks.models import Task
from tasks.states import TaskStatus
from tests.agents.conftest import FAST_ENV, WorkerProcess, wait_for
from tests.agents.scripted import tool_task
from tests.fakes.model_server import ScriptedModelServer, hang, reply_tool_calls

PGBOUNCER = shutil.which("pgbouncer") or shutil.which("pgbouncer", path="/usr/sbin:/usr/local/sbin")

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(
        PGBOUNCER is None,
        reason="the pgbouncer binary is not installed (`make test` installs Debian's package; "
        "or apt-get install pgbouncer)",
    ),
]

# Far longer than the deadlines below: a reaction in time is the NOTIFY's, not the heartbeat's.
SLOW_HEARTBEAT = {
    **FAST_ENV,
    "ACTHELM_HEARTBEAT_SECONDS": "30",
    "ACTHELM_LEASE_SECONDS": "90",
    "ACTHELM_LOG_LEVEL": "WARNING",
}
REACTION_SECONDS = 10


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PgBouncer:
    """PgBouncer on a free loopback port in front of the test database's server (a Unix socket
    folder for the embedded server, or host:port), trusting the test's user."""

    def __init__(self, settings_dict: dict, pool_mode: str):
        self.user = settings_dict["USER"] or pwd.getpwuid(os.geteuid()).pw_name
        self.dbname = settings_dict["NAME"]
        server = {
            "host": settings_dict["HOST"] or "/var/run/postgresql",
            "port": settings_dict["PORT"] or "5432",
            "user": self.user,
            "password": settings_dict["PASSWORD"],
        }
        # PgBouncer refuses to run as root: it then takes the identity of the server's socket
        # folder's owner (the embedded server's), or nobody, and reads its files as that user.
        self.run_as = None
        if os.geteuid() == 0:
            host = Path(server["host"])
            owner = host.stat().st_uid if host.is_absolute() and host.exists() else None
            self.run_as = pwd.getpwuid(owner).pw_name if owner else "nobody"
        self.folder = Path(tempfile.mkdtemp(prefix="acthelm-pgbouncer-"))
        self.folder.chmod(0o755)
        (self.folder / "users.txt").write_text(f'"{self.user}" ""\n')
        target = " ".join(f"{k}={v}" for k, v in server.items() if v)
        self.settings = {
            "listen_addr": "127.0.0.1",
            "unix_socket_dir": "",
            "auth_type": "trust",
            "auth_file": str(self.folder / "users.txt"),
            "admin_users": self.user,
            "pool_mode": pool_mode,
            "default_pool_size": "10",
            "max_client_conn": "100",
            "ignore_startup_parameters": "extra_float_digits",
        }
        self.databases = f"* = {target}"
        self.proc: subprocess.Popen | None = None
        self.port = 0

    def start(self) -> "PgBouncer":
        for _ in range(3):  # a free port can be taken between the probe and the start
            self.port = _free_port()
            config = self.folder / "pgbouncer.ini"
            lines = ["[databases]", self.databases, "[pgbouncer]", f"listen_port = {self.port}"]
            lines += [f"{k} = {v}" for k, v in self.settings.items()]
            config.write_text("\n".join(lines) + "\n")
            for path in self.folder.iterdir():
                path.chmod(0o644)
            command = [PGBOUNCER, *(["-u", self.run_as] if self.run_as else []), str(config)]
            self.log = open(self.folder / "pgbouncer.log", "w")  # noqa: SIM115
            self.proc = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    with psycopg.connect(self.conninfo(), connect_timeout=2) as conn:
                        conn.execute("SELECT 1")
                    return self
                except psycopg.OperationalError:
                    time.sleep(0.1)
            self.stop()
        raise AssertionError(f"pgbouncer did not start:\n{self.output()}")

    def conninfo(self, dbname: str | None = None) -> str:
        return f"host=127.0.0.1 port={self.port} user={self.user} dbname={dbname or self.dbname}"

    def url(self) -> str:
        return build_database_url(
            {"NAME": self.dbname, "USER": self.user, "HOST": "127.0.0.1", "PORT": self.port}
        )

    def clients(self) -> set[str]:
        """The application names of PgBouncer's clients (its admin console's SHOW CLIENTS)."""
        with psycopg.connect(self.conninfo("pgbouncer"), autocommit=True) as admin:
            cursor = admin.execute("SHOW CLIENTS")
            names = [c.name for c in cursor.description]
            return {dict(zip(names, row, strict=True)).get("application_name") for row in cursor}

    def output(self) -> str:
        path = self.folder / "pgbouncer.log"
        return path.read_text() if path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # immediate shutdown
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self.proc is not None:
            self.log.close()

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)


def _direct_backends(application_name: str) -> int:
    """Backends of the test database opened under this name without the pooler's help: PgBouncer
    sets a client's application_name on the server connection only while they are linked."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name = %s",
            [application_name],
        )
        return cursor.fetchone()[0]


@pytest.fixture(params=["session", "transaction"])
def bouncer(request, transactional_db):
    bouncer = PgBouncer(connection.settings_dict, request.param)
    try:
        yield bouncer.start()
    finally:
        bouncer.stop()
        print(f"--- pgbouncer ({request.param} mode) ---\n{bouncer.output()[-4000:]}")
        bouncer.close()


def test_a_person_pauses_and_cancels_runs_at_once_behind_pgbouncer(
    worker_env, manage, person, bouncer
):
    pool_mode = bouncer.settings["pool_mode"]
    # Run A asks its model again and again (a tool call a second); run B's request hangs.
    looping = [reply_tool_calls([("list_files", {})], delay=1.0) for _ in range(40)]
    hanging = [hang(60, then=reply_tool_calls([("list_files", {})]))]
    worker_id = f"behind-{pool_mode}"
    with ScriptedModelServer(looping) as slow, ScriptedModelServer(hanging) as stuck:
        paused = tool_task(slow, ["list_files"], limits={"limit_turns": 60})
        cancelled = tool_task(stuck, ["list_files"])
        env = {**worker_env, **SLOW_HEARTBEAT, "DATABASE_URL": bouncer.url()}
        if pool_mode == "transaction":
            # The pool through the pooler, the LISTEN to PostgreSQL itself.
            env["ACTHELM_LISTEN_DATABASE_URL"] = worker_env["DATABASE_URL"]
        worker = WorkerProcess(env, "--concurrency", "2", worker_id=worker_id)
        try:
            assert slow.wait_for_requests(2, 30), "run A never asked its model twice"
            assert stuck.wait_for_requests(1, 30), "run B never asked its model"
            # The worker's pool is a client of PgBouncer; its listener is one only in
            # session mode (in transaction mode it is PostgreSQL's own client).
            clients = bouncer.clients()
            assert f"acthelm-worker {worker_id}" in clients
            listener = f"acthelm-listen {worker_id}"
            if pool_mode == "transaction":
                assert listener not in clients
                wait_for(lambda: _direct_backends(listener) == 1, message="the direct listener")
            else:
                assert listener in clients

            # The pause from the console's service (this process, straight to PostgreSQL); the
            # cancel from the command line through the pooler: its NOTIFY, sent in the
            # transaction, passes PgBouncer in either mode.
            task_pause(actor=Actor.person(person), task_id=paused.pk)
            sent_at_pause = len(slow.requests)
            cancel = manage(
                "acthelm_task", "--user", person.username, "cancel", str(cancelled.pk),
                env={"DATABASE_URL": bouncer.url()},
            )  # fmt: skip
            assert cancel.returncode == 0, cancel.stderr
            # The cancel cuts the hanging request, the pause stops A at its next safe point:
            # both far sooner than the 30-s heartbeat could.
            assert stuck.wait_aborted(REACTION_SECONDS), "the cancel did not cut the request"
            wait_for(
                lambda: Task.objects.get(pk=paused.pk).status == TaskStatus.PAUSED,
                timeout=REACTION_SECONDS,
                message="run A paused",
            )
            # The request in flight at the pause finished; no further one started.
            assert len(slow.requests) <= sent_at_pause + 1
            wait_for(
                lambda: AgentRun.objects.filter(task=cancelled, status="cancelled").exists(),
                timeout=REACTION_SECONDS,
                message="run B cancelled",
            )
            assert Task.objects.get(pk=cancelled.pk).status == TaskStatus.CANCELLED
        finally:
            worker.terminate()
            try:
                code = worker.wait(30)
                print(f"--- worker ---\n{worker.output[-4000:]}")
            finally:
                worker.stop()
        assert code == 0
