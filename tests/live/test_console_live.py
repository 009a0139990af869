"""The console's stream for the task page's live panel (`tasks:live`): the session's person with
the permission to view tasks, the stream from the newest stored event on (the page shows the
stored ones), resumable like the API's."""

import pytest
from django.test import Client

from tasks import livestream
from tasks.states import EventKind, TaskStatus
from tests.factories import TaskEventFactory, TaskFactory, UserFactory
from tests.live.helpers import parse_sse

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def fresh_hub(monkeypatch):
    monkeypatch.setattr(livestream, "_hub", None)


def signed_in(username: str, perms: list[str]) -> Client:
    client = Client()
    client.force_login(UserFactory(username=username, perms=perms))
    return client


def test_only_a_signed_in_person_who_may_view_tasks_gets_it():
    task = TaskFactory(status=TaskStatus.DONE)
    url = f"/tasks/{task.pk}/live/"
    anonymous = Client().get(url)
    assert anonymous.status_code == 302 and "/login/" in anonymous["Location"]
    assert signed_in("nobody", []).get(url).status_code == 403
    assert signed_in("viewer", ["tasks.view_task"]).get("/tasks/999999/live/").status_code == 404


def test_it_starts_after_the_newest_stored_event_unless_told_where_to_resume():
    task = TaskFactory(status=TaskStatus.DONE)
    first, second = (
        TaskEventFactory(task=task, kind=k) for k in (EventKind.CREATED, EventKind.CLOSED)
    )
    client = signed_in("viewer", ["tasks.view_task"])
    url = f"/tasks/{task.pk}/live/"
    assert [m["event"] for m in parse_sse(client.get(url).streaming_content)] == ["end"]
    resumed = parse_sse(client.get(url, headers={"Last-Event-ID": str(first.pk)}).streaming_content)
    assert [(m["event"], m.get("id")) for m in resumed] == [
        ("task_event", str(second.pk)),
        ("end", None),
    ]
