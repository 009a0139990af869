"""Each endpoint: the happy path, bad input (400 naming the field), a task in the wrong state
(409), and for decisions a stale hash (409 stale_decision). Authentication and permissions are
in test_auth.py."""

import pytest

from agents.states import ModelTestStatus, ToolCallStatus
from approvals.models import Approval, ReviewDecision
from approvals.states import ApprovalStatus, ReviewChoice
from core.actors import ActorKind
from tasks.models import Goal, Task
from tasks.states import EventKind, TaskStatus
from tasks.workspace import workspace_dir
from tests.api.conftest import error_of
from tests.console.scenes import (
    FULL_RESULT,
    pending_approval,
    pending_review,
    run_for,
    transcript_task,
)
from tests.factories import GoalFactory, ModelFactory, TaskFactory

pytestmark = pytest.mark.django_db


def status_of(task_id: int) -> str:
    return Task.objects.values_list("status", flat=True).get(pk=task_id)


def assert_error(response, status: int, code: str, field: str | None = None) -> dict:
    assert response.status_code == status, response.content
    data = error_of(response)
    assert data["code"] == code, data
    if field is not None:
        assert data["field"] == field, data
    return data


# --- Listing and showing tasks --------------------------------------------------------------


def test_list_is_newest_first_and_pages_by_keyset(api):
    ids = [TaskFactory(status=TaskStatus.READY).pk for _ in range(5)]
    first = api.get("/api/tasks", {"limit": 2}).json()
    assert [t["id"] for t in first["items"]] == ids[::-1][:2]
    assert first["newer"] is None and first["older"] == ids[3]
    second = api.get("/api/tasks", {"limit": 2, "before": first["older"]}).json()
    assert [t["id"] for t in second["items"]] == [ids[2], ids[1]]
    last = api.get("/api/tasks", {"limit": 2, "before": second["older"]}).json()
    assert [t["id"] for t in last["items"]] == [ids[0]] and last["older"] is None
    back = api.get("/api/tasks", {"limit": 2, "after": second["newer"]}).json()
    assert [t["id"] for t in back["items"]] == ids[::-1][:2]


def test_list_filters_by_status_goal_kind_and_tag(api):
    goal = GoalFactory()
    wanted = TaskFactory(status=TaskStatus.REVIEW, goal=goal, tags=["q3"])
    TaskFactory(status=TaskStatus.REVIEW)
    TaskFactory(status=TaskStatus.READY, goal=goal)
    for params in ({"status": "review", "goal_id": goal.pk}, {"tag": "q3"}):
        rows = api.get("/api/tasks", params).json()["items"]
        assert [t["id"] for t in rows] == [wanted.pk]
        assert rows[0]["actions"] == ["cancel", "close", "reopen"]
    assert len(api.get("/api/tasks", {"kind": "work"}).json()["items"]) == 3


def test_list_leaves_evaluation_tasks_out_unless_asked_and_says_which_is_which(api):
    work = TaskFactory(title="Real work")
    evaluation = TaskFactory(title="[eval 1] files_list", is_evaluation=True)
    [row] = api.get("/api/tasks").json()["items"]
    assert (row["id"], row["is_evaluation"]) == (work.pk, False)
    [row] = api.get("/api/tasks", {"evaluation": "true"}).json()["items"]
    assert (row["id"], row["is_evaluation"]) == (evaluation.pk, True)
    assert api.get(f"/api/tasks/{evaluation.pk}").json()["is_evaluation"] is True


@pytest.mark.parametrize(
    ("params", "field"),
    [({"status": "finished"}, "status"), ({"limit": 0}, "limit"), ({"before": "x"}, "before")],
)
def test_list_rejects_bad_filters(api, params, field):
    assert_error(api.get("/api/tasks", params), 400, "invalid_input", field)


