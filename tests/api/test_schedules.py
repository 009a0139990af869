"""The API's schedules: the same services as the console and the CLI, the token's person's
permissions, clear 400s for a bad cron expression or time zone."""

import pytest

from schedules.models import Schedule, ScheduleSlot
from tasks.models import Task
from tasks.states import TaskStatus
from tests.api.conftest import client_for, error_of
from tests.factories import ModelFactory

pytestmark = pytest.mark.django_db

PERMS = [
    "schedules.view_schedule",
    "schedules.add_schedule",
    "schedules.change_schedule",
    "schedules.delete_schedule",
]


@pytest.fixture
def planner(db):
    return client_for("planner", PERMS)


def body(**over):
    model = ModelFactory(name="m1")
    return {
        "name": "weekday-digest",
        "cron": "0 8 * * 1-5",
        "timezone": "Europe/Berlin",
        "title": "Support digest",
        "instruction": "Summarise yesterday's tickets.",
        "model": model.name,
        "tags": ["digest"],
        "limits": {"limit_turns": 5},
    } | over


def test_create_list_show_pause_resume_run_now_delete(planner):
    created = planner.post("/api/schedules", body())
    assert created.status_code == 201, created.content
    data = created.json()
    assert data["timezone"] == "Europe/Berlin" and data["overlap"] == "skip"
    assert data["catch_up"] == "latest" and not data["paused"]
    assert len(data["next_runs"]) == 3 and data["next_runs"][0].endswith(("+01:00", "+02:00"))
    sid = data["id"]
    listed = planner.get("/api/schedules").json()
    assert [s["name"] for s in listed] == ["weekday-digest"]

    paused = planner.post(f"/api/schedules/{sid}/pause").json()
    assert paused["paused"] and paused["next_runs"] == []
    ran = planner.post(f"/api/schedules/{sid}/run-now")
    assert ran.status_code == 200, ran.content
    task = Task.objects.get(pk=ran.json()["created"]["task_id"])
    assert task.status == TaskStatus.READY and task.tags == ["digest"] and task.limit_turns == 5
    assert planner.post(f"/api/schedules/{sid}/resume").json()["paused"] is False

    shown = planner.get(f"/api/schedules/{sid}").json()
    assert shown["slots"][0]["task_id"] == task.pk and shown["slots"][0]["kind"] == "run_now"
    assert shown["last_result"]["outcome"] == "created"

    assert planner.delete(f"/api/schedules/{sid}").json() == {"deleted": sid}
    assert not Schedule.objects.exists() and not ScheduleSlot.objects.exists()
    assert Task.objects.filter(pk=task.pk).exists()


@pytest.mark.parametrize(
    ("over", "field", "words"),
    [
        ({"cron": "0 8 * * 1-9"}, "cron", "invalid cron expression"),
        ({"cron": "every morning"}, "cron", "five fields"),
        ({"timezone": "Europe/Atlantis"}, "timezone", "unknown time zone"),
        ({"overlap": "maybe"}, "overlap", "overlap must be one of"),
        ({"model": "nope"}, "model", "does not exist"),
    ],
)
def test_bad_input_is_a_400_naming_its_field(planner, over, field, words):
    response = planner.post("/api/schedules", body(**over))
    assert response.status_code == 400
    error = error_of(response)
    assert error["field"] == field and words in error["message"]
    assert not Schedule.objects.exists()


def test_without_the_permission_a_403_and_an_unknown_schedule_a_404(planner, powerless):
    sid = planner.post("/api/schedules", body()).json()["id"]
    for path in ("pause", "resume", "run-now"):
        assert powerless.post(f"/api/schedules/{sid}/{path}").status_code == 403
    assert powerless.get("/api/schedules").status_code == 403
    assert powerless.delete(f"/api/schedules/{sid}").status_code == 403
    assert error_of(planner.post("/api/schedules/999/pause"))["code"] == "schedule_not_found"
    assert Task.objects.count() == 0


def test_an_unknown_field_is_refused(planner):
    response = planner.post("/api/schedules", body(every="day"))
    assert response.status_code == 422 and error_of(response)["code"] == "unknown_field"
