"""The console's task pages: list, new task, the live task page, its actions and downloads."""

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from agents.models import Artifact
from agents.states import ModelTestStatus
from tasks.models import Task
from tasks.states import EventKind, TaskStatus
from tasks.workspace import artifacts_dir, workspace_dir
from tests.console.scenes import (
    FULL_RESULT,
    NOTES,
    pending_approval,
    pending_review,
    run_for,
    transcript_task,
)
from tests.factories import ModelFactory, TaskEventFactory, TaskFactory, UserFactory

pytestmark = pytest.mark.django_db

ALL_PERMS = [
    "tasks.view_task",
    "tasks.add_task",
    "tasks.close_task",
    "tasks.operate_task",
    "approvals.decide_approval",
    "agents.manage_connections",
]


@pytest.fixture
def founder(db):
    return UserFactory(username="boss", perms=ALL_PERMS)


@pytest.fixture
def viewer(db):
    return UserFactory(username="onlooker", perms=["tasks.view_task"])


@pytest.fixture
def boss(client, founder):
    client.force_login(founder)
    return client


def detail(task) -> str:
    return reverse("tasks:detail", args=[task.pk])


def action(name: str, task) -> str:
    return reverse(f"tasks:{name}", args=[task.pk])


def status_of(task) -> str:
    return Task.objects.values_list("status", flat=True).get(pk=task.pk)


def count_queries(client, url, **extra) -> int:
    with CaptureQueriesContext(connection) as ctx:
        response = client.get(url, **extra)
    assert response.status_code == 200
    return len(ctx.captured_queries)


HTMX = {"HTTP_HX_REQUEST": "true"}


# --- Login and permissions ------------------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "/",
        "/tasks/new/",
        "/tasks/1/",
        "/tasks/1/calls/1/result/",
        "/tasks/1/artifacts/1/",
        "/tasks/1/model-check/",
        "/approvals/",
        "/connections/",
    ],
)
def test_every_page_requires_login(client, url):
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith("/admin/login/?next=")


def test_a_poll_after_the_session_ended_sends_the_page_to_the_login(client):
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    response = client.get(detail(task), HTTP_HX_REQUEST="true", HTTP_HX_CURRENT_URL=detail(task))
    assert response.status_code == 200 and "<html" not in response.content.decode()
    assert response["HX-Redirect"] == f"/admin/login/?next=/tasks/{task.pk}/"


@pytest.mark.parametrize("name", ["pause", "cancel", "close", "reopen", "retry", "resume"])
def test_every_action_requires_login(client, name):
    task = TaskFactory(status=TaskStatus.REVIEW)
    response = client.post(action(name, task))
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    assert status_of(task) == TaskStatus.REVIEW


def test_pages_need_the_view_permission(client):
    client.force_login(UserFactory(username="nobody", perms=[]))
    task = TaskFactory()
    assert client.get("/").status_code == 403
    assert client.get(detail(task)).status_code == 403


def test_new_task_needs_the_add_permission(client, viewer):
    client.force_login(viewer)
    assert client.get("/tasks/new/").status_code == 403
    response = client.post("/tasks/new/", {"title": "T", "instruction": "I"})
    assert response.status_code == 403
    assert not Task.objects.exists()
    assert b"New task" not in client.get("/").content


def test_actions_are_post_only(boss):
    task = TaskFactory(status=TaskStatus.REVIEW)
    assert boss.get(action("close", task)).status_code == 405
    assert status_of(task) == TaskStatus.REVIEW


# --- The task list --------------------------------------------------------------------------


def test_task_list_links_filters_and_escapes(boss):
    review = TaskFactory(title="<img src=x onerror=alert(1)>", status=TaskStatus.REVIEW)
    ready = TaskFactory(title="Ready one", status=TaskStatus.READY)
    page = boss.get("/").content.decode()
    assert detail(review) in page and detail(ready) in page
    assert "<img src=x" not in page and "&lt;img src=x" in page
    page = boss.get("/", {"status": "review"}).content.decode()
    assert detail(review) in page and detail(ready) not in page
    # An unknown status is ignored rather than an error.
    assert boss.get("/", {"status": "nonsense"}).status_code == 200


def test_task_list_pages_by_keyset(boss):
    tasks = [TaskFactory() for _ in range(55)]
    first = boss.get("/").content.decode()
    ids = [int(x) for x in re.findall(r'href="/tasks/(\d+)/"', first)]
    newest_50 = [t.pk for t in reversed(tasks)][:50]
    assert sorted(set(ids), reverse=True) == newest_50
    match = re.search(r'href="\?before=(\d+)"', first)
    assert match and int(match.group(1)) == newest_50[-1]
    assert "after=" not in first
    second = boss.get("/", {"before": match.group(1)}).content.decode()
    ids = {int(x) for x in re.findall(r'href="/tasks/(\d+)/"', second)}
    assert ids == {t.pk for t in tasks[:5]}
    assert 'href="?before=' not in second
    back = re.search(r'href="\?after=(\d+)"', second)
    assert back
    again = boss.get("/", {"after": back.group(1)}).content.decode()
    assert {int(x) for x in re.findall(r'href="/tasks/(\d+)/"', again)} == set(newest_50)


