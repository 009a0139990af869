"""The task page's Runs table: each run's own state, its times, turns, tokens, cost and its
verdict or failure in plain words — the same figures the API publishes (one selector,
`agents.selectors.run_facts`)."""

import re
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest
from django.urls import reverse

from agents.models import AgentRun
from agents.states import Role, RunStatus, Verdict
from tasks.states import TaskStatus
from tests.api.conftest import client_for
from tests.factories import AgentRunFactory, ModelFactory, TaskFactory, TurnFactory, UserFactory

pytestmark = pytest.mark.django_db

START = datetime(2026, 12, 3, 14, 5, tzinfo=UTC)


def _run(task, number, *, seconds, **fields):
    started = START + timedelta(minutes=10 * number)
    finished = started + timedelta(seconds=seconds) if seconds is not None else None
    run = AgentRunFactory(
        task=task, number=number, claim_count=number, finished_at=finished, **fields
    )
    AgentRun.objects.filter(pk=run.pk).update(started_at=started)  # auto_now_add on create
    return run


@pytest.fixture
def task():
    model = ModelFactory(name="qwen-small", connection__name="local")
    task = TaskFactory(status=TaskStatus.REVIEW, model=model)
    rejected = _run(
        task,
        1,
        seconds=65,
        model=model,
        status=RunStatus.FAILED,
        verdict=Verdict.REJECTED,
        verdict_reason="summary.md was not written",
        error_code="supervisor_rejected",
        error_message="summary.md was not written",
        model_turns=3,
        input_tokens=1200,
        output_tokens=300,
    )
    # Booked on the run as the recorder does (the factory adds a turn's cost to its run).
    TurnFactory(run=rejected, role=Role.ASSISTANT, cost=Decimal("0.0042"))
    paused = _run(
        task,
        2,
        seconds=4.2,
        model=model,
        status=RunStatus.CANCELLED,
        error_code="paused",
        model_turns=1,
        input_tokens=400,
        output_tokens=20,
    )
    TurnFactory(run=paused, role=Role.ASSISTANT, cost=None)  # no price known
    _run(
        task,
        3,
        seconds=30,
        model=model,
        status=RunStatus.SUCCEEDED,
        verdict=Verdict.APPROVED,
        verdict_reason="summary.md has three bullets",
        model_turns=2,
        input_tokens=900,
        output_tokens=150,
        cost=Decimal("2.5"),
    )
    return task


def _rows(client, task) -> dict[int, str]:
    html = client.get(reverse("tasks:detail", args=[task.pk])).content.decode()
    card = html[html.index('class="card runs-card"') :]
    card = card[: card.index("</section>")]
    assert '<th class="num">Run</th>' in card and ">Attempt</th>" in card
    rows = re.findall(r'<tr data-run="(\d+)"(.*?)</tr>', card, re.S)
    return {int(number): body for number, body in rows}


def test_each_run_reads_its_own_state_times_figures_and_outcome(client, task):
    client.force_login(UserFactory(perms=["tasks.view_task"]))
    rows = _rows(client, task)
    assert sorted(rows) == [1, 2, 3]

    # The rejected run was attempt 1 and failed it; the paused run went on with attempt 2 and
    # did not end it; the run after it finished attempt 2.
    assert [re.search(r'data-attempt="(\d+)"', rows[n]).group(1) for n in (1, 2, 3)] == [
        "1",
        "2",
        "2",
    ]
    rejected = rows[1]
    assert 'data-state="failed"' in rejected and ">failed</span>" in rejected
    assert "local/<wbr>qwen-small" in rejected  # breaks after the connection, not mid-name
    words = re.sub(r"<[^>]+>", "", rejected)
    assert "2026-12-03 14:15 UTC" in words and "2026-12-03 14:16 UTC" in words
    assert "1 min 5 s" in rejected and "1200 / 300" in rejected and "$0.0042" in rejected
    assert "rejected by the supervisor" in rejected and "summary.md was not written" in rejected

    paused = rows[2]
    assert 'data-state="paused"' in paused and ">paused</span>" in paused
    assert "Cancelled" not in paused and "cancelled" not in paused
    assert "4.2 s" in paused and "400 / 20" in paused
    assert "unknown" in paused  # a turn of no known price: the cost is not $0
    # The failure in words; its code is the words' title, not a raw code beside them.
    assert "paused by a person" in paused and 'title="paused"' in paused
    assert '<code class="code">paused</code>' not in paused

    succeeded = rows[3]
    assert 'data-state="succeeded"' in succeeded and ">succeeded</span>" in succeeded
    assert "30 s" in succeeded and "$2.50" in succeeded
    assert "approved by the supervisor" in succeeded


