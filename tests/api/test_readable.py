"""What the API and `acthelm_task show` say about a run and its numbers: a run a person accepted
over the supervisor's rejection reads "accepted by NAME: REASON" (accepted through the real
service, `task_accept`); amounts are fixed-point decimal strings ("0.00000000", never "0E-8") and
counts whole numbers; the supervisor's reason is not repeated after its verdict; tags match in
any case and a filter that is not understood is refused, naming it."""

import io
import json
import re
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.utils import timezone

from agents.actions.task import task_accept
from agents.models import Turn
from agents.states import Role, RunStatus, Verdict
from core.actors import Actor
from tasks.states import TaskStatus
from tests.agents.rejections import rejected_task
from tests.api.test_endpoints import assert_error
from tests.factories import AgentRunFactory, TaskFactory, TurnFactory

pytestmark = pytest.mark.django_db

FIXED = re.compile(r"^-?\d+(\.\d+)?$")


def _show(*args: str) -> str:
    out = io.StringIO()
    call_command("acthelm_task", "--user", "founder", *args, stdout=out)
    return out.getvalue()


@pytest.fixture
def accepted(api):
    task = rejected_task(failed=True)
    task_accept(actor=Actor.person(api.user), task_id=task.pk, reason="report.md will do")
    return task


def test_an_accepted_run_reads_accepted_by_its_person_in_the_api(api, accepted):
    [run] = api.get(f"/api/tasks/{accepted.pk}").json()["runs"]
    assert run["verdict"] == Verdict.REJECTED  # the supervisor's own, unchanged
    assert run["verdict_shown"] == "accepted"
    assert run["verdict_words"] == "accepted by founder: report.md will do"
    assert run["accepted"]["by"] == "founder" and run["accepted"]["reason"] == "report.md will do"


def test_an_accepted_run_reads_accepted_by_its_person_in_the_cli(accepted):
    text = _show("show", str(accepted.pk))
    assert "verdict: accepted by founder: report.md will do" in text
    assert "rejected by the supervisor" not in text.split("runs:")[1]
    doc = json.loads(_show("--json", "show", str(accepted.pk)))
    assert doc["verdict_shown"] == "accepted"
    assert doc["verdict_words"] == "accepted by founder: report.md will do"


def test_the_verdict_is_said_once(api):
    task = TaskFactory(status=TaskStatus.REVIEW)
    AgentRunFactory(
        task=task,
        status=RunStatus.SUCCEEDED,
        finished_at=timezone.now(),
        verdict=Verdict.APPROVED,
        verdict_reason="approved: 3 checks passed; no model supervisor",
        answer="42",
    )
    text = _show("show", str(task.pk))
    assert "verdict: approved by the supervisor: 3 checks passed; no model supervisor" in text
    assert "approved: approved" not in text


def test_money_is_fixed_point_and_counts_are_whole_numbers(api):
    task = TaskFactory(status=TaskStatus.REVIEW, limit_cost=Decimal("5.0000"))
    run = AgentRunFactory(
        task=task,
        status=RunStatus.SUCCEEDED,
        finished_at=timezone.now(),
        model_turns=1,
        input_tokens=3,
        output_tokens=2,
        cost=Decimal("0E-8"),
    )
    TurnFactory(run=run, role=Role.ASSISTANT, cost=Decimal("0E-8"))
    assert Turn.objects.filter(task=task).exists()
    for doc in (
        api.get(f"/api/tasks/{task.pk}").json(),
        json.loads(_show("--json", "show", str(task.pk))),
    ):
        [row] = doc["runs"]
        assert row["cost"] == "0.00000000"
        assert FIXED.match(doc["limits"]["cost"]), doc["limits"]
        for name in ("model_turns", "tokens", "network_requests"):
            assert type(doc["usage"][name]) is int, (name, doc["usage"])
        assert type(row["input_tokens"]) is int and type(row["output_tokens"]) is int
        assert "E-" not in json.dumps(doc)
    listed = api.get("/api/tasks").json()["items"]
    assert all(r.get("cost") is None or FIXED.match(r["cost"]) for r in listed)


def test_tags_match_in_any_case_and_a_bad_filter_is_named(api):
    wanted = TaskFactory(tags=["Weekly Report"])
    TaskFactory(tags=["ops"])
    rows = api.get("/api/tasks", {"tag": "weekly report"}).json()["items"]
    assert [r["id"] for r in rows] == [wanted.pk]
    assert_error(api.get("/api/tasks", {"status": "finished"}), 400, "invalid_input", "status")