def test_show_has_the_transcript_runs_timeline_and_pending_operations(api):
    task = transcript_task(status=TaskStatus.REVIEW)
    data = api.get(f"/api/tasks/{task.pk}").json()
    assert data["status"] == "review" and data["actions"] == ["cancel", "close", "reopen"]
    assert [r["verdict"] for r in data["runs"]] == ["approved"]
    turns = data["transcript"]
    assert turns[0]["role"] == "user" and any(t["discarded"] for t in turns)
    calls = [c for t in turns for c in t["tool_calls"]]
    read = next(c for c in calls if c["tool"] == "read_file")
    assert read["result_truncated"] and read["result_chars"] == len(FULL_RESULT)
    assert len(read["result"]) == 4000 and read["compacted"]
    assert data["plan"]["steps"] and data["usage"]["model_turns"] == 4
    assert [a["name"] for a in data["artifacts"]] == ["summary.md"]
    assert [e["kind"] for e in data["events"]] == ["created", "claimed", "submitted"]
    assert data["pending_approvals"] == [] and data["earlier_turns"] is False
    whole = api.get(f"/api/tasks/{task.pk}/calls/{read['id']}/result")
    assert whole.status_code == 200 and whole.json() == FULL_RESULT


def test_show_lists_pending_operations_with_their_hashes(api):
    approval = pending_approval()
    data = api.get(f"/api/tasks/{approval.task_id}").json()
    [pending] = data["pending_approvals"]
    assert pending["id"] == approval.pk and pending["arguments_hash"] == approval.arguments_hash
    assert pending["target"] == approval.target and pending["arguments"] == approval.arguments
    decision = pending_review()
    [review] = api.get(f"/api/tasks/{decision.task_id}").json()["pending_reviews"]
    assert review["arguments_hash"] == decision.tool_call.arguments_hash
    inbox = api.get("/api/approvals").json()
    assert [a["id"] for a in inbox["approvals"]] == [approval.pk]
    assert [r["id"] for r in inbox["reviews"]] == [decision.pk]


def test_show_of_an_unknown_task_is_404(api):
    assert_error(api.get("/api/tasks/999999"), 404, "task_not_found")
    assert_error(api.get("/api/tasks/999999/calls/1/result"), 404, "not_found")


def test_show_caps_the_transcript_unless_all_turns_are_asked_for(api):
    task = transcript_task(extra_turns=100)
    recent = api.get(f"/api/tasks/{task.pk}").json()
    assert len(recent["transcript"]) == 100 and recent["earlier_turns"]
    every = api.get(f"/api/tasks/{task.pk}", {"turns": "all"}).json()
    assert len(every["transcript"]) == task.turns.count() and not every["earlier_turns"]


# --- Creating a task ------------------------------------------------------------------------


def test_create_with_input_files_and_choices(api):
    from django.core.files.uploadedfile import SimpleUploadedFile

    model = ModelFactory()
    goal = GoalFactory()
    response = api.post_form(
        "/api/tasks",
        {
            "title": "Summarise",
            "instruction": "Summarise notes.txt",
            "goal_id": goal.pk,
            "tools": ["update_plan", "read_file", "fetch_url"],
            "ask_tools": ["fetch_url"],
            "allowed_domains": ["Example.org."],
            "model_id": model.pk,
            "tags": ["q3"],
            "limit_turns": 7,
            "files": [
                SimpleUploadedFile("notes.txt", b"hello"),
                SimpleUploadedFile("data.csv", b"a,b\n1,2\n"),
            ],
        },
    )
    assert response.status_code == 201, response.content
    data = response.json()
    task = Task.objects.get(pk=data["id"])
    assert data["status"] == "ready" and data["limits"]["turns"] == 7
    assert task.tools == ["update_plan", "read_file", "fetch_url"]
    assert task.tool_policies == {"fetch_url": "ask"} and task.allowed_domains == ["example.org"]
    assert task.model == model and task.connection == model.connection and task.goal == goal
    assert (workspace_dir(task.pk) / "notes.txt").read_bytes() == b"hello"
    assert (workspace_dir(task.pk) / "data.csv").exists()
    event = task.events.get()
    assert event.kind == EventKind.CREATED and event.actor_kind == ActorKind.PERSON
    assert event.actor_label == "founder"


