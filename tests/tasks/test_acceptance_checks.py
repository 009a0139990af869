"""Acceptance checks through the console's New task form, `acthelm_task create --expect` and
`show`, and on the task page beside the supervisor's verdict (unverified included); a goal's
through `acthelm_goal create --expect` and `show`, on the goal page, and as the New task form's
default."""

import json

import pytest
from django.utils import timezone

from agents.states import RunStatus, Verdict
from tasks.models import Goal, Task
from tasks.services import default_limits
from tasks.states import TaskStatus
from tests.factories import AgentRunFactory, GoalFactory, ModelFactory, TaskFactory, UserFactory

pytestmark = pytest.mark.django_db

PERMS = ["tasks.view_task", "tasks.add_task", "tasks.close_task", "tasks.operate_task"]


@pytest.fixture
def boss(client):
    ModelFactory()  # a person's new task needs a model to run on (issue 24)
    client.force_login(UserFactory(username="boss", perms=PERMS))
    return client


def _form(**more):
    data = {"title": "T", "instruction": "Write summary.md", "priority": "0"}
    data |= {k: "" if v is None else str(v) for k, v in default_limits().items()}
    data["tools"] = ["update_plan", "write_artifact"]
    return data | more


def test_the_form_takes_one_check_per_line(boss):
    response = boss.post(
        "/tasks/new/",
        _form(acceptance_checks="artifact=summary.md\n\n# a comment\nanswer_not_echo\n"),
    )
    task = Task.objects.get()
    assert response.status_code == 302
    assert task.acceptance_checks == [
        {"kind": "artifact", "value": "summary.md"},
        {"kind": "answer_not_echo", "value": ""},
    ]
    page = boss.get(f"/tasks/{task.pk}/").content.decode()
    assert "<code>artifact=summary.md</code>" in page


def test_the_form_shows_a_bad_check_on_its_field_and_creates_nothing(boss):
    response = boss.post("/tasks/new/", _form(acceptance_checks="artifact_exists=summary.md"))
    assert response.status_code == 400
    assert "unknown check kind &#x27;artifact_exists&#x27;" in response.content.decode()
    assert not Task.objects.exists()


def test_the_task_page_marks_an_unverified_verdict(boss):
    task = TaskFactory(status=TaskStatus.REVIEW)
    AgentRunFactory(
        task=task,
        status=RunStatus.SUCCEEDED,
        finished_at=timezone.now(),
        verdict=Verdict.UNVERIFIED,
        verdict_reason="unverified: the rules passed, but the model supervisor could not be asked",
    )
    page = boss.get(f"/tasks/{task.pk}/").content.decode()
    assert "Supervisor: unverified" in page
    assert "not everything was checked" in page
    assert "the model supervisor could not be asked" in page  # the reason


def test_cli_create_expect_and_show(manage, transactional_db):
    UserFactory(username="ops", is_superuser=True)
    ModelFactory()  # a person's new task needs a model to run on (issue 24)
    created = manage(
        "acthelm_task",
        "--json",
        "--user",
        "ops",
        "create",
        "--title",
        "T",
        "--instruction",
        "Write summary.md",
        "--tool",
        "write_artifact",
        "--expect",
        "artifact=summary.md",
        "--expect",
        "answer_contains=done",
        check=True,
    )
    data = json.loads(created.stdout)
    assert data["acceptance_checks"] == [
        {"kind": "artifact", "value": "summary.md"},
        {"kind": "answer_contains", "value": "done"},
    ]
    shown = manage("acthelm_task", "show", str(data["id"]), check=True).stdout
    assert "acceptance checks: artifact=summary.md; answer_contains=done" in shown
    bad = manage(
        "acthelm_task",
        "--user",
        "ops",
        "create",
        "--title",
        "T",
        "--instruction",
        "I",
        "--expect",
        "answer_matches=(?<=x)y",
    )
    assert bad.returncode != 0 and "acceptance_check_invalid" in bad.stderr
    assert Task.objects.count() == 1


def test_a_goal_s_checks_are_on_its_page_and_the_form_s_default(boss):
    goal = GoalFactory(acceptance_checks=[{"kind": "artifact", "value": "summary.md"}])
    page = boss.get(f"/goals/{goal.pk}/").content.decode()
    assert "Acceptance checks of its work:" in page and "<code>artifact=summary.md</code>" in page
    response = boss.post("/tasks/new/", _form(goal=str(goal.pk), acceptance_checks=""))
    assert response.status_code == 302
    assert Task.objects.get().acceptance_checks == [{"kind": "artifact", "value": "summary.md"}]
    plain = GoalFactory()
    assert "Acceptance checks" not in boss.get(f"/goals/{plain.pk}/").content.decode()


def test_cli_goal_create_expect_and_show(manage, transactional_db):
    UserFactory(username="ops", is_superuser=True)
    created = manage(
        "acthelm_goal",
        "--json",
        "--user",
        "ops",
        "create",
        "--title",
        "Report",
        "--expect",
        "artifact=report.md",
        "--expect",
        "tool_ran=fetch_url",
        check=True,
    )
    data = json.loads(created.stdout)
    assert data["acceptance_checks"] == [
        {"kind": "artifact", "value": "report.md"},
        {"kind": "tool_ran", "value": "fetch_url"},
    ]
    shown = manage("acthelm_goal", "show", str(data["id"]), check=True).stdout
    assert "acceptance checks: artifact=report.md; tool_ran=fetch_url" in shown
    bad = manage("acthelm_goal", "--user", "ops", "create", "--title", "G", "--expect", "guess=1")
    assert bad.returncode != 0 and "acceptance_check_invalid" in bad.stderr
    assert Goal.objects.count() == 1