def test_task_list_query_count_does_not_grow(boss):
    TaskFactory(model=ModelFactory())
    few = count_queries(boss, "/")
    for _ in range(30):
        TaskFactory(model=ModelFactory())
    assert count_queries(boss, "/") == few
    assert count_queries(boss, "/", data={"status": "ready"}) == few
    assert few <= 10  # the filter form's goals and models: one query each


def test_task_list_makes_no_count_over_the_table(boss):
    TaskFactory()
    with CaptureQueriesContext(connection) as ctx:
        boss.get("/")
    # Queries over the task table. The page is keyset-paginated (no COUNT for it); the counts the
    # page shows (the nav's, the status filters') count rows of named states only, never the
    # table (done and cancelled, which only grow, are not counted).
    task_queries = [q["sql"] for q in ctx.captured_queries if 'FROM "tasks_task"' in q["sql"]]
    listing = [sql for sql in task_queries if "COUNT(" not in sql.upper()]
    assert listing and all("LIMIT 51" in sql for sql in listing)
    counts = [sql for sql in task_queries if "COUNT(" in sql.upper()]
    assert counts and all('"status" IN' in sql or '"status" =' in sql for sql in counts)
    assert not any("'done'" in sql or "'cancelled'" in sql for sql in counts)


# --- Creating a task ------------------------------------------------------------------------


def test_new_task_form_offers_every_registered_tool(boss):
    from agents.catalogue.tools import tool_names

    page = boss.get("/tasks/new/").content.decode()
    for name in tool_names():
        assert f'value="{name}"' in page


def test_create_a_task_with_tools_policies_domains_model_and_files(boss, founder):
    model = ModelFactory()
    response = boss.post(
        "/tasks/new/",
        {
            "title": "Check the feed",
            "instruction": "Fetch the feed and summarise it.",
            "priority": "3",
            "tools": ["update_plan", "fetch_url", "read_file"],
            "ask_tools": ["fetch_url"],
            "allowed_domains": "Example.org, data.example.com\nexample.org",
            "model": str(model.pk),
            "tags": "feeds, weekly",
            "limit_turns": "12",
            "limit_runtime_seconds": "900",
            "limit_output_tokens": "16000",
            "limit_token_budget": "600000",
            "limit_tool_output_chars": "24000",
            "limit_network_requests": "8",
            "limit_artifact_bytes": "1048576",
            "files": [_upload("notes.txt", b"hello"), _upload("data.csv", b"a,b\n1,2\n")],
        },
    )
    task = Task.objects.get()
    assert response.status_code == 302 and response["Location"] == detail(task)
    assert task.status == TaskStatus.READY and task.created_by == founder
    assert task.tools == ["update_plan", "fetch_url", "read_file"]
    assert task.tool_policies == {"fetch_url": "ask"}
    assert task.allowed_domains == ["data.example.com", "example.org"]
    assert task.model == model and task.connection == model.connection
    assert task.limit_turns == 12 and task.priority == 3 and task.tags == ["feeds", "weekly"]
    assert (workspace_dir(task.pk) / "notes.txt").read_bytes() == b"hello"
    assert (workspace_dir(task.pk) / "data.csv").exists()
    assert task.events.filter(kind=EventKind.CREATED, actor_label="boss").exists()


def _upload(name, data):
    from django.core.files.uploadedfile import SimpleUploadedFile

    return SimpleUploadedFile(name, data, content_type="text/plain")


def test_create_refuses_a_bad_file_name_and_creates_nothing(boss):
    response = boss.post(
        "/tasks/new/",
        {
            "title": "T",
            "instruction": "I",
            "priority": "0",
            "tools": ["read_file"],
            "files": [_upload(".hidden", b"x")],
            **_default_limits(),
        },
    )
    assert response.status_code == 400
    assert b"is not allowed" in response.content
    assert not Task.objects.exists()


def test_create_reports_the_service_refusal(boss):
    other = ModelFactory()
    response = boss.post(
        "/tasks/new/",
        {
            "title": "T",
            "instruction": "I",
            "priority": "0",
            "connection": str(ModelFactory().connection.pk),
            "model": str(other.pk),
            **_default_limits(),
        },
    )
    assert response.status_code == 400
    assert b"does not belong to connection" in response.content
    assert not Task.objects.exists()


def test_a_task_from_the_form_left_at_default_runs_on_the_default_model(boss):
    from tests.factories import ConnectionFactory

    ModelFactory(connection=ConnectionFactory(cost_tier="paid", priority=9))
    free = ModelFactory(connection=ConnectionFactory(priority=1))
    form = {"title": "T", "instruction": "I", "priority": "0", "tools": ["read_file"]}
    response = boss.post("/tasks/new/", {**form, **_default_limits()})
    task = Task.objects.get()
    assert response.status_code == 302
    assert (task.connection, task.model, task.status) == (free.connection, free, "ready")


