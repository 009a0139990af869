"""Issue 21 item 10 and issue 24 item 1: what the API refuses, and how it answers what it did not
raise itself. Each of these answered 500 (or HTML, or was silently accepted) before."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from tasks import selectors as task_selectors
from tasks.models import Goal, Task
from tasks.states import EventKind, TaskStatus
from tests.api.conftest import error_of
from tests.factories import (
    AgentRunFactory,
    ModelFactory,
    TaskEventFactory,
    TaskFactory,
    TurnFactory,
)

pytestmark = pytest.mark.django_db

NUL = "a\x00b"


def assert_refused(response, status: int, code: str, field: str | None) -> dict:
    assert response.status_code == status, response.content
    assert response["Content-Type"].startswith("application/json")
    error = error_of(response)
    assert (error["code"], error["field"]) == (code, field), error
    return error


# -- a body that is not a JSON object --------------------------------------------------------------


def test_a_json_string_is_not_a_goal(api):
    """It created a goal titled "Ship The Release": the schema read the string's `title`."""
    error = assert_refused(api.post("/api/goals", "ship the release"), 400, "invalid_input", None)
    assert "JSON object" in error["message"]
    assert not Goal.objects.exists()


@pytest.mark.parametrize("body", [[1, 2], "stop", 7, True])
def test_a_cancel_body_that_is_not_an_object_cancels_nothing(api, body):
    task = TaskFactory(status=TaskStatus.READY)
    assert_refused(api.post(f"/api/tasks/{task.pk}/cancel", body), 400, "invalid_input", None)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.READY


# -- NUL characters --------------------------------------------------------------------------------


@pytest.mark.parametrize("field", ["title", "description"])
def test_nul_in_a_goal_is_refused(api, field):
    body = {"title": "Ship", field: NUL}
    assert_refused(api.post("/api/goals", body), 400, "invalid_input", field)
    assert not Goal.objects.exists()


@pytest.mark.parametrize(
    "field, value",
    [
        ("title", NUL),
        ("instruction", NUL),
        ("tags", [NUL]),
        ("allowed_domains", [NUL]),
        ("tools", ["read_file", NUL]),
    ],
)
def test_nul_in_a_task_field_is_refused(api, field, value):
    body = {"title": "T", "instruction": "I", field: value}
    assert_refused(api.post_form("/api/tasks", body), 400, "invalid_input", field)
    assert not Task.objects.exists()


def test_nul_in_a_cancel_reason_or_reopen_feedback_is_refused(api):
    ready = TaskFactory(status=TaskStatus.READY)
    response = api.post(f"/api/tasks/{ready.pk}/cancel", {"reason": NUL})
    assert_refused(response, 400, "invalid_input", "reason")
    assert Task.objects.get(pk=ready.pk).status == TaskStatus.READY
    review = TaskFactory(status=TaskStatus.REVIEW)
    response = api.post(f"/api/tasks/{review.pk}/reopen", {"feedback": NUL})
    assert_refused(response, 400, "invalid_input", "feedback")
    assert Task.objects.get(pk=review.pk).status == TaskStatus.REVIEW


def test_nul_in_the_tag_filter_is_refused(api):
    assert_refused(api.get("/api/tasks", {"tag": NUL}), 400, "invalid_input", "tag")


# -- money -----------------------------------------------------------------------------------------


def test_a_budget_that_rounds_to_zero_is_refused(api):
    body = {"title": "T", "instruction": "I", "limit_cost": "0.00001"}
    error = assert_refused(api.post_form("/api/tasks", body), 400, "invalid_input", "limits")
    assert "0.0001" in error["message"]
    assert not Task.objects.exists()


def test_a_retry_budget_that_rounds_to_zero_is_refused(api):
    task = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_cost", limit_cost="1.00")
    body = {"limits": {"limit_cost": "0.00001"}}
    assert_refused(api.post(f"/api/tasks/{task.pk}/retry", body), 400, "invalid_input", "limits")
    assert Task.objects.get(pk=task.pk).status == TaskStatus.FAILED