def test_create_with_tools_empty_makes_a_task_without_tools_on_a_model_cli(api, settings):
    """`tools=` (an empty list, as form fields send one) is a task without tools, which may run
    on a tested model CLI; leaving `tools` out is the default tools (issue 32)."""
    from tests.factories import ConnectionFactory

    cli = ModelFactory(
        connection=ConnectionFactory(kind="cli", command=["llm"], base_url=""),
        supports_tools=False,
    )
    form = {"title": "T", "instruction": "I"}
    response = api.post_form("/api/tasks", {**form, "tools": ""})
    assert response.status_code == 201, response.content
    data = response.json()
    assert (data["tools"], data["model"]) == ([], cli.name)
    task = Task.objects.get(pk=data["id"])
    assert (task.tools, task.model) == ([], cli)
    # Without the field: the default tools, which the model CLI cannot run.
    assert settings.ACTHELM_DEFAULT_TOOLS
    assert_error(api.post_form("/api/tasks", form), 400, "no_usable_model", "model")
    # No tools, and ask for one: refused naming the field.
    refused = api.post_form("/api/tasks", {**form, "tools": "", "ask_tools": ["fetch_url"]})
    assert_error(refused, 400, "invalid_input", "ask_tools")
    assert Task.objects.count() == 1


def test_create_waits_for_dependencies(api):
    ModelFactory()  # the default model a new task runs on
    dep = TaskFactory(status=TaskStatus.READY)
    response = api.post_form(
        "/api/tasks", {"title": "After", "instruction": "Then", "depends_on": [dep.pk]}
    )
    assert response.status_code == 201 and response.json()["status"] == "blocked"
    assert response.json()["depends_on"] == [dep.pk]


@pytest.mark.parametrize(
    ("data", "field"),
    [
        ({"instruction": "I"}, "title"),
        ({"title": "T"}, "instruction"),
        ({"title": "x" * 201, "instruction": "I"}, "title"),
        ({"title": "T", "instruction": "I", "limit_turns": 0}, "limit_turns"),
        ({"title": "T", "instruction": "I", "tools": ["rm_rf"]}, "tools"),
        (
            {"title": "T", "instruction": "I", "tools": ["read_file"], "ask_tools": ["fetch_url"]},
            "ask_tools",
        ),
        ({"title": "T", "instruction": "I", "goal_id": 999999}, "goal_id"),
        ({"title": "T", "instruction": "I", "model_id": 999999}, "model_id"),
        ({"title": "T", "instruction": "I", "connection_id": 999999}, "connection_id"),
        ({"title": "T", "instruction": "I", "depends_on": [999999]}, "depends_on"),
        ({"title": "T", "instruction": "I", "kind": "chore"}, "kind"),
    ],
)
def test_create_rejects_bad_input_naming_the_field(api, data, field):
    assert_error(api.post_form("/api/tasks", data), 400, "invalid_input", field)
    assert not Task.objects.exists()


def test_create_says_it_takes_form_fields_when_sent_json(api):
    data = assert_error(
        api.post("/api/tasks", {"title": "T", "instruction": "I"}), 400, "invalid_input"
    )
    assert "form fields" in data["message"] and data["field"] == "title"
    assert not Task.objects.exists()


def test_create_takes_the_connection_and_the_model_by_name(api):
    from tests.factories import ConnectionFactory

    model = ModelFactory(connection=ConnectionFactory(name="local"), name="qwen3:8b")
    ModelFactory(connection=ConnectionFactory(name="other"), name="qwen3:8b")
    form = {"title": "T", "instruction": "I"}
    made = api.post_form("/api/tasks", {**form, "connection": "local", "model": "qwen3:8b"})
    assert made.status_code == 201, made.content
    assert (made.json()["connection"], made.json()["model"]) == ("local", "qwen3:8b")
    made = api.post_form("/api/tasks", {**form, "model": "local/qwen3:8b"})
    assert made.status_code == 201 and Task.objects.get(pk=made.json()["id"]).model == model
    ambiguous = api.post_form("/api/tasks", {**form, "model": "qwen3:8b"})
    assert_error(ambiguous, 400, "invalid_input", "model")
    unknown = api.post_form("/api/tasks", {**form, "connection": "nope"})
    assert_error(unknown, 400, "invalid_input", "connection")
    assert Task.objects.count() == 2


def test_create_without_a_model_runs_on_the_default_one_or_is_refused(api):
    form = {"title": "T", "instruction": "I"}
    untested = ModelFactory(test_status=ModelTestStatus.UNTESTED)
    assert_error(api.post_form("/api/tasks", form), 400, "no_usable_model", "model")
    chosen = {**form, "model_id": untested.pk}
    assert_error(api.post_form("/api/tasks", chosen), 400, "model_untested", "model")
    assert not Task.objects.exists()
    default = ModelFactory()
    made = api.post_form("/api/tasks", form)
    assert made.status_code == 201 and made.json()["model"] == default.name