def test_the_form_with_no_tool_ticked_makes_a_task_without_tools_on_a_model_cli(boss):
    """No box ticked (the browser sends no `tools` field): a task without tools, and its default
    model may be a tested model CLI (issue 32)."""
    from tests.factories import ConnectionFactory

    cli = ModelFactory(
        connection=ConnectionFactory(kind="cli", command=["llm"], base_url=""),
        supports_tools=False,
    )
    form = {"title": "T", "instruction": "I", "priority": "0", **_default_limits()}
    response = boss.post("/tasks/new/", form)
    task = Task.objects.get()
    assert response.status_code == 302, response.context["form"].errors
    assert (task.tools, task.tool_policies, task.model) == ([], {}, cli)
    # A tool ticked: the model CLI cannot run it, and the form says so on the model field.
    response = boss.post("/tasks/new/", {**form, "tools": ["read_file"]})
    assert response.status_code == 400
    assert "no_usable_model" in response.context["form"].errors["model"][0]
    assert Task.objects.count() == 1


def test_the_form_refuses_a_task_no_model_could_run_as_an_error_on_the_model_field(boss):
    ModelFactory(test_status=ModelTestStatus.UNTESTED)
    form = {"title": "T", "instruction": "I", "priority": "0", "tools": ["read_file"]}
    response = boss.post("/tasks/new/", {**form, **_default_limits()})
    assert response.status_code == 400
    errors = response.context["form"].errors
    assert "no_usable_model" in errors["model"][0] and "__all__" not in errors
    assert not Task.objects.exists()


def _default_limits():
    from tasks.services import default_limits

    return {k: "" if v is None else str(v) for k, v in default_limits().items()}


# --- The task page --------------------------------------------------------------------------


def test_task_page_shows_everything_of_a_run(boss):
    task = transcript_task(status=TaskStatus.REVIEW)
    page = boss.get(detail(task)).content.decode()
    assert "Read notes.txt and summarise the decisions in summary.md." in page
    # The transcript in order, with tool calls under their turn.
    transcript = page[page.index('class="transcript"') :]
    order = [
        transcript.index("I will plan first"),
        transcript.index('<code class="tool">update_plan'),
        transcript.index("Reading the notes."),
        transcript.index('<code class="tool">read_file'),
        transcript.index("Summary: the supplier dela"),
        transcript.index("Writing the summary."),
        transcript.index('<code class="tool">write_artifact'),
    ]
    assert order == sorted(order)
    assert "discarded: never sent again" in page
    assert "stop: max_tokens" in page
    assert "replaced by a placeholder in later requests" in page
    assert "show full result" in page and FULL_RESULT not in page
    assert "[… truncated at the tool output limit]" in page
    # Plan, memory, artifacts, verdict, answer, limits, runs, timeline.
    assert "Read notes.txt and extract the decisions" in page
    assert "House style" in page
    artifact = Artifact.objects.get(task=task)
    assert reverse("tasks:artifact", args=[task.pk, artifact.pk]) in page
    assert "Supervisor: approved" in page and "names both decisions" in page
    assert "The launch moved from April 2 to April 16" in page
    assert "4 / 24" in page  # model turns used / granted
    assert "6,030 / 600,000" in page  # tokens
    assert "worker-1" in page and "In progress → Review" in page
    assert "Submitted for review" in page


def test_the_full_result_is_served_on_demand(boss):
    task = transcript_task()
    call = task.tool_calls.get(tool="read_file")
    url = reverse("tasks:call_result", args=[task.pk, call.pk])
    assert url in boss.get(detail(task)).content.decode()
    response = boss.get(url, **HTMX)
    assert response.status_code == 200 and NOTES.splitlines()[0] in response.content.decode()
    plain = boss.get(url)
    assert plain["Content-Type"].startswith("text/plain")
    assert plain.content.decode() == FULL_RESULT
    other = TaskFactory()
    assert boss.get(reverse("tasks:call_result", args=[other.pk, call.pk])).status_code == 404


def test_model_output_and_names_are_escaped(boss):
    evil = "<script>alert('x')</script>"
    task = transcript_task(title=evil, instruction=evil, content=evil)
    call = task.tool_calls.get(tool="read_file")
    type(call).objects.filter(pk=call.pk).update(result=evil, result_for_model=evil)
    TaskEventFactory(task=task, kind=EventKind.REOPENED, actor_label=evil, data={"f": evil})
    page = boss.get(detail(task)).content.decode()
    assert "<script>alert" not in page
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;" in page
    fragment = boss.get(reverse("tasks:call_result", args=[task.pk, call.pk]), **HTMX)
    assert b"<script>alert" not in fragment.content and b"&lt;script&gt;" in fragment.content


