"""The API's reads make a fixed number of queries, whatever the number of tasks, turns, tool
calls or events."""

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tasks.states import TaskStatus
from tests.console.scenes import pending_approval, transcript_task
from tests.factories import ModelFactory, TaskFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _token_used(api):
    """The first request of a token records its use (one UPDATE); count the ones after it."""
    api.get("/api/goals")


def queries(api, path, params=None) -> int:
    with CaptureQueriesContext(connection) as ctx:
        assert api.get(path, params).status_code == 200
    return len(ctx.captured_queries)


def test_the_list_costs_the_same_for_3_and_60_tasks(api):
    model = ModelFactory()
    for _ in range(3):
        TaskFactory(status=TaskStatus.READY, model=model, connection=model.connection)
    few = queries(api, "/api/tasks")
    for _ in range(57):
        other = ModelFactory()
        TaskFactory(status=TaskStatus.REVIEW, model=other, connection=other.connection)
    assert queries(api, "/api/tasks") == few


def test_the_task_costs_the_same_for_a_short_and_a_long_transcript(api):
    short = transcript_task()
    long = transcript_task(extra_turns=40, extra_events=60)
    pending_approval(task=long)
    assert queries(api, f"/api/tasks/{long.pk}") == queries(api, f"/api/tasks/{short.pk}")