def test_create_rejects_an_unsafe_file_name_and_keeps_nothing(api, settings):
    from django.core.files.uploadedfile import SimpleUploadedFile

    ModelFactory()  # the default model a new task runs on
    data = {
        "title": "T",
        "instruction": "I",
        "files": [SimpleUploadedFile("../../etc/passwd", b"x")],
    }
    response = api.post_form("/api/tasks", data)
    # Django keeps only the base name of an upload ("passwd"), which is a fine name; a name
    # that stays unsafe after that is refused.
    assert response.status_code == 201
    bad = {"title": "T", "instruction": "I", "files": [SimpleUploadedFile(".hidden", b"x")]}
    assert_error(api.post_form("/api/tasks", bad), 400, "invalid_input", "files")
    assert Task.objects.count() == 1
    tasks_dir = settings.ACTHELM_MEDIA_ROOT / "tasks"
    assert sorted(p.name for p in tasks_dir.iterdir()) == [str(response.json()["id"])]


# --- Actions on a task ----------------------------------------------------------------------


def test_pause_a_ready_task(api):
    task = TaskFactory(status=TaskStatus.READY)
    response = api.post(f"/api/tasks/{task.pk}/pause")
    assert response.status_code == 200 and response.json()["status"] == "paused"
    assert response.json()["actions"] == ["cancel", "resume"]


def test_pause_a_running_task_requests_it(api):
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    assert api.post(f"/api/tasks/{task.pk}/pause").json()["status"] == "pause_requested"
    response = api.post(f"/api/tasks/{task.pk}/withdraw-pause")
    assert response.status_code == 200 and response.json()["status"] == "in_progress"


def test_resume_on_another_model_checks_it_first(api):
    task = TaskFactory(status=TaskStatus.PAUSED)
    untested = ModelFactory(test_status=ModelTestStatus.FAILED)
    check = api.get(f"/api/tasks/{task.pk}/model-check", {"model_id": untested.pk}).json()
    assert check["ok"] is False and "has not passed its test" in check["problems"][0]
    refused = api.post(f"/api/tasks/{task.pk}/resume", {"model_id": untested.pk})
    assert_error(refused, 409, "model_check_failed")
    assert status_of(task.pk) == TaskStatus.PAUSED
    good = ModelFactory()
    response = api.post(f"/api/tasks/{task.pk}/resume", {"model_id": good.pk})
    assert response.status_code == 200 and response.json()["model"] == good.name
    assert status_of(task.pk) == TaskStatus.READY


def test_resume_without_a_body(api):
    task = TaskFactory(status=TaskStatus.PAUSED)
    assert api.post(f"/api/tasks/{task.pk}/resume").json()["status"] == "ready"


def test_cancel_records_the_reason(api):
    task = TaskFactory(status=TaskStatus.READY)
    response = api.post(f"/api/tasks/{task.pk}/cancel", {"reason": "not needed"})
    assert response.json()["status"] == "cancelled"
    assert task.events.get(kind=EventKind.CANCELLED).data["reason"] == "not needed"


def test_close_and_reopen(api):
    closing, reopening = TaskFactory(status=TaskStatus.REVIEW), TaskFactory(status="review")
    assert api.post(f"/api/tasks/{closing.pk}/close").json()["status"] == "done"
    response = api.post(f"/api/tasks/{reopening.pk}/reopen", {"feedback": "cite the notes"})
    assert response.json()["status"] == "ready" and response.json()["feedback"] == "cite the notes"


def test_retry_after_a_limit_raises_it_in_the_same_call(api):
    task = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps", limit_turns=4)
    run_for(task, model_turns=4)
    assert_error(api.post(f"/api/tasks/{task.pk}/retry"), 409, "limit_not_raised")
    same = api.post(f"/api/tasks/{task.pk}/retry", {"limits": {"limit_turns": 4}})
    assert_error(same, 409, "limit_not_raised")
    assert not task.events.filter(kind=EventKind.LIMITS_CHANGED).exists()
    response = api.post(f"/api/tasks/{task.pk}/retry", {"limits": {"limit_turns": 10}})
    assert response.status_code == 200 and response.json()["limits"]["turns"] == 10
    assert response.json()["status"] == "ready"
    kinds = list(task.events.order_by("id").values_list("kind", flat=True))
    assert kinds[-2:] == [EventKind.LIMITS_CHANGED, EventKind.RETRIED]