@pytest.mark.parametrize(
    "status",
    [TaskStatus.READY, TaskStatus.IN_PROGRESS, TaskStatus.PAUSE_REQUESTED, TaskStatus.BLOCKED],
)
def test_the_page_polls_while_the_task_moves(boss, status):
    task = TaskFactory(status=status)
    page = boss.get(detail(task)).content.decode()
    assert 'hx-trigger="every 2s"' in page
    assert f'hx-get="{detail(task)}"' in page
    fragment = boss.get(detail(task), **HTMX).content.decode()
    assert fragment.lstrip().startswith('<div id="live"') and "<html" not in fragment
    assert 'hx-trigger="every 2s"' in fragment


@pytest.mark.parametrize(
    "status",
    [
        TaskStatus.PAUSED,
        TaskStatus.AWAITING_APPROVAL,
        TaskStatus.NEEDS_REVIEW,
        TaskStatus.REVIEW,
        TaskStatus.DONE,
        TaskStatus.FAILED,
        TaskStatus.CANCELLED,
    ],
)
def test_the_page_stops_polling_once_the_task_waits_or_settles(boss, status):
    task = TaskFactory(status=status)
    assert "every 2s" not in boss.get(detail(task)).content.decode()
    fragment = boss.get(detail(task), **HTMX).content.decode()
    assert 'id="live"' in fragment and "hx-trigger" not in fragment.split(">", 1)[0]


def test_the_poll_shows_what_the_worker_wrote_since(boss):
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    assert "Second thoughts" not in boss.get(detail(task), **HTMX).content.decode()
    from tests.factories import TurnFactory

    TurnFactory(task=task, run=run_for(task), index=0, content="Second thoughts")
    assert "Second thoughts" in boss.get(detail(task), **HTMX).content.decode()


@pytest.mark.parametrize(
    ("status", "offered"),
    [
        (TaskStatus.BLOCKED, {"cancel"}),
        (TaskStatus.READY, {"pause", "cancel"}),
        (TaskStatus.IN_PROGRESS, {"pause", "cancel"}),
        (TaskStatus.PAUSE_REQUESTED, {"withdraw_pause", "cancel"}),
        (TaskStatus.PAUSED, {"resume", "cancel"}),
        (TaskStatus.AWAITING_APPROVAL, {"cancel"}),
        (TaskStatus.NEEDS_REVIEW, {"cancel"}),
        (TaskStatus.REVIEW, {"close", "reopen", "cancel"}),
        (TaskStatus.DONE, {"delete"}),
        (TaskStatus.FAILED, {"retry", "delete"}),
        (TaskStatus.CANCELLED, {"delete"}),
    ],
)
def test_exactly_the_allowed_actions_are_offered(boss, client, viewer, status, offered):
    task = TaskFactory(status=status)
    page = boss.get(detail(task)).content.decode()
    assert set(re.findall(r'data-action="(\w+)"', page)) == offered
    client.force_login(viewer)
    assert "data-action=" not in client.get(detail(task)).content.decode()


def test_close_needs_the_close_permission_even_for_an_operator(client):
    operator = UserFactory(username="operator", perms=["tasks.view_task", "tasks.operate_task"])
    client.force_login(operator)
    task = TaskFactory(status=TaskStatus.REVIEW)
    page = client.get(detail(task)).content.decode()
    assert set(re.findall(r'data-action="(\w+)"', page)) == {"cancel"}
    assert client.post(action("close", task)).status_code == 403
    assert client.post(action("reopen", task), {"feedback": "x"}).status_code == 403
    assert status_of(task) == TaskStatus.REVIEW


@pytest.mark.parametrize("name", ["close", "reopen", "cancel", "pause", "delete"])
def test_an_action_without_permission_is_403_and_changes_nothing(client, viewer, name):
    client.force_login(viewer)
    task = TaskFactory(status=TaskStatus.DONE if name == "delete" else TaskStatus.REVIEW)
    before = status_of(task)
    assert client.post(action(name, task), {"feedback": "x"}).status_code == 403
    assert status_of(task) == before


def test_task_page_query_count_does_not_grow_with_turns_or_events(boss):
    small = transcript_task(status=TaskStatus.REVIEW, extra_turns=1, extra_events=1)
    big = transcript_task(status=TaskStatus.REVIEW, extra_turns=30, extra_events=30)
    assert count_queries(boss, detail(small)) == count_queries(boss, detail(big))
    assert count_queries(boss, detail(big)) <= 16
    running_small = transcript_task(status=TaskStatus.IN_PROGRESS, extra_turns=1)
    running_big = transcript_task(status=TaskStatus.IN_PROGRESS, extra_turns=30, extra_events=30)
    assert count_queries(boss, detail(running_small), **HTMX) == count_queries(
        boss, detail(running_big), **HTMX
    )


def test_the_timeline_shows_the_latest_200_events(boss):
    task = TaskFactory(status=TaskStatus.DONE)
    TaskEventFactory.create_batch(205, task=task, kind=EventKind.MODEL_TURN)
    last = TaskEventFactory(task=task, kind=EventKind.CLOSED, actor_label="the-closer")
    page = boss.get(detail(task)).content.decode()
    assert page.count("Model turn</td>") == 199 and "the-closer" in page
    assert "Showing the latest 200 events" in page
    assert reverse("admin:tasks_task_change", args=[task.pk]) in page
    assert last.pk


