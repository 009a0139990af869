"""The admin saves a schedule through the service: a bad cron expression or time zone is shown on
its field and nothing is saved; the actions pause, resume and run now."""

import pytest
from django.test import Client

from schedules.models import Schedule, ScheduleSlot
from tests.factories import ModelFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client():
    UserFactory(username="boss", is_superuser=True)
    client = Client()
    client.login(username="boss", password="pw")
    return client


def fields(**over):
    return {
        "name": "digest",
        "target": "task",
        "cron": "0 8 * * 1-5",
        "timezone": "Europe/Berlin",
        "title": "Digest",
        "instruction": "Summarise.",
        "tools": "null",
        "tool_policies": "{}",
        "allowed_domains": "[]",
        "tags": "",
        "limits": "{}",
        "acceptance_checks": "[]",
        "priority": "0",
        "overlap": "skip",
        "catch_up": "latest",
        "slots-TOTAL_FORMS": "0",
        "slots-INITIAL_FORMS": "0",
    } | over


@pytest.mark.parametrize(
    ("over", "message"),
    [({"cron": "0 8 * * 1-5 2027"}, "five fields"), ({"timezone": "Berlin"}, "unknown time zone")],
)
def test_a_bad_rule_is_refused_on_its_field(admin_client, over, message):
    response = admin_client.post("/admin/schedules/schedule/add/", fields(**over))
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not Schedule.objects.exists()


def test_add_then_the_actions(admin_client):
    ModelFactory()
    response = admin_client.post("/admin/schedules/schedule/add/", fields())
    assert response.status_code == 302, response.content.decode()[:2000]
    schedule = Schedule.objects.get()
    assert schedule.next_slot_at is not None and schedule.created_by.username == "boss"
    for action in ("pause", "run_now"):
        admin_client.post(
            "/admin/schedules/schedule/",
            {"action": action, "_selected_action": [schedule.pk]},
        )
    schedule.refresh_from_db()
    assert schedule.paused and ScheduleSlot.objects.get().task is not None
    # A change of the rule is saved through the service, which re-plans the next slot.
    response = admin_client.post(
        f"/admin/schedules/schedule/{schedule.pk}/change/", fields(cron="0 18 * * *")
    )
    assert response.status_code == 302
    schedule.refresh_from_db()
    assert schedule.cron == "0 18 * * *" and schedule.next_slot_at.hour == 17
