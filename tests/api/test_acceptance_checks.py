"""The API's task create takes acceptance checks (`expect`, one KIND=VALUE each), stores them,
shows them, and refuses a bad one naming the field."""

import pytest

from tasks.models import Task
from tests.api.conftest import error_of
from tests.factories import ModelFactory

pytestmark = pytest.mark.django_db


def test_create_with_acceptance_checks(api):
    ModelFactory()  # a tested, tool-capable, zero-cost model for a new task
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
