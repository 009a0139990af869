"""The API's task and goal create take acceptance checks (`expect`, one KIND=VALUE each), store
them, show them, and refuse a bad one naming the field; a goal's are its tasks' default."""

import pytest

from tasks.models import Goal, Task
from tests.api.conftest import error_of
from tests.factories import ModelFactory

pytestmark = pytest.mark.django_db


def test_create_with_acceptance_checks(api):
    ModelFactory()  # a person's new task needs a model to run on (issue 24)
    response = api.post_form(
        "/api/tasks",
        {
            "title": "Summarise",
            "instruction": "Read notes.txt and write summary.md",
            "tools": ["update_plan", "read_file", "write_artifact"],
            "expect": [
                "artifact=summary.md",
                "artifact_contains=summary.md:April",
                "tool_ran=read_file",
            ],
        },
    )
    assert response.status_code == 201, response.content
    data = response.json()
    assert data["acceptance_checks"] == [
        {"kind": "artifact", "value": "summary.md"},
        {"kind": "artifact_contains", "artifact": "summary.md", "value": "April"},
        {"kind": "tool_ran", "value": "read_file"},
    ]
    assert Task.objects.get(pk=data["id"]).acceptance_checks == data["acceptance_checks"]
    shown = api.get(f"/api/tasks/{data['id']}").json()
    assert shown["acceptance_checks"] == data["acceptance_checks"]


@pytest.mark.parametrize(
    "check, message",
    [
        ("guess=1", "unknown check kind"),
        ("answer_matches=(a", "not a regular expression"),
        ("tool_ran=fetch_url", "does not have that tool"),
    ],
)
def test_a_bad_check_is_a_400_naming_the_field(api, check, message):
    response = api.post_form(
        "/api/tasks",
        {"title": "T", "instruction": "I", "tools": ["read_file"], "expect": [check]},
    )
    assert response.status_code == 400, response.content
    data = error_of(response)
    assert data["code"] == "acceptance_check_invalid" and data["field"] == "acceptance_checks"
    assert message in data["message"]
    assert not Task.objects.exists()


def test_a_goal_with_acceptance_checks_is_their_default_for_its_tasks(api):
    response = api.post(
        "/api/goals",
        {"title": "Report", "expect": ["artifact=report.md", "tool_ran=read_file", " "]},
    )
    assert response.status_code == 201, response.content
    goal = response.json()
    checks = [
        {"kind": "artifact", "value": "report.md"},
        {"kind": "tool_ran", "value": "read_file"},
    ]
    assert goal["acceptance_checks"] == checks
    assert Goal.objects.get(pk=goal["id"]).acceptance_checks == checks
    assert api.get(f"/api/goals/{goal['id']}").json()["acceptance_checks"] == checks
    ModelFactory()
    task = api.post_form(
        "/api/tasks",
        {"title": "T", "instruction": "I", "goal_id": goal["id"], "tools": ["write_artifact"]},
    ).json()
    # The goal's checks, without tool_ran for a tool the task does not have.
    assert task["acceptance_checks"] == checks[:1]
    own = api.post_form(
        "/api/tasks",
        {"title": "T", "instruction": "I", "goal_id": goal["id"], "expect": ["answer_not_echo"]},
    ).json()
    assert own["acceptance_checks"] == [{"kind": "answer_not_echo", "value": ""}]


def test_a_goal_with_a_bad_check_is_a_400_naming_the_field(api):
    response = api.post("/api/goals", {"title": "G", "expect": ["answer_matches=(?<=x)y"]})
    assert response.status_code == 400, response.content
    data = error_of(response)
    assert data["code"] == "acceptance_check_invalid" and data["field"] == "acceptance_checks"
    assert not Goal.objects.exists()
