"""/healthz, /metrics and the console's worker page, against real PostgreSQL."""

import json
import re
import socket
import subprocess
import sys
from datetime import timedelta

import pytest
from django.urls import reverse
from django.utils import timezone

from agents.engine.runtime.seen import record_seen
from agents.models import WorkerSeen
from agents.states import RunStatus
from console.views.ops import worker_host
from tasks.states import EventKind, TaskStatus
from tests.conftest import ROOT
from tests.factories import (
    AgentRunFactory,
    ConnectionFactory,
    ModelFactory,
    TaskEventFactory,
    TaskFactory,
    UserFactory,
)

TOKEN = "s3cret-metrics-token"

# --- /healthz -----------------------------------------------------------------------------------


def test_healthz_answers_ok_without_login(client, db):
    response = client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok"}
    assert "no-cache" in response["Cache-Control"]


def test_healthz_only_answers_get(client, db):
    assert client.post("/healthz").status_code == 405


_HEALTHZ_CHILD = """
import django
django.setup()
from django.test import Client
response = Client().get("/healthz")
print(response.status_code, response.content.decode())
"""


def test_healthz_is_503_when_the_database_is_unreachable(worker_env):
    # A port that is bound but not listening: every connection attempt is refused.
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        env = {**worker_env, "DATABASE_URL": f"postgresql://acthelm@127.0.0.1:{port}/acthelm"}
        result = subprocess.run(
            [sys.executable, "-c", _HEALTHZ_CHILD],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert result.returncode == 0, result.stderr
    status, body = result.stdout.strip().split(" ", 1)
    assert status == "503"
    assert json.loads(body) == {"status": "error", "database": "unreachable"}
    assert "healthz.database_unreachable" in result.stderr


# --- a fleet of tasks, runs, events and connections ---------------------------------------------

A = "host-a:100:0"
A2 = "host-a:100:1"
B = "host-b:200:0"


@pytest.fixture
def fleet(db):
    """Two live workers on host-a... one host, two ids; one stale worker on host-b."""
    now = timezone.now()
    cool = ConnectionFactory(name="cool", cooldown_until=now + timedelta(minutes=20))
    warm = ConnectionFactory(name="warm", cooldown_until=now - timedelta(minutes=1))
    ConnectionFactory(name="never")
    fast = ModelFactory(connection=warm, name="fast")
    slow = ModelFactory(connection=cool, name="slow")

    ready = [TaskFactory(status=TaskStatus.READY) for _ in range(2)]
    TaskFactory(status=TaskStatus.PAUSED)
    a1 = TaskFactory(status=TaskStatus.IN_PROGRESS, lease_owner=A)
    a2 = TaskFactory(status=TaskStatus.PAUSE_REQUESTED, lease_owner=A)
    a3 = TaskFactory(status=TaskStatus.IN_PROGRESS, lease_owner=A2)
    b1 = TaskFactory(
        status=TaskStatus.IN_PROGRESS, lease_owner=B, lease_expires_at=now - timedelta(seconds=90)
    )
    done = TaskFactory(status=TaskStatus.DONE)
    review = TaskFactory(status=TaskStatus.REVIEW)

    def run(task, worker, status=RunStatus.STARTED, heartbeat=None, **usage):
        return AgentRunFactory(
            task=task,
            number=1,
            claim_count=1,
            worker_id=worker,
            status=status,
            heartbeat_at=heartbeat,
            finished_at=None if status == RunStatus.STARTED else now,
            **usage,
        )

    run(a1, A, heartbeat=now - timedelta(seconds=4), model=fast, model_turns=3,
        active_seconds=6.5, input_tokens=1000, output_tokens=100)  # fmt: skip
    run(a2, A, heartbeat=now - timedelta(seconds=8), model=fast, model_turns=1,
        active_seconds=1.5, input_tokens=500, output_tokens=50)  # fmt: skip
    run(a3, A2)  # claimed a moment ago: no heartbeat yet
    run(b1, B, heartbeat=now - timedelta(seconds=95), model=slow, model_turns=2,
        active_seconds=30.0, input_tokens=2000, output_tokens=400)  # fmt: skip
    run(done, "host-c:300:0", status=RunStatus.SUCCEEDED, model=slow, model_turns=4,
        active_seconds=10.0, input_tokens=3000, output_tokens=600)  # fmt: skip
    run(review, "host-c:300:0", status=RunStatus.SUCCEEDED, model_turns=1)

    events = {
        EventKind.CLAIMED: 6,
        EventKind.LOST: 1,
        EventKind.REQUEUED: 2,
        EventKind.RETRY_SCHEDULED: 3,
        EventKind.HANDED_BACK: 2,
        EventKind.PROVIDER_COOLDOWN: 1,
        EventKind.FAILED: 1,
        EventKind.CREATED: 5,  # not exported
        EventKind.MODEL_TURN: 4,  # not exported
    }
    for kind, n in events.items():
        for _ in range(n):
            TaskEventFactory(task=ready[0], kind=kind)
    return {"a": [a1, a2], "a2": [a3], "b": [b1]}


# --- /metrics -----------------------------------------------------------------------------------

_SAMPLE = re.compile(
    r"^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>[^}]*)\})? (?P<value>[^ ]+)$"
)
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(?:,|$)')
_TYPES = {"counter", "gauge", "summary", "histogram", "untyped"}


def parse_prometheus(text: str) -> dict:
    """Parse the text exposition format strictly: {(name, frozenset(labels)): value}."""
    assert text.endswith("\n")
    helps, types, samples = {}, {}, {}
    for line in text.splitlines():
        assert line == line.strip() and line, f"stray whitespace or empty line: {line!r}"
        if line.startswith("# HELP "):
            name, help_text = line[7:].split(" ", 1)
            assert name not in helps, f"HELP twice for {name}"
            helps[name] = help_text
        elif line.startswith("# TYPE "):
            name, kind = line[7:].split(" ")
            assert kind in _TYPES and name not in types and name in helps
            types[name] = kind
        else:
            match = _SAMPLE.match(line)
            assert match, f"not a sample line: {line!r}"
            name = match["name"]
            family = re.sub(r"_(sum|count)$", "", name)
            if family not in types or types[family] != "summary":
                family = name
            assert family in types, f"sample {name} before its TYPE"
            raw = match["labels"] or ""
            labels = _LABEL.findall(raw)
            assert "".join(f'{k}="{v}",' for k, v in labels).rstrip(",") == raw, raw
            key = (name, frozenset(labels))
            assert key not in samples, f"duplicate sample {line}"
            samples[key] = float(match["value"])
    return samples


def _get_metrics(client, **headers):
    return client.get("/metrics", headers=headers)


@pytest.fixture
def metrics_token(settings):
    settings.ACTHELM_METRICS_TOKEN = TOKEN
    return TOKEN


def test_metrics_are_off_without_a_token_setting(client, db, settings):
    settings.ACTHELM_METRICS_TOKEN = ""
    assert _get_metrics(client).status_code == 404
    assert _get_metrics(client, Authorization="Bearer ").status_code == 404


@pytest.mark.parametrize(
    "authorization",
    [None, "", "Bearer", "Bearer wrong", f"Basic {TOKEN}", f"Bearer {TOKEN}x", TOKEN],
)
def test_metrics_refuse_a_missing_or_wrong_token(client, db, metrics_token, authorization):
    headers = {} if authorization is None else {"Authorization": authorization}
    response = _get_metrics(client, **headers)
    assert response.status_code == 403
    assert b"acthelm_" not in response.content


def test_metrics_need_no_login_but_the_token(client, db, metrics_token):
    response = _get_metrics(client, Authorization=f"Bearer {metrics_token}")
    assert response.status_code == 200
    assert response["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
    parse_prometheus(response.content.decode())


def test_metrics_numbers_match_the_database(client, fleet, metrics_token):
    response = _get_metrics(client, Authorization=f"bearer {metrics_token}")
    assert response.status_code == 200
    samples = parse_prometheus(response.content.decode())

    def value(name, **labels):
        return samples[(name, frozenset(labels.items()))]

    expected_states = {
        TaskStatus.READY: 2,
        TaskStatus.PAUSED: 1,
        TaskStatus.IN_PROGRESS: 3,
        TaskStatus.PAUSE_REQUESTED: 1,
        TaskStatus.DONE: 1,
        TaskStatus.REVIEW: 1,
    }
    for state in TaskStatus.values:
        assert value("acthelm_tasks", state=state) == expected_states.get(state, 0), state

    assert value("acthelm_workers_live") == 2  # host-a:100:0 and host-a:100:1
    assert value("acthelm_leases_expired") == 1  # host-b's task
    assert value("acthelm_runs_started") == 4

    assert value("acthelm_claims_total") == 6
    assert value("acthelm_recoveries_total", kind="lost") == 1
    assert value("acthelm_recoveries_total", kind="requeued") == 2
    assert value("acthelm_retries_total") == 3
    assert value("acthelm_handed_back_total") == 2
    assert value("acthelm_provider_cooldowns_total") == 1
    assert value("acthelm_task_failures_total") == 1

    assert value("acthelm_providers_cooling_down") == 1
    assert value("acthelm_provider_cooling_down", connection="cool") == 1
    assert value("acthelm_provider_cooling_down", connection="warm") == 0
    assert value("acthelm_provider_cooling_down", connection="never") == 0

    fast = {"connection": "warm", "model": "fast"}
    slow = {"connection": "cool", "model": "slow"}
    none = {"connection": "", "model": ""}
    assert value("acthelm_model_runs_total", **fast) == 2
    assert value("acthelm_model_runs_total", **slow) == 2
    assert value("acthelm_model_runs_total", **none) == 2
    assert value("acthelm_model_turn_seconds_sum", **fast) == pytest.approx(8.0)
    assert value("acthelm_model_turn_seconds_count", **fast) == 4
    assert value("acthelm_model_turn_seconds_sum", **slow) == pytest.approx(40.0)
    assert value("acthelm_model_turn_seconds_count", **slow) == 6
    assert value("acthelm_model_input_tokens_total", **fast) == 1500
    assert value("acthelm_model_output_tokens_total", **fast) == 150
    assert value("acthelm_model_input_tokens_total", **slow) == 5000
    assert value("acthelm_model_output_tokens_total", **slow) == 1000


def test_metrics_take_a_fixed_number_of_queries(
    client, fleet, metrics_token, django_assert_max_num_queries
):
    """Aggregates only: more rows never mean more queries."""
    with django_assert_max_num_queries(8):
        response = _get_metrics(client, Authorization=f"Bearer {metrics_token}")
    assert response.status_code == 200


def test_label_values_are_escaped(client, db, metrics_token):
    ConnectionFactory(name="quote", cooldown_until=timezone.now() + timedelta(minutes=5))
    ModelFactory(name='we"ird\\name')
    model = ModelFactory(name='we"ird\\name2')
    AgentRunFactory(model=model, model_turns=1)
    text = _get_metrics(client, Authorization=f"Bearer {metrics_token}").content.decode()
    samples = parse_prometheus(text)
    assert 'model="we\\"ird\\\\name2"' in text
    assert any(dict(labels).get("model") == 'we\\"ird\\\\name2' for (_, labels) in samples)


# --- /workers/ ----------------------------------------------------------------------------------


def test_worker_host_is_the_part_before_the_first_colon():
    assert worker_host("build-7.example.com:4242:3") == "build-7.example.com"
    assert worker_host("demo-worker") == ""


def operator():
    """Who may see the worker page: who may see the runs (issue 32: staff alone may not)."""
    return UserFactory(username="operator", perms=["agents.view_agentrun"])


def test_workers_page_needs_a_login_and_the_runs_permission(client, db):
    response = client.get(reverse("ops:workers"))
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/")
    # Staff with no permission (or only the tasks'): refused, like the scorecard.
    for perms in ([], ["tasks.view_task"]):
        client.force_login(UserFactory(is_staff=True, perms=perms))
        assert client.get(reverse("ops:workers")).status_code == 403
        assert client.get(reverse("scorecard:index")).status_code == 403
        response = client.get(reverse("ops:workers"), headers={"HX-Request": "true"})
        assert response.status_code == 403 and b"data-worker" not in response.content
    for user in (operator(), UserFactory(is_superuser=True)):
        client.force_login(user)
        assert client.get(reverse("ops:workers")).status_code == 200


def _rows(html: str) -> dict[str, tuple[str, str]]:
    """{worker id: (the row's cells, the row's class)}."""
    found = re.findall(r'<tr class="([^"]*)" data-worker="([^"]+)">(.*?)</tr>', html, re.S)
    return {worker: (cells, css) for css, worker, cells in found}


def test_workers_page_lists_workers_from_leases_and_flags_stale_ones(client, fleet):
    client.force_login(operator())
    response = client.get(reverse("ops:workers"))
    assert response.status_code == 200
    html = response.content.decode()
    rows = _rows(html)
    # Workers come from leases and started runs; host-c's runs are finished, so it is not listed.
    assert set(rows) == {A, A2, B}

    a_row, a_class = rows[A]
    assert "stale" not in a_class
    assert "host-a" in a_row and ">live<" in a_row.replace("\n", "").replace(" ", "")
    for task in fleet["a"]:
        assert f'<a href="{reverse("tasks:detail", args=[task.pk])}">#{task.pk}</a>' in a_row
    assert re.search(r"<td>\s*2\s*<a", a_row)  # tasks held
    assert "ago</time>" in a_row  # last heartbeat

    a2_row, _ = rows[A2]
    assert "not yet" in a2_row

    b_row, b_class = rows[B]
    assert "stale" in b_class
    assert "host-b" in b_row and "1 lease expired" in b_row
    assert "3 workers holding tasks" in html and "1 stale" in html
    # Stale workers come first.
    assert html.index(f'data-worker="{B}"') < html.index(f'data-worker="{A}"')


def test_workers_page_without_workers(client, db):
    client.force_login(operator())
    TaskFactory(status=TaskStatus.READY)
    html = client.get(reverse("ops:workers")).content.decode()
    assert "No worker holds a task right now" in html


def test_workers_page_htmx_refresh_returns_the_fragment(client, fleet):
    client.force_login(operator())
    response = client.get(reverse("ops:workers"), headers={"HX-Request": "true"})
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="workers"')
    assert "<html" not in html and f'data-worker="{B}"' in html


def test_an_idle_worker_is_listed_from_when_it_was_last_seen(client, db):
    """agents.engine.runtime.seen.record_seen (the maintenance loop's one call) upserts the
    process's row;
    the
    page lists a worker that holds nothing as idle, and one not seen for a while as gone."""
    record_seen("host-i:300:0", force=True)
    record_seen("host-i:300:0", force=True)  # an upsert: still one row
    assert WorkerSeen.objects.filter(worker_id="host-i:300:0").count() == 1
    WorkerSeen.objects.create(
        worker_id="host-g:400:0",
        host="host-g",
        started=timezone.now() - timedelta(hours=2),
        last_seen=timezone.now() - timedelta(minutes=10),
    )
    WorkerSeen.objects.create(
        worker_id="host-old:1:0",
        host="host-old",
        started=timezone.now() - timedelta(days=3),
        last_seen=timezone.now() - timedelta(days=2),
    )
    client.force_login(operator())
    html = client.get(reverse("ops:workers")).content.decode()
    rows = _rows(html)
    assert set(rows) == {"host-i:300:0", "host-g:400:0"}  # a day without a sign: not listed
    idle, _ = rows["host-i:300:0"]
    assert ">idle<" in idle.replace("\n", "").replace(" ", "") and "pid" in idle
    # A worker that holds no task has no lease to renew: not "not yet" (it may have run many).
    assert "not yet" not in idle and "none: holds no task" in idle
    gone, css = rows["host-g:400:0"]
    assert ">gone<" in gone.replace("\n", "").replace(" ", "") and "idle" in css
    assert "0 workers holding tasks, 1 idle, 1 gone" in " ".join(html.split())