def test_the_mcp_call_limit_and_the_money_budget_are_set_shown_and_raised(api):
    from decimal import Decimal

    from tests.factories import TurnFactory

    ModelFactory()  # the default model a new task runs on
    response = api.post_form(
        "/api/tasks",
        {"title": "Budget", "instruction": "Do it", "limit_mcp_calls": 5, "limit_cost": "0.01"},
    )
    assert response.status_code == 201, response.content
    assert response.json()["limits"]["mcp_calls"] == 5
    assert response.json()["limits"]["cost"] == "0.0100"
    bad = api.post_form("/api/tasks", {"title": "B", "instruction": "I", "limit_cost": "-1"})
    assert_error(bad, 400, "invalid_input", "limit_cost")
    task = Task.objects.get(pk=response.json()["id"])
    run = run_for(task)
    TurnFactory(task=task, run=run, index=1, cost=Decimal("0.02"))
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.FAILED, failure_code="limit_cost")
    assert_error(api.post(f"/api/tasks/{task.pk}/retry"), 409, "limit_not_raised")
    raised = api.post(f"/api/tasks/{task.pk}/retry", {"limits": {"limit_cost": "0.5"}})
    assert raised.status_code == 200, raised.content
    assert raised.json()["limits"]["cost"] == "0.5000" and raised.json()["status"] == "ready"


def test_a_refused_retry_leaves_the_limit_unchanged(api):
    task = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps", limit_turns=4)
    run_for(task, model_turns=4)
    untested = ModelFactory(test_status=ModelTestStatus.FAILED)
    body = {"limits": {"limit_turns": 10}, "model_id": untested.pk}
    assert_error(api.post(f"/api/tasks/{task.pk}/retry", body), 409, "model_check_failed")
    task.refresh_from_db()
    assert task.limit_turns == 4 and task.status == TaskStatus.FAILED


def test_delete_removes_the_task_and_its_files(api):
    task = TaskFactory(status=TaskStatus.CANCELLED)
    (workspace_dir(task.pk) / "notes.txt").write_text("x")
    response = api.delete(f"/api/tasks/{task.pk}")
    assert response.status_code == 200 and response.json() == {"deleted": task.pk}
    assert not Task.objects.filter(pk=task.pk).exists()
    assert not workspace_dir(task.pk, create=False).exists()


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("reopen", {}, "feedback"),
        ("reopen", {"feedback": ""}, "feedback"),
        ("retry", {"limits": {"limit_turns": -1}}, "limits.limit_turns"),
        ("retry", {"limits": {"limit_moons": 3}}, "limits"),
        ("retry", {"model_id": 999999}, "model_id"),
        ("resume", {"model_id": 999999}, "model_id"),
        ("resume", {"model_id": "a"}, "model_id"),
        ("cancel", {"reason": ["no"]}, "reason"),
    ],
)
def test_actions_reject_bad_input_naming_the_field(api, path, body, field):
    state = {"reopen": "review", "retry": "failed", "resume": "paused", "cancel": "ready"}[path]
    task = TaskFactory(status=state)
    assert_error(api.post(f"/api/tasks/{task.pk}/{path}", body), 400, "invalid_input", field)
    assert status_of(task.pk) == state


def test_model_check_rejects_an_unknown_model(api):
    task = TaskFactory(status=TaskStatus.PAUSED)
    response = api.get(f"/api/tasks/{task.pk}/model-check", {"model_id": 999999})
    assert_error(response, 400, "invalid_input", "model_id")
    assert_error(api.get(f"/api/tasks/{task.pk}/model-check"), 400, "invalid_input", "model_id")


# Each action on a task in a state that does not allow it: 409, nothing changed.
WRONG_STATE = [
    ("post", "pause", None, TaskStatus.DONE),
    ("post", "withdraw-pause", None, TaskStatus.READY),
    ("post", "resume", {}, TaskStatus.READY),
    ("post", "cancel", {}, TaskStatus.DONE),
    ("post", "close", None, TaskStatus.READY),
    ("post", "reopen", {"feedback": "again"}, TaskStatus.FAILED),
    ("post", "retry", {}, TaskStatus.REVIEW),
    ("delete", "", None, TaskStatus.READY),
]


