"""The schedules pages: list, create (a bad rule refused on its field), the buttons, a schedule's
page with its slots and costs, the task page's link back, permissions."""

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.test import Client

from schedules.models import Schedule, ScheduleSlot
from schedules.services import schedules_tick
from tasks.models import Task
from tests.factories import AgentRunFactory, ModelFactory, TurnFactory, UserFactory

pytestmark = pytest.mark.django_db

PERMS = [
    "schedules.view_schedule",
    "schedules.add_schedule",
    "schedules.change_schedule",
    "schedules.delete_schedule",
    "tasks.view_task",
]


@pytest.fixture
def planner(db):
    from core.actors import Actor

    return Actor.person(UserFactory(username="planner", perms=PERMS))


@pytest.fixture
def browser(planner):
    client = Client()
    client.login(username="planner", password="pw")
    return client


def form(**over):
    return {
        "name": "digest",
        "cron": "0 8 * * 1-5",
        "timezone": "Europe/Berlin",
        "target": "task",
        "title": "Support digest",
        "instruction": "Summarise yesterday's tickets.",
        "connection": "",
        "model": "",
        "tools": "",
        "tags": "digest, support",
        "overlap": "skip",
        "catch_up": "latest",
        "ends_at": "",
    } | over


def test_create_then_list_pause_run_now_resume_remove(browser):
    ModelFactory()
    response = browser.post("/schedules/new/", form(ends_at="2030-01-01 08:00"))
    assert response.status_code == 302
    schedule = Schedule.objects.get()
    assert schedule.tags == ["digest", "support"]
    assert schedule.ends_at == datetime(2030, 1, 1, 7, tzinfo=UTC)  # 08:00 in Berlin, winter
    page = browser.get("/schedules/").content.decode()
    assert "digest" in page and "0 8 * * 1-5" in page and "Europe/Berlin" in page
    assert "CET" in page  # the next runs, in the schedule's zone
    browser.post(f"/schedules/{schedule.pk}/pause/", {"next": "list"})
    schedule.refresh_from_db()
    assert schedule.paused
    assert "Resume" in browser.get("/schedules/").content.decode()
    response = browser.post(f"/schedules/{schedule.pk}/run-now/")
    assert response.status_code == 302
    task = Task.objects.get()
    assert ScheduleSlot.objects.get().task == task
    browser.post(f"/schedules/{schedule.pk}/resume/")
    schedule.refresh_from_db()
    assert not schedule.paused
    browser.post(f"/schedules/{schedule.pk}/remove/")
    assert not Schedule.objects.exists() and Task.objects.filter(pk=task.pk).exists()


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"cron": "0 8 * * 1-5 *"}, "five fields"),
        ({"cron": "0 99 * * *"}, "invalid cron expression"),
        ({"timezone": "CEST"}, "unknown time zone"),
        ({"ends_at": "tomorrow"}, "YYYY-MM-DD HH:MM"),
        ({"tools": "read_file, hack_the_planet"}, "unknown tools"),
    ],
)
def test_a_bad_rule_is_refused_on_its_field(browser, over, message):
    response = browser.post("/schedules/new/", form(**over))
    assert response.status_code == 400
    assert message in response.content.decode()
    assert not Schedule.objects.exists()


def test_a_schedules_page_lists_its_slots_with_costs_and_the_task_links_back(browser, planner):
    from schedules.services import schedule_create

    model = ModelFactory()
    schedule = schedule_create(
        actor=planner,
        now=datetime(2026, 12, 1, 7, tzinfo=UTC),
        name="digest",
        cron="0 8 * * *",
        title="Digest",
        instruction="Summarise.",
        model=model,
    )
    schedules_tick(now=datetime(2026, 12, 1, 8, tzinfo=UTC))
    schedules_tick(now=datetime(2026, 12, 2, 8, tzinfo=UTC))  # skipped: the first is open
    task = Task.objects.get()
    TurnFactory(run=AgentRunFactory(task=task), cost=Decimal("0.25"))
    page = browser.get(f"/schedules/{schedule.pk}/").content.decode()
    assert f"task #{task.pk}" in page
    assert "The last one is still open" in page
    assert "$0.25" in page
    task_page = browser.get(f"/tasks/{task.pk}/").content.decode()
    assert f'href="/schedules/{schedule.pk}/"' in task_page


def test_a_person_without_the_permission_sees_no_buttons_and_is_refused(planner):
    from schedules.services import schedule_create

    schedule = schedule_create(
        actor=planner, name="digest", cron="0 8 * * *", title="D", instruction="I"
    )
    UserFactory(username="viewer", perms=["schedules.view_schedule"])
    client = Client()
    client.login(username="viewer", password="pw")
    page = client.get("/schedules/").content.decode()
    assert "digest" in page and "Run now" not in page and "New schedule" not in page
    assert client.post(f"/schedules/{schedule.pk}/run-now/").status_code == 403
    assert client.post("/schedules/new/", form()).status_code == 403
    assert Task.objects.count() == 0