# --- Actions --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "start", "end", "data"),
    [
        ("pause", TaskStatus.READY, TaskStatus.PAUSED, {}),
        ("pause", TaskStatus.IN_PROGRESS, TaskStatus.PAUSE_REQUESTED, {}),
        ("withdraw_pause", TaskStatus.PAUSE_REQUESTED, TaskStatus.IN_PROGRESS, {}),
        ("resume", TaskStatus.PAUSED, TaskStatus.READY, {}),
        ("cancel", TaskStatus.IN_PROGRESS, TaskStatus.CANCELLED, {}),
        ("close", TaskStatus.REVIEW, TaskStatus.DONE, {}),
        ("reopen", TaskStatus.REVIEW, TaskStatus.READY, {"feedback": "Cite the notes."}),
        ("retry", TaskStatus.FAILED, TaskStatus.READY, {}),
    ],
)
def test_actions_call_the_services(boss, name, start, end, data):
    task = TaskFactory(status=start)
    response = boss.post(action(name, task), data)
    assert response.status_code == 302 and response["Location"] == detail(task)
    assert status_of(task) == end
    assert task.events.filter(actor_label="boss").exists()
    page = boss.get(detail(task)).content.decode()
    assert 'class="flash flash-success"' in page


def test_reopen_keeps_the_feedback(boss):
    task = TaskFactory(status=TaskStatus.REVIEW)
    boss.post(action("reopen", task), {"feedback": "Cite the notes."})
    task.refresh_from_db()
    assert task.feedback == "Cite the notes."
    assert "Cite the notes." in boss.get(detail(task)).content.decode()


def test_reopen_without_feedback_is_refused_clearly(boss):
    task = TaskFactory(status=TaskStatus.REVIEW)
    response = boss.post(action("reopen", task), {"feedback": "  "})
    assert response.status_code == 400
    assert "Nothing was changed." in response.content.decode()
    assert "needs feedback" in response.content.decode()
    assert status_of(task) == TaskStatus.REVIEW


def test_an_action_the_state_does_not_allow_is_409_and_changes_nothing(boss):
    task = TaskFactory(status=TaskStatus.DONE)
    response = boss.post(action("close", task))
    assert response.status_code == 409
    assert "transition_not_allowed" in response.content.decode()
    assert status_of(task) == TaskStatus.DONE
    htmx = boss.post(action("cancel", task), **HTMX)
    assert htmx.status_code == 409
    assert htmx.content.decode().lstrip().startswith('<div id="live"')
    assert "Nothing was changed." in htmx.content.decode()


def test_an_htmx_action_answers_with_the_live_part(boss):
    task = TaskFactory(status=TaskStatus.REVIEW)
    response = boss.post(action("close", task), **HTMX)
    assert response.status_code == 200
    body = response.content.decode()
    assert body.lstrip().startswith('<div id="live" data-status="done"')
    assert "Task closed: done." in body
    assert status_of(task) == TaskStatus.DONE


def test_delete_removes_the_task_and_its_files(boss):
    task = TaskFactory(status=TaskStatus.CANCELLED)
    (workspace_dir(task.pk) / "a.txt").write_text("x")
    response = boss.post(action("delete", task))
    assert response.status_code == 302 and response["Location"] == "/"
    assert not Task.objects.filter(pk=task.pk).exists()
    assert not workspace_dir(task.pk, create=False).exists()
    other = TaskFactory(status=TaskStatus.CANCELLED)
    htmx = boss.post(action("delete", other), **HTMX)
    assert htmx.status_code == 200 and htmx["HX-Redirect"] == "/"