@pytest.mark.parametrize(("method", "path", "body", "state"), WRONG_STATE)
def test_an_action_in_the_wrong_state_is_409(api, method, path, body, state):
    task = TaskFactory(status=state)
    url = f"/api/tasks/{task.pk}/{path}".rstrip("/")
    response = api.delete(url) if method == "delete" else api.post(url, body)
    data = assert_error(response, 409, "transition_not_allowed")
    assert state in data["message"] and data["field"] is None
    assert status_of(task.pk) == state


def test_an_action_on_an_unknown_task_is_404(api):
    assert_error(api.post("/api/tasks/999999/pause"), 404, "task_not_found")


# --- Decisions, bound to the operation's hash ------------------------------------------------


@pytest.mark.parametrize("verb", ["approve", "deny"])
def test_approve_or_deny_with_the_hash(api, verb):
    approval = pending_approval()
    url = f"/api/tasks/{approval.task_id}/approvals/{approval.pk}/{verb}"
    response = api.post(url, {"arguments_hash": approval.arguments_hash})
    assert response.status_code == 200 and response.json()["status"] == "ready"
    approval.refresh_from_db()
    assert approval.status == (
        ApprovalStatus.APPROVED if verb == "approve" else ApprovalStatus.DENIED
    )
    assert approval.decided_by == api.user


@pytest.mark.parametrize("verb", ["approve", "deny"])
def test_a_stale_hash_is_409_and_changes_nothing(api, verb):
    approval = pending_approval()
    url = f"/api/tasks/{approval.task_id}/approvals/{approval.pk}/{verb}"
    data = assert_error(api.post(url, {"arguments_hash": "0" * 64}), 409, "stale_decision")
    assert "hash" in data["message"]
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert approval.tool_call.status == ToolCallStatus.AWAITING_APPROVAL
    assert status_of(approval.task_id) == TaskStatus.AWAITING_APPROVAL


def test_deciding_twice_is_409_stale(api):
    approval = pending_approval()
    url = f"/api/tasks/{approval.task_id}/approvals/{approval.pk}/approve"
    assert api.post(url, {"arguments_hash": approval.arguments_hash}).status_code == 200
    assert_error(api.post(url, {"arguments_hash": approval.arguments_hash}), 409, "stale_decision")


@pytest.mark.parametrize("verb", ["run-again", "skip"])
def test_run_again_or_skip_with_the_hash(api, verb):
    decision = pending_review()
    url = f"/api/tasks/{decision.task_id}/reviews/{decision.pk}/{verb}"
    stale = api.post(url, {"arguments_hash": "f" * 64})
    assert_error(stale, 409, "stale_decision")
    assert ReviewDecision.objects.get(pk=decision.pk).choice == ReviewChoice.PENDING
    response = api.post(url, {"arguments_hash": decision.tool_call.arguments_hash})
    assert response.status_code == 200 and response.json()["status"] == "ready"
    decision.refresh_from_db()
    assert decision.choice == (ReviewChoice.RUN_AGAIN if verb == "run-again" else "skip")


@pytest.mark.parametrize("body", [{}, {"arguments_hash": ""}, {"arguments_hash": 5}])
def test_a_decision_needs_the_hash(api, body):
    approval = pending_approval()
    url = f"/api/tasks/{approval.task_id}/approvals/{approval.pk}/approve"
    assert_error(api.post(url, body), 400, "invalid_input", "arguments_hash")
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_a_decision_on_another_tasks_operation_is_404(api):
    approval = pending_approval()
    other = TaskFactory(status=TaskStatus.AWAITING_APPROVAL)
    url = f"/api/tasks/{other.pk}/approvals/{approval.pk}/approve"
    assert_error(api.post(url, {"arguments_hash": approval.arguments_hash}), 404, "not_found")
    decision = pending_review()
    url = f"/api/tasks/{other.pk}/reviews/{decision.pk}/skip"
    assert_error(api.post(url, {"arguments_hash": "x"}), 404, "not_found")
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_a_decision_when_the_task_moved_on_is_409(api):
    """The task was cancelled meanwhile: the operation's approval is refused as stale."""
    approval = pending_approval()
    Task.objects.filter(pk=approval.task_id).update(status=TaskStatus.CANCELLED)
    url = f"/api/tasks/{approval.task_id}/approvals/{approval.pk}/approve"
    data = assert_error(
        api.post(url, {"arguments_hash": approval.arguments_hash}), 409, "stale_decision"
    )
    assert "cancelled" in data["message"]


