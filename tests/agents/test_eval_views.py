"""The evaluation page: behind a login and the view permission; every number leads to its task."""

import pytest
from django.utils import timezone

from agents.eval.models import EvalOutcome
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
    model, run, passed, failed = results
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
