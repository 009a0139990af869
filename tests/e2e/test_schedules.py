"""The schedules page in a real browser: a person adds a schedule (a bad cron expression is
refused on its field first), pauses it, runs it now, and follows the task back to it."""

import pytest
from playwright.sync_api import expect

from schedules.models import Schedule, ScheduleSlot
from tasks.models import Task
from tasks.states import TaskStatus
from tests.factories import ModelFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PERMS = [
    "schedules.view_schedule",
    "schedules.add_schedule",
    "schedules.change_schedule",
    "schedules.delete_schedule",
    "tasks.view_task",
]


def test_create_pause_and_run_now_from_the_schedules_page(page, login):
    UserFactory(username="planner", perms=PERMS)
    ModelFactory()
    login("planner")
    page.get_by_role("link", name="Schedules").click()
    form = page.locator("#new-schedule")
    form.locator("#id_name").fill("weekday-digest")
    form.locator("#id_cron").fill("0 8 * * 1-7x")
    form.locator("#id_timezone").fill("America/New_York")
    form.locator("#id_title").fill("Support digest")
    form.locator("#id_instruction").fill("Summarise yesterday's support tickets.")
    form.get_by_role("button", name="Add schedule").click()
    expect(page.locator("#new-schedule .error")).to_contain_text("invalid cron expression")
    assert not Schedule.objects.exists()

    page.locator("#id_cron").fill("0 8 * * 1-5")
    page.get_by_role("button", name="Add schedule").click()
    expect(page.locator("h1")).to_have_text("Schedule weekday-digest")
    expect(page.locator(".next-runs li").first).to_contain_text("08:00 EST")
    expect(page.locator(".next-runs .local-time").first).to_contain_text("yours:")

    page.get_by_role("link", name="← Schedules").click()
    row = page.locator("tr[data-schedule=weekday-digest]")
    row.get_by_role("button", name="Pause").click()
    row = page.locator("tr[data-schedule=weekday-digest]")
    expect(row.locator("[data-state]")).to_have_text("paused")
    expect(row.get_by_role("button", name="Resume")).to_be_visible()

    row.get_by_role("button", name="Run now").click()
    expect(page.locator(".flash-success")).to_contain_text("created")
    task = Task.objects.get()
    assert task.status == TaskStatus.READY
    assert ScheduleSlot.objects.get().task_id == task.pk
    row = page.locator("tr[data-schedule=weekday-digest]")
    expect(row.locator(".last-result")).to_contain_text(f"task #{task.pk}")

    row.get_by_role("link", name=f"task #{task.pk}").click()
    expect(page.locator("#state-schedule")).to_contain_text("weekday-digest")
    page.locator("#state-schedule a").click()
    expect(page.locator("#slots")).to_contain_text(f"task #{task.pk}")
