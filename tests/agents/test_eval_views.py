"""The evaluation page: behind a login and the view permission; every number leads to its task."""

import pytest
from django.utils import timezone

from agents.eval.models import EvalOutcome
from agents.eval.report import eval_report
from agents.states import RunStatus
from tasks.states import EventKind, TaskStatus
from tests.factories import (
    AgentRunFactory,
    EvalResultFactory,
    EvalRunFactory,
    ModelFactory,
    TaskEventFactory,
    TaskFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client):
    user = UserFactory(username="viewer", perms=["agents.view_agentrun"])
    client.force_login(user)
    return user


@pytest.fixture
def results():
    model = ModelFactory(connection__name="local", name="qwen", price_input_per_mtok=None)
    run = EvalRunFactory(model=model)
    passed = EvalResultFactory(run=run, case_id="files_list")
    failed = EvalResultFactory(
        run=run,
        case_id="direct_answer",
        outcome=EvalOutcome.FAILED,
        final_state=TaskStatus.CANCELLED,
        checks=[{"check": "answer_matches", "passed": False, "detail": "/42/ against ''"}],
    )
    # Real work of the same model: one task closed, one reopened.
    for kind in (EventKind.CLOSED, EventKind.REOPENED):
        task = TaskFactory(status=TaskStatus.DONE, model=model, connection=model.connection)
        AgentRunFactory(
            task=task, model=model, status=RunStatus.SUCCEEDED, finished_at=timezone.now()
        )
        TaskEventFactory(task=task, kind=kind)
    return model, run, passed, failed


def test_the_page_needs_a_login(client):
    response = client.get("/eval/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_the_page_needs_the_view_permission(client):
    client.force_login(UserFactory(username="nobody", perms=["tasks.view_task"]))
    assert client.get("/eval/").status_code == 403


def test_the_page_shows_the_pass_rate_interval_cases_and_real_work(client, viewer, results):
    _model, run, passed, failed = results
    response = client.get("/eval/")
    assert response.status_code == 200
    html = response.content.decode()
    assert "local / qwen" in html
    assert "1 of 2 (50.0%; 95% interval 9.5–90.5%)" in html
    assert f'href="/tasks/{passed.task_number}/"' in html
    assert f'href="/tasks/{failed.task_number}/"' in html
    assert "answer_matches: /42/ against" in html
    assert "2 tasks run, 1 closed, 1 reopened" in html
    assert "— (the model has no prices)" in html
    assert f'href="?run={run.pk}"' in html


def test_one_run_only_and_an_empty_page(client, viewer, results):
    _, run, _, _ = results
    assert "local / qwen" in client.get(f"/eval/?run={run.pk}").content.decode()
    assert "No evaluation runs yet" in client.get(f"/eval/?run={run.pk + 1}").content.decode()


def test_the_report_counts_false_approvals_and_rejections_per_supervisor_configuration(
    client, viewer
):
    model = ModelFactory(connection__name="local", name="qwen")
    rules = EvalRunFactory(model=model, supervisor="rules")
    defaults = EvalRunFactory(model=model, supervisor="rules+defaults")
    failed = {"outcome": EvalOutcome.FAILED, "final_state": TaskStatus.CANCELLED}
    # rules: a bad answer approved, a good one approved, one stopped at a limit (not judged).
    EvalResultFactory(run=rules, case_id="csv_total", supervisor_verdict="approved")
    EvalResultFactory(run=rules, case_id="files_list", supervisor_verdict="approved", **failed)
    EvalResultFactory(run=rules, case_id="limit_turns_tight", **failed)
    # rules+defaults: the bad answer rejected, a good answer rejected (work_passed), unverified.
    EvalResultFactory(
        run=defaults,
        case_id="files_list",
        supervisor_verdict="rejected",
        work_passed=False,
        **failed,
    )
    EvalResultFactory(
        run=defaults, case_id="csv_total", supervisor_verdict="rejected", work_passed=True, **failed
    )
    EvalResultFactory(run=defaults, case_id="plan_first", supervisor_verdict="unverified", **failed)
    report = {g.supervisor: g.supervision for g in eval_report()}
    assert set(report) == {"rules", "rules+defaults"}
    sup = report["rules"]
    assert sup.judged == 2
    assert (sup.false_approvals.k, sup.false_approvals.n) == (1, 1)
    assert (sup.false_rejections.k, sup.false_rejections.n) == (0, 1)
    assert (sup.false_approvals_expressible.k, sup.false_approvals_expressible.n) == (1, 1)
    sup = report["rules+defaults"]
    # An unverified run reached review without a model's look: it counts as let through.
    assert (sup.false_approvals.k, sup.false_approvals.n) == (1, 2) and sup.unverified == 1
    assert (sup.false_rejections.k, sup.false_rejections.n) == (1, 1)
    assert sup.false_approvals_expressible.n == 1  # plan_first is not expressible
    html = client.get("/eval/").content.decode()
    assert "<code>rules+defaults</code> judged 3" in html
    assert "1/2 (50%, 95% CI 9%–91%)" in html