def test_an_empty_budget_means_none(api, settings):
    ModelFactory()  # a tested, tool-capable, zero-cost model for a new task
    settings.ACTHELM_LIMIT_COST = "5.00"  # a default budget: empty must not fall back to it
    body = {"title": "T", "instruction": "I", "limit_cost": "", "limit_turns": ""}
    response = api.post_form("/api/tasks", body)
    assert response.status_code == 201, response.content
    task = Task.objects.get()
    assert task.limit_cost is None
    assert task.limit_turns == settings.ACTHELM_LIMIT_TURNS  # an empty whole number: default
    absent = api.post_form("/api/tasks", {"title": "T2", "instruction": "I"})
    assert Task.objects.get(pk=absent.json()["id"]).limit_cost == 5


def test_the_cli_refuses_a_budget_that_rounds_to_zero(manage, transactional_db):
    from tests.factories import UserFactory

    UserFactory(username="ops", is_superuser=True)
    task = TaskFactory(status=TaskStatus.PAUSED)
    result = manage(
        "acthelm_task", "--json", "limits", str(task.pk), "--limit", "limit_cost=0.00001"
    )
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout)["error"] == "invalid_input"
    assert Task.objects.get(pk=task.pk).limit_cost is None


# -- unknown fields --------------------------------------------------------------------------------


def test_an_unknown_form_field_is_refused_by_name(api):
    """Issue 24 item 1: a field the API does not know (`-F modle=demo`) was dropped silently and
    the task ran without it. (`model` itself is a name now: tests/api/test_endpoints.py.)"""
    body = {"title": "T", "instruction": "I", "modle": "demo"}
    error = assert_refused(api.post_form("/api/tasks", body), 422, "unknown_field", "modle")
    assert "modle" in error["message"]
    assert not Task.objects.exists()


def test_files_are_no_unknown_field(api):
    ModelFactory()  # a tested, tool-capable, zero-cost model for a new task
    upload = SimpleUploadedFile("notes.txt", b"hi")
    response = api.post_form("/api/tasks", {"title": "T", "instruction": "I", "files": [upload]})
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    "path_of, body, field",
    [
        (lambda t: "/api/goals", {"title": "G", "colour": "red"}, "colour"),
        (lambda t: f"/api/tasks/{t.pk}/cancel", {"reason": "x", "force": True}, "force"),
        (lambda t: f"/api/tasks/{t.pk}/resume", {"model": "demo"}, "model"),
    ],
)
def test_an_unknown_json_field_is_refused_by_name(api, path_of, body, field):
    task = TaskFactory(status=TaskStatus.READY)
    assert_refused(api.post(path_of(task), body), 422, "unknown_field", field)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.READY
    assert not Goal.objects.exists()


# -- errors the API does not raise itself ----------------------------------------------------------


def test_a_method_the_path_does_not_take_is_a_json_405(api):
    response = api.client.put("/api/goals", headers=api._headers(None))
    error = assert_refused(response, 405, "method_not_allowed", None)
    assert "GET" in error["message"] and response["Allow"]


def test_a_path_the_api_does_not_have_is_a_json_404(api):
    assert_refused(api.get("/api/nothing-here"), 404, "not_found", None)