def test_csrf_is_enforced_on_actions(founder):
    client = Client(enforce_csrf_checks=True)
    client.force_login(founder)
    task = TaskFactory(status=TaskStatus.REVIEW)
    assert client.post(action("close", task)).status_code == 403
    assert client.post(action("close", task), **HTMX).status_code == 403
    assert status_of(task) == TaskStatus.REVIEW
    page = client.get(detail(task)).content.decode()
    token = re.search(r'"X-CSRFToken": "([^"]+)"', page).group(1)
    response = client.post(action("close", task), HTTP_HX_REQUEST="true", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200 and status_of(task) == TaskStatus.DONE


def test_csrf_is_enforced_on_the_new_task_form(founder):
    client = Client(enforce_csrf_checks=True)
    client.force_login(founder)
    response = client.post("/tasks/new/", {"title": "T", "instruction": "I", **_default_limits()})
    assert response.status_code == 403 and not Task.objects.exists()


# --- Resume and retry on another model ------------------------------------------------------


def test_resume_on_another_model_shows_the_checks_before_queueing(boss):
    task = transcript_task(status=TaskStatus.PAUSED)
    unknown = ModelFactory(context_window=None, name="big-unknown")
    response = boss.post(action("resume", task), {"model": unknown.pk})
    page = response.content.decode()
    assert response.status_code == 200
    assert "window unknown: the check could not be made" in page
    assert f'name="checked" value="{unknown.pk}"' in page
    assert status_of(task) == TaskStatus.PAUSED
    response = boss.post(action("resume", task), {"model": unknown.pk, "checked": unknown.pk})
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.model == unknown


def test_a_model_that_fails_its_checks_cannot_be_queued(boss):
    task = TaskFactory(status=TaskStatus.PAUSED)
    untested = ModelFactory(test_status=ModelTestStatus.UNTESTED, name="fresh")
    page = boss.post(action("resume", task), {"model": untested.pk}).content.decode()
    assert "has not passed its test" in page
    assert 'name="checked"' not in page and 'data-action="resume"' not in page
    forced = boss.post(action("resume", task), {"model": untested.pk, "checked": untested.pk})
    assert forced.status_code == 409 and "model_check_failed" in forced.content.decode()
    task.refresh_from_db()
    assert task.status == TaskStatus.PAUSED and task.model_id is None


def test_the_model_check_fragment(boss):
    task = TaskFactory(status=TaskStatus.PAUSED)
    small = ModelFactory(context_window=2, name="tiny")
    page = boss.get(action("model_check", task), {"model": small.pk}, **HTMX).content.decode()
    assert "exceeds the context window" in page and 'name="checked"' not in page
    ok = ModelFactory(context_window=100_000)
    page = boss.get(action("model_check", task), {"model": ok.pk}, **HTMX).content.decode()
    assert "the checks passed" in page and f'value="{ok.pk}"' in page


def test_the_model_check_needs_the_operate_permission(client, viewer):
    client.force_login(viewer)
    task = TaskFactory(status=TaskStatus.PAUSED)
    assert client.get(action("model_check", task), {"model": ModelFactory().pk}).status_code == 403


def test_retry_after_a_limit_asks_to_raise_it_first(boss):
    task = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps", limit_turns=4)
    run_for(task, model_turns=4)
    page = boss.get(detail(task)).content.decode()
    assert "Raise it first" in page and 'name="limit_value"' in page and "4 used of 4" in page
    refused = boss.post(action("retry", task), {"limit_value": "4"})
    assert refused.status_code == 409 and "limit_not_raised" in refused.content.decode()
    assert status_of(task) == TaskStatus.FAILED
    response = boss.post(action("retry", task), {"limit_value": "10"})
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.limit_turns == 10
    assert task.events.filter(kind=EventKind.LIMITS_CHANGED).exists()


def test_a_refused_retry_leaves_the_limit_unchanged(boss):
    task = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps", limit_turns=4)
    run_for(task, model_turns=4)
    untested = ModelFactory(test_status=ModelTestStatus.FAILED)
    response = boss.post(
        action("retry", task),
        {"limit_value": "10", "model": untested.pk, "checked": untested.pk},
    )
    assert response.status_code == 409
    task.refresh_from_db()
    assert task.limit_turns == 4 and task.status == TaskStatus.FAILED
    assert not task.events.filter(kind=EventKind.LIMITS_CHANGED).exists()


def test_retry_rejects_a_limit_that_is_not_a_number(boss):
    task = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps", limit_turns=4)
    response = boss.post(action("retry", task), {"limit_value": "lots"})
    assert response.status_code == 400 and status_of(task) == TaskStatus.FAILED


# --- Decisions on the task page -------------------------------------------------------------


def test_pending_decisions_are_decided_from_the_task_page(boss):
    approval = pending_approval()
    task = approval.task
    page = boss.get(detail(task)).content.decode()
    assert "Waiting for your decision" in page and approval.arguments_hash in page
    response = boss.post(
        reverse("approvals:approve", args=[approval.pk]),
        {"arguments_hash": approval.arguments_hash, "task": task.pk},
        **HTMX,
    )
    assert response.status_code == 200
    assert response.content.decode().lstrip().startswith('<div id="live" data-status="ready"')


def test_needs_review_on_the_task_page_explains_the_choice(boss):
    decision = pending_review()
    page = boss.get(detail(decision.task)).content.decode()
    assert "its outcome is unknown. Run again repeats it (for fetch_url: another GET)" in page
    assert 'data-action="run_again"' in page and 'data-action="skip"' in page


# --- Artifacts ------------------------------------------------------------------------------


def _artifact(task, name, content, content_type):
    from tests.factories import ArtifactFactory

    (artifacts_dir(task.pk) / name).write_bytes(content)
    return ArtifactFactory(task=task, name=name, size=len(content), content_type=content_type)


def test_an_artifact_downloads_as_an_attachment(boss):
    task = TaskFactory(status=TaskStatus.REVIEW)
    artifact = _artifact(task, "summary.md", b"# Summary\n", "text/markdown")
    response = boss.get(reverse("tasks:artifact", args=[task.pk, artifact.pk]))
    assert response.status_code == 200
    assert response["Content-Disposition"].startswith("attachment")
    assert 'filename="summary.md"' in response["Content-Disposition"]
    assert response["Content-Type"] == "text/markdown; charset=utf-8"
    assert b"".join(response.streaming_content) == b"# Summary\n"


@pytest.mark.parametrize("stored", ["text/html", "image/svg+xml", "application/xhtml+xml", ""])
def test_an_html_artifact_is_never_served_as_a_page(boss, stored):
    task = TaskFactory(status=TaskStatus.REVIEW)
    artifact = _artifact(task, "page.html", b"<script>alert(1)</script>", stored)
    response = boss.get(reverse("tasks:artifact", args=[task.pk, artifact.pk]))
    assert response["Content-Type"] == "text/plain; charset=utf-8"
    assert response["Content-Disposition"].startswith("attachment")
    assert response["X-Content-Type-Options"] == "nosniff"


def test_an_artifact_of_another_task_or_missing_file_is_404(boss, tmp_path):
    task = TaskFactory(status=TaskStatus.REVIEW)
    other = TaskFactory(status=TaskStatus.REVIEW)
    artifact = _artifact(task, "a.txt", b"x", "text/plain")
    assert boss.get(reverse("tasks:artifact", args=[other.pk, artifact.pk])).status_code == 404
    (artifacts_dir(task.pk) / "a.txt").unlink()
    assert boss.get(reverse("tasks:artifact", args=[task.pk, artifact.pk])).status_code == 404
    secret = tmp_path / "secret.txt"
    secret.write_text("secret")
    (artifacts_dir(task.pk) / "a.txt").symlink_to(secret)
    assert boss.get(reverse("tasks:artifact", args=[task.pk, artifact.pk])).status_code == 404


def test_artifact_download_needs_the_view_permission(client):
    client.force_login(UserFactory(username="stranger", perms=[]))
    task = TaskFactory(status=TaskStatus.REVIEW)
    artifact = _artifact(task, "a.txt", b"x", "text/plain")
    assert client.get(reverse("tasks:artifact", args=[task.pk, artifact.pk])).status_code == 403


# --- The console around the pages -----------------------------------------------------------


def test_every_console_page_shows_the_pending_badge(boss):
    pending_approval()
    pending_approval(url="https://example.org/b")
    pending_review()
    task = TaskFactory()
    for url in ["/", "/tasks/new/", detail(task), "/approvals/", "/connections/"]:
        page = boss.get(url).content.decode()
        assert re.search(r'id="pending-badge"[^>]*>3</span>', page), url


def test_the_console_loads_htmx_from_its_own_static_files(boss):
    page = boss.get("/").content.decode()
    assert '<script src="/static/console/htmx.min.js"' in page
    assert "unpkg" not in page and "cdn" not in page.lower()
    assert 'hx-headers=\'{"X-CSRFToken": "' in page


# --- The admin's review queue ---------------------------------------------------------------


def test_the_review_queue_lists_the_oldest_first(boss):
    from django.utils import timezone

    newer = TaskFactory(status=TaskStatus.REVIEW, title="Newer review")
    older = TaskFactory(status=TaskStatus.REVIEW, title="Older review")
    Task.objects.filter(pk=older.pk).update(updated_at=timezone.now().replace(year=2020))
    page = boss.get(
        reverse("admin:tasks_task_changelist"), {"status__exact": "review"}
    ).content.decode()
    assert page.index("Older review") < page.index("Newer review")
    assert newer.pk


def test_the_admin_task_page_shows_answer_verdict_and_artifacts(boss):
    task = transcript_task(status=TaskStatus.REVIEW)
    page = boss.get(reverse("admin:tasks_task_change", args=[task.pk])).content.decode()
    review = page[page.index('id="task-review"') :]
    assert 'Supervisor: <span class="verdict-approved">approved</span>' in review
    assert "The launch moved from April 2 to April 16" in review
    artifact = Artifact.objects.get(task=task)
    assert reverse("tasks:artifact", args=[task.pk, artifact.pk]) in review
    assert "close_tasks" in page


def test_a_long_transcript_shows_the_newest_turns_and_links_to_the_rest(client):
    from tests.factories import AgentRunFactory, TurnFactory

    client.force_login(UserFactory(username="boss", is_superuser=True))
    run = AgentRunFactory()
    for index in range(105):
        TurnFactory(run=run, task=run.task, index=index, content=f"turn-content-{index:03d}")
    page = client.get(reverse("tasks:detail", args=[run.task_id])).content.decode()
    assert "turn-content-104" in page and "turn-content-005" in page
    assert "turn-content-004" not in page and "Older turns" in page
    whole = client.get(reverse("tasks:detail", args=[run.task_id]), {"turns": "all"})
    assert "turn-content-000" in whole.content.decode()
    older = client.get(reverse("tasks:detail", args=[run.task_id]), {"turns_before": "5"})
    older = older.content.decode()
    assert "turn-content-004" in older and "turn-content-000" in older
    assert "turn-content-005" not in older


def test_turns_all_is_bounded_and_pages_back(client):
    """Issue 21 item 10: ?turns=all showed every turn of any transcript in one page."""
    from tasks.selectors import TRANSCRIPT_ALL_MAX
    from tests.factories import AgentRunFactory, TurnFactory

    client.force_login(UserFactory(username="boss", is_superuser=True))
    run = AgentRunFactory()
    for index in range(TRANSCRIPT_ALL_MAX + 3):
        TurnFactory(run=run, task=run.task, index=index, content=f"turn-content-{index:04d}")
    url = reverse("tasks:detail", args=[run.task_id])
    page = client.get(url, {"turns": "all"}).content.decode()
    assert page.count('class="turn role-') == TRANSCRIPT_ALL_MAX
    assert "turn-content-0002" not in page and "turn-content-0003" in page
    assert "?turns_before=3&amp;turns=all" in page
    rest = client.get(url, {"turns": "all", "turns_before": "3"}).content.decode()
    assert "turn-content-0000" in rest and "turn-content-0003" not in rest


def test_events_older_than_the_newest_200_can_be_read(boss):
    task = TaskFactory(status=TaskStatus.DONE)
    first = TaskEventFactory(task=task, kind=EventKind.CREATED, actor_label="the-first")
    TaskEventFactory.create_batch(205, task=task, kind=EventKind.MODEL_TURN)
    page = boss.get(detail(task)).content.decode()
    assert "the-first" not in page
    cursor = page.split("?events_before=", 1)[1].split('"', 1)[0]
    older = boss.get(detail(task), {"events_before": cursor}).content.decode()
    assert "the-first" in older
    assert older.count("Model turn</td>") == 205 - 200
    assert first.pk


def _costed_task(*costs):
    from tests.factories import AgentRunFactory, TurnFactory

    task = TaskFactory()
    run = AgentRunFactory(task=task, number=1)
    for index, cost in enumerate(costs, start=1):
        TurnFactory(task=task, run=run, index=index, cost=cost)
    return task


def test_the_list_shows_each_tasks_cost_in_a_flat_number_of_queries(boss):
    from decimal import Decimal

    _costed_task(Decimal("0.25"), Decimal("0.05"), None)
    with CaptureQueriesContext(connection) as one:
        response = boss.get("/")
    assert "$0.30" in response.content.decode()
    for _ in range(10):
        _costed_task(Decimal("0.001"), Decimal("0.002"))
    with CaptureQueriesContext(connection) as many:
        response = boss.get("/")
    assert "$0.0030" in response.content.decode()
    assert len(many) == len(one)


def test_the_task_page_shows_cost_and_the_money_budget(boss):
    from decimal import Decimal

    task = _costed_task(Decimal("1.5"))
    Task.objects.filter(pk=task.pk).update(limit_cost=Decimal("2"))
    page = boss.get(detail(task)).content.decode()
    assert "$1.50 / $2.00 USD" in page
    Task.objects.filter(pk=task.pk).update(limit_cost=None)
    assert "$1.50 USD (no budget)" in boss.get(detail(task)).content.decode()


def test_the_task_page_shows_each_turns_cost_zero_as_zero_and_a_partial_total(boss):
    from decimal import Decimal

    task = _costed_task(Decimal("0"), Decimal("0.25"), None)
    page = boss.get(detail(task)).content.decode()
    costs = re.findall(r'<span class="turn-cost">([^<]*)</span>', page)
    assert costs == ["$0.00", "$0.25", "cost unknown"]
    assert "$0.25 USD (no budget) — partial: 1 model turn of unknown cost" in page
    free = _costed_task(Decimal("0"))
    page = boss.get(detail(free)).content.decode()
    assert "$0.00 USD (no budget)" in page and "partial" not in page


def test_retry_after_the_money_budget_raises_it_with_a_decimal(boss):
    from decimal import Decimal

    task = _costed_task(Decimal("1.5"))
    Task.objects.filter(pk=task.pk).update(
        status=TaskStatus.FAILED, failure_code="limit_cost", limit_cost=Decimal("1.5")
    )
    page = boss.get(detail(task)).content.decode()
    assert 'step="0.0001"' in page
    response = boss.post(action("retry", task), {"limit_value": "1.5"})
    assert response.status_code == 409 and "raise that limit" in response.content.decode()
    response = boss.post(action("retry", task), {"limit_value": "2.25"})
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.limit_cost == Decimal("2.25")


def test_the_runs_card_says_when_a_run_had_no_tools(boss):
    from django.utils import timezone

    from tests.factories import AgentRunFactory

    task = TaskFactory(status=TaskStatus.REVIEW)
    ended = {"status": "failed", "finished_at": timezone.now()}
    AgentRunFactory(task=task, number=1, checkpoint={"tools_offered": ["read_file"]}, **ended)
    page = boss.get(detail(task)).content.decode()
    assert ">no tools<" not in page
    AgentRunFactory(task=task, number=2, checkpoint={"tools_offered": []}, **ended)
    AgentRunFactory(task=task, number=3, checkpoint={}, **ended)  # before runs recorded it
    page = boss.get(detail(task)).content.decode()
    assert page.count(">no tools<") == 1