# --- Connections, scorecard -----------------------------------------------------------------


def test_connections_list_their_models_and_no_secret(api):
    model = ModelFactory(connection__credential_env="OPENAI_API_KEY")
    model.connection.base_url = "https://user:pw@api.example.com/v1?key=abc"
    model.connection.save()
    [conn] = api.get("/api/connections").json()
    assert conn["name"] == model.connection.name and conn["credential_env"] == "OPENAI_API_KEY"
    assert conn["base_url"] == "https://…@api.example.com/v1"
    assert [m["id"] for m in conn["models"]] == [model.pk]


def test_testing_a_connection_makes_a_real_request(api):
    from tests.factories import ConnectionFactory
    from tests.fakes.model_server import ScriptedModelServer, reply_text

    with ScriptedModelServer(flavor="openai", context_length=65536) as server:
        server.enqueue(reply_text("OK"))
        conn = ConnectionFactory(base_url=server.url)
        ModelFactory(
            connection=conn,
            name="test-model",
            supports_tools=False,
            test_status=ModelTestStatus.UNTESTED,
        )
        response = api.post(f"/api/connections/{conn.pk}/test", {})
        assert server.completion_requests
    assert response.status_code == 200
    [result] = response.json()
    assert result["model"] == "test-model" and result["ok"] and result["context_window"] == 65536
    assert result["streams"] is True  # the scripted server streams
    [listed] = api.get("/api/connections").json()
    assert listed["models"][0]["streams"] is True


def test_testing_an_unknown_connection_or_model(api):
    from tests.factories import ConnectionFactory

    assert_error(api.post("/api/connections/999999/test", {}), 404, "connection_not_found")
    conn = ConnectionFactory()
    assert_error(
        api.post(f"/api/connections/{conn.pk}/test", {"model": "nope"}),
        400,
        "invalid_input",
        "model",
    )


def test_scorecard(api):
    data = api.get("/api/scorecard", {"period": "day"}).json()
    assert data["period"] == "last day" and "totals" in data and data["models"] == []
    assert api.get("/api/scorecard", {"since": "2025-01-31"}).json()["period"] == (
        "since 2025-01-31"
    )
    assert_error(api.get("/api/scorecard", {"period": "year"}), 400, "invalid_input", "period")
    assert_error(api.get("/api/scorecard", {"since": "soon"}), 400, "invalid_input", "since")


# --- Goals ----------------------------------------------------------------------------------


def test_goals_create_list_show_and_deactivate(api):
    response = api.post("/api/goals", {"title": " Ship Q3 ", "description": "All of it"})
    assert response.status_code == 201
    goal = response.json()
    assert goal["title"] == "Ship Q3" and goal["active"] and goal["created_by"] == "founder"
    task = TaskFactory(goal_id=goal["id"], status=TaskStatus.REVIEW)
    TaskFactory(goal_id=goal["id"], status=TaskStatus.DONE)
    assert [g["id"] for g in api.get("/api/goals").json()] == [goal["id"]]
    shown = api.get(f"/api/goals/{goal['id']}").json()
    assert shown["task_counts"] == {"review": 1, "done": 1} and shown["open_tasks"] == 1
    assert shown["tasks"][1]["id"] == task.pk
    done = api.post(f"/api/goals/{goal['id']}/deactivate")
    assert done.status_code == 200 and done.json()["active"] is False
    assert api.get("/api/goals", {"active": True}).json() == []
    assert status_of(task.pk) == TaskStatus.REVIEW  # its tasks keep their states
    again = api.post(f"/api/goals/{goal['id']}/deactivate")
    assert_error(again, 409, "transition_not_allowed")


@pytest.mark.parametrize(
    ("body", "field"), [({}, "title"), ({"title": "  "}, "title"), ({"title": "x" * 201}, "title")]
)
def test_goal_create_rejects_bad_input(api, body, field):
    assert_error(api.post("/api/goals", body), 400, "invalid_input", field)
    assert not Goal.objects.exists()


