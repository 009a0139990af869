"""The live channel behind a real PgBouncer in transaction mode: the web process (runserver, its
requests through the pooler) listens on its own direct connection (ACTHELM_LISTEN_DATABASE_URL),
the worker's side sends its NOTIFYs through the pooler from its pool, and a viewer gets the
deltas, then the end when the task settles."""

import json
import socket
import subprocess
import sys
import time

import httpx
import pytest
from django.db import connection

from acthelm_site.api.tokens import token_create
from agents.actions.task import task_cancel
from core.actors import Actor
from tasks.states import EventKind, TaskStatus
from tests.agents.test_worker_pgbouncer import PGBOUNCER, PgBouncer
from tests.api.conftest import ALL_PERMS
from tests.conftest import ROOT
from tests.factories import AgentRunFactory, TaskEventFactory, TaskFactory, UserFactory

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.slow,
    pytest.mark.skipif(PGBOUNCER is None, reason="the pgbouncer binary is not installed"),
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def direct_backends(prefix: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
            "AND application_name LIKE %s",
            [prefix + "%"],
        )
        return cursor.fetchone()[0]


@pytest.fixture
def bouncer(transactional_db):
    bouncer = PgBouncer(connection.settings_dict, "transaction")
    try:
        yield bouncer.start()
    finally:
        bouncer.close()


def test_deltas_reach_a_viewer_behind_pgbouncer_in_transaction_mode(worker_env, bouncer):
    user = UserFactory(username="founder", perms=ALL_PERMS)
    token = token_create(user=user, name="bouncer").secret
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    run = AgentRunFactory(task=task)
    TaskEventFactory(task=task, kind=EventKind.CLAIMED, run=run)
    env = {
        **worker_env,
        "DATABASE_URL": bouncer.url(),  # every request and every send through the pooler
        "ACTHELM_LISTEN_DATABASE_URL": worker_env["DATABASE_URL"],  # the listeners direct
    }
    port = free_port()
    web = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "runserver", "--noreload", f"127.0.0.1:{port}"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    worker = subprocess.Popen(
        [sys.executable, "-m", "tests.live.worker_side", str(task.pk), str(run.pk), "bouncer"],
        env=env,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "runserver did not start"
                time.sleep(0.1)
        words: list[str] = []
        events: list[str] = []
        with httpx.stream(
            "GET",
            f"http://127.0.0.1:{port}/api/tasks/{task.pk}/events",
            headers={"Authorization": f"Bearer {token}"},
            timeout=30,
        ) as answer:
            assert answer.status_code == 200
            cancelled = False
            for line in answer.iter_lines():
                if line.startswith("event: "):
                    events.append(line[7:])
                if line.startswith("data: ") and events and events[-1] == "delta":
                    for kind, data in json.loads(line[6:])["deltas"]:
                        if kind == "text":
                            words += data["text"].split()
                if len(words) >= 20 and not cancelled:
                    # the web's listener went to PostgreSQL itself, not through the pooler
                    assert not any(
                        (name or "").startswith("acthelm-live web") for name in bouncer.clients()
                    )
                    assert direct_backends("acthelm-live web") == 1
                    task_cancel(actor=Actor.person(user), task_id=task.pk)
                    cancelled = True
        assert events[-1] == "end"
        assert words[:3] == ["word0", "word1", "word2"]  # in order, none lost
        assert words == [f"word{n}" for n in range(len(words))]
    finally:
        for proc in (worker, web):
            proc.terminate()
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