def test_an_oversized_body_is_a_json_413(api, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    response = api.post("/api/goals", {"title": "G", "description": "x" * 5000})
    assert_refused(response, 413, "body_too_large", None)
    assert not Goal.objects.exists()


def test_a_failure_inside_an_endpoint_is_a_json_500(api, monkeypatch):
    """No real part fails on purpose: the inbox's read is made to raise."""

    def broken(limit):
        raise RuntimeError("the read failed")

    monkeypatch.setattr("acthelm_site.api.endpoints.pending_operations", broken)
    response = api.get("/api/approvals")
    error = assert_refused(response, 500, "server_error", None)
    assert "the read failed" not in error["message"]


# -- paging the transcript and the timeline --------------------------------------------------------


def test_turns_all_is_bounded_and_older_turns_page_back(api):
    run = AgentRunFactory()
    total = task_selectors.TRANSCRIPT_ALL_MAX + 5
    for index in range(total):
        TurnFactory(run=run, task=run.task, index=index, content=f"t{index}")
    data = api.get(f"/api/tasks/{run.task_id}", {"turns": "all"}).json()
    assert len(data["transcript"]) == task_selectors.TRANSCRIPT_ALL_MAX
    assert data["transcript"][-1]["index"] == total - 1
    assert data["earlier_turns"] and data["older_turns"] == 5
    rest = api.get(f"/api/tasks/{run.task_id}", {"turns": "all", "turns_before": 5}).json()
    assert [t["index"] for t in rest["transcript"]] == [0, 1, 2, 3, 4]
    assert rest["earlier_turns"] is False and rest["older_turns"] is None
    recent = api.get(f"/api/tasks/{run.task_id}", {"turns_before": 105}).json()
    assert [t["index"] for t in recent["transcript"]] == list(range(5, 105))


def test_events_older_than_the_newest_200_can_be_read(api):
    task = TaskFactory(status=TaskStatus.DONE)
    first = TaskEventFactory(task=task, kind=EventKind.CREATED)
    TaskEventFactory.create_batch(205, task=task, kind=EventKind.MODEL_TURN)
    data = api.get(f"/api/tasks/{task.pk}").json()
    ids = [e["id"] for e in data["events"]]
    assert len(ids) == task_selectors.TIMELINE_SIZE and first.pk not in ids
    assert data["earlier_events"] and data["older_events"] == ids[0]
    seen = set(ids)
    cursor = data["older_events"]
    while cursor is not None:
        page = api.get(f"/api/tasks/{task.pk}", {"events_before": cursor}).json()
        seen |= {e["id"] for e in page["events"]}
        cursor = page["older_events"]
    assert first.pk in seen and len(seen) == task.events.count()


# -- PATCH /api/tasks/{id}: only what an edit may change ---------------------------------------


@pytest.mark.parametrize(
    "name, value",
    [
        ("priority", 2000000000),
        ("title", 5),
        ("instruction", 5),
        ("tags", 1),
        ("goal", 1),
        ("connection", 1),
        ("model", 1),
        ("tools", None),
        ("tool_policies", None),
        ("status", 1),
        ("claim_count", 0),
    ],
)
def test_an_edit_sets_only_the_limits_inside_limits(api, name, value):
    """`limits` took any of the task's columns: a priority of 2e9 jumped the claim queue and a
    title, a goal or `tools: null` answered 500. Only the limits table's names are limits."""
    task = TaskFactory(status=TaskStatus.FAILED, priority=0)
    before = Task.objects.filter(pk=task.pk).values().get()
    response = api.patch(f"/api/tasks/{task.pk}", {"limits": {name: value}})
    error = assert_refused(response, 422, "unknown_field", f"limits.{name}")
    assert name in error["message"]
    assert Task.objects.filter(pk=task.pk).values().get() == before
    assert not task.events.filter(kind=EventKind.EDITED).exists()


def test_the_limits_of_an_edit_are_still_set(api):
    task = TaskFactory(status=TaskStatus.FAILED, limit_turns=10)
    response = api.patch(
        f"/api/tasks/{task.pk}", {"limits": {"limit_turns": 40, "limit_cost": None}}
    )
    assert response.status_code == 200, response.content
    task.refresh_from_db()
    assert task.limit_turns == 40 and task.limit_cost is None
    assert_refused(
        api.patch(f"/api/tasks/{task.pk}", {"limits": [40]}), 400, "invalid_input", "limits"
    )


@pytest.mark.parametrize("name", ["tools", "tool_policies", "instruction", "acceptance_checks"])
def test_an_edit_field_sent_as_null_is_refused_not_ignored(api, name):
    task = TaskFactory(status=TaskStatus.FAILED)
    error = assert_refused(
        api.patch(f"/api/tasks/{task.pk}", {name: None}), 400, "invalid_input", name
    )
    assert "leave the field out" in error["message"]


def test_an_edit_refuses_a_policy_for_a_tool_the_task_does_not_use(api):
    task = TaskFactory(status=TaskStatus.FAILED, tools=["read_file"])
    response = api.patch(f"/api/tasks/{task.pk}", {"tool_policies": {"fetch_url": "ask"}})
    error = assert_refused(response, 400, "invalid_input", "tool_policies")
    assert "fetch_url" in error["message"]
    assert Task.objects.get(pk=task.pk).tool_policies == {}


@pytest.mark.parametrize("status", [TaskStatus.DONE, TaskStatus.CANCELLED])
def test_a_closed_or_cancelled_task_is_not_edited(api, status):
    task = TaskFactory(status=status)
    response = api.patch(f"/api/tasks/{task.pk}", {"instruction": "Something else"})
    assert_refused(response, 409, "transition_not_allowed", None)
    assert Task.objects.get(pk=task.pk).instruction == task.instruction