def test_unknown_goal_is_404(api):
    assert_error(api.get("/api/goals/999999"), 404, "goal_not_found")
    assert_error(api.post("/api/goals/999999/deactivate"), 404, "goal_not_found")


@pytest.mark.parametrize(
    ("path", "params", "field"),
    [
        ("/api/approvals", {"limit": 0}, "limit"),
        ("/api/approvals", {"limit": 1000}, "limit"),
        ("/api/goals", {"active": "perhaps"}, "active"),
        ("/api/tasks/1", {"turns": "some"}, "turns"),
    ],
)
def test_reads_reject_bad_parameters(api, path, params, field):
    assert_error(api.get(path, params), 400, "invalid_input", field)


def test_a_body_that_is_not_json_is_400(api):
    task = TaskFactory(status=TaskStatus.REVIEW)
    response = api.client.post(
        f"/api/tasks/{task.pk}/reopen",
        "{not json",
        content_type="application/json",
        headers={"Authorization": f"Bearer {api.token}"},
    )
    assert_error(response, 400, "invalid_input")
    assert status_of(task.pk) == TaskStatus.REVIEW


# --- Downloads: artifacts and input files (issue 24) -----------------------------------------


def _with_files(task, artifacts: dict[str, tuple[str, bytes]], inputs: dict[str, bytes]):
    from tasks.workspace import add_input_file, artifacts_dir
    from tests.factories import ArtifactFactory

    for name, (content_type, data) in artifacts.items():
        (artifacts_dir(task.pk) / name).write_bytes(data)
        ArtifactFactory(task=task, name=name, size=len(data), content_type=content_type)
    for name, data in inputs.items():
        add_input_file(task.pk, name=name, data=data)


def test_artifacts_and_input_files_download_as_attachments(api):
    task = TaskFactory(status=TaskStatus.REVIEW)
    _with_files(
        task,
        {"report.md": ("text/markdown", b"# Report\n"), "page.html": ("text/html", b"<script>")},
        {"notes.txt": b"hello", "data.bin": b"\x00\x01"},
    )
    got = api.get(f"/api/tasks/{task.pk}/artifacts/report.md")
    assert got.status_code == 200 and b"".join(got.streaming_content) == b"# Report\n"
    assert got["Content-Disposition"].startswith('attachment; filename="report.md"')
    assert got["Content-Type"] == "text/markdown; charset=utf-8"
    assert got["X-Content-Type-Options"] == "nosniff"
    html = api.get(f"/api/tasks/{task.pk}/artifacts/page.html")
    assert html["Content-Type"] == "text/plain; charset=utf-8"  # never run as a page
    notes = api.get(f"/api/tasks/{task.pk}/files/notes.txt")
    assert notes.status_code == 200 and b"".join(notes.streaming_content) == b"hello"
    binary = api.get(f"/api/tasks/{task.pk}/files/data.bin")
    assert binary["Content-Type"] == "application/octet-stream"


@pytest.mark.parametrize(
    "path",
    [
        "artifacts/notes.txt",  # an input file is not an artifact
        "files/report.md",  # nor the other way round
        "artifacts/nope.md",
        "files/.hidden",
        "files/..",
    ],
)
def test_a_file_the_task_does_not_have_is_404(api, path):
    task = TaskFactory(status=TaskStatus.REVIEW)
    _with_files(task, {"report.md": ("text/markdown", b"x")}, {"notes.txt": b"y"})
    assert_error(api.get(f"/api/tasks/{task.pk}/{path}"), 404, "not_found")
    # A name with a slash matches no route at all.
    assert api.get(f"/api/tasks/{task.pk}/files/..%2F..%2Fmanage.py").status_code == 404


def test_downloads_need_the_view_permission_and_an_existing_task(api):
    from tests.api.conftest import client_for

    task = TaskFactory(status=TaskStatus.REVIEW)
    _with_files(task, {"report.md": ("text/markdown", b"x")}, {})
    stranger = client_for("stranger", [])
    assert_error(
        stranger.get(f"/api/tasks/{task.pk}/artifacts/report.md"), 403, "permission_denied"
    )
    assert_error(api.get("/api/tasks/999999/artifacts/report.md"), 404, "task_not_found")