def test_a_running_run_has_no_end_yet(client):
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    _run(task, 1, seconds=None, status=RunStatus.STARTED)
    client.force_login(UserFactory(perms=["tasks.view_task"]))
    row = _rows(client, task)[1]
    assert 'data-state="running"' in row and ">running</span>" in row
    assert "—" in row  # no duration while it runs


def test_the_api_publishes_the_same_figures(task):
    api = client_for("reader", ["tasks.view_task"])
    runs = api.get(f"/api/tasks/{task.pk}").json()["runs"]
    by_number = {run["number"]: run for run in runs}
    assert by_number[1]["state"] == "failed" and by_number[1]["duration_seconds"] == 65.0
    assert [(r["attempt"], r["failed_attempt"]) for r in runs] == [
        (1, True),
        (2, False),
        (2, False),
    ]
    assert by_number[1]["cost"] == "0.00420000" and by_number[1]["verdict"] == "rejected"
    assert by_number[1]["error_words"] == "the supervisor rejected the result"
    assert by_number[2]["state"] == "paused" and by_number[2]["status"] == "cancelled"
    assert by_number[2]["cost"] is None and by_number[2]["error_words"] == "paused by a person"
    assert by_number[3]["state"] == "succeeded" and by_number[3]["cost"] == "2.50000000"


def test_attempts_go_on_after_a_persons_retry(client):
    from tasks.states import EventKind
    from tests.factories import TaskEventFactory

    task = TaskFactory(status=TaskStatus.READY)
    codes = ["provider_server_error", "provider_server_error", "worker_lost", "limit_steps"]
    for number, code in enumerate(codes, start=1):
        claim = TaskEventFactory(task=task, kind=EventKind.CLAIMED)
        _run(task, number, seconds=5, status=RunStatus.FAILED, error_code=code, claim_event=claim)
    TaskEventFactory(task=task, kind=EventKind.RETRIED)  # a person's retry after limit_steps
    claim = TaskEventFactory(task=task, kind=EventKind.CLAIMED)
    _run(task, 5, seconds=5, status=RunStatus.SUCCEEDED, claim_event=claim)
    client.force_login(UserFactory(perms=["tasks.view_task"]))
    rows = _rows(client, task)
    attempts = [re.search(r'data-attempt="(\d+)"', rows[n]).group(1) for n in sorted(rows)]
    # A lost worker is not an attempt: the run after it goes on with attempt 3. A person's
    # retry gives the task its attempts again, but the run after it is the next attempt.
    assert attempts == ["1", "2", "3", "3", "4"]


def test_the_cli_shows_the_same_runs(task):
    import io

    from django.core.management import call_command

    out = io.StringIO()
    call_command("acthelm_task", "show", str(task.pk), stdout=out)
    text = out.getvalue()
    runs = text[text.index("runs:") :].splitlines()[1:4]
    assert runs[0].startswith("  run 1 · attempt 1 · failed · local/qwen-small · started ")
    assert "1 min 5 s · 3 turns · 1200/300 tokens · $0.0042" in runs[0]
    assert runs[0].endswith("rejected by the supervisor: summary.md was not written")
    assert " · attempt 2 · paused · " in runs[1] and "unknown" in runs[1]
    assert runs[1].endswith("paused by a person (paused)")
    assert " · succeeded · " in runs[2] and "approved by the supervisor" in runs[2]
