"""A task's JSON is built once (`tasks.selectors.task_as_dict`, with `agents.selectors` for its
runs and artifacts): the API and `acthelm_task --json` show one task, one list row and one
action's result alike, field for field."""

import io
import json
import re
from datetime import datetime

import pytest
from django.core.management import call_command
from django.utils import timezone

from acthelm_site.api import schemas
from agents.states import RunStatus
from tasks.states import TaskStatus
from tests.factories import (
    AgentRunFactory,
    ArtifactFactory,
    GoalFactory,
    ModelFactory,
    TaskEventFactory,
    TaskFactory,
)

pytestmark = pytest.mark.django_db

_WHEN = re.compile(r"^\d{4}-\d\d-\d\dT")


def _same(value):
    """JSON with its times as datetimes: the API's encoder writes milliseconds and `Z` where
    isoformat writes microseconds and `+00:00`."""
    if isinstance(value, dict):
        return {key: _same(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_same(item) for item in value]
    if isinstance(value, str) and _WHEN.match(value):
        when = datetime.fromisoformat(value)
        return when.replace(microsecond=when.microsecond // 1000 * 1000)
    return value


def _cli(*args):
    out = io.StringIO()
    call_command("acthelm_task", "--json", "--user", "founder", *args, stdout=out)
    return json.loads(out.getvalue())


@pytest.fixture
def task():
    model = ModelFactory()
    task = TaskFactory(
        status=TaskStatus.REVIEW,
        goal=GoalFactory(),
        model=model,
        connection=model.connection,
        tags=["nightly", "report"],
        failure_message="",
    )
    AgentRunFactory(
        task=task, model=model, status=RunStatus.SUCCEEDED, answer="42", finished_at=timezone.now()
    )
    ArtifactFactory(task=task, name="summary.md")
    TaskEventFactory(task=task)
    return task


def test_one_task_is_the_same_in_the_api_and_in_acthelm_task_show(api, task):
    shown = api.get(f"/api/tasks/{task.pk}").json()
    cli = _cli("show", str(task.pk))
    # The CLI's usage adds the cost and the MCP calls to the API's four counters; all else is
    # the same document where both have a field.
    both = (set(shown) & set(cli)) - {"usage"}
    assert both >= set(schemas.TaskOut.model_fields) | {"tags", "runs", "artifacts", "events"}
    # The API's schema publishes an event's "from" under its field name, `from_`.
    shown["events"] = [
        {("from" if k == "from_" else k): v for k, v in e.items()} for e in shown["events"]
    ]
    for key in sorted(both):
        assert _same(shown[key]) == _same(cli[key]), key
    assert shown["runs"][0]["answer"] == "42" and shown["artifacts"][0]["name"] == "summary.md"


def test_a_list_row_and_an_actions_result_are_the_same_in_the_api_and_the_cli(api, task):
    row = api.get("/api/tasks").json()["items"][0]
    cli_row = _cli("list")[0]
    assert set(row) == set(schemas.TaskSummaryOut.model_fields)
    assert _same(row) == _same({key: cli_row[key] for key in row})

    other = TaskFactory(status=TaskStatus.READY)
    paused = api.post(f"/api/tasks/{other.pk}/pause").json()
    assert set(paused) == set(schemas.TaskOut.model_fields)
    # The same action again from the CLI: withdraw and pause, then the same document.
    _cli("resume", str(other.pk))
    cli_paused = _cli("pause", str(other.pk))
    changed = {"updated_at", "claim_count"}
    assert {k: _same(v) for k, v in paused.items() if k not in changed} == {
        k: _same(cli_paused[k]) for k in paused if k not in changed
    }
