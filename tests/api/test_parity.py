"""The API and the console make the same change: for each action, the events written through
one and through the other are identical (kind, actor, states, data), for the same person."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.test import Client
from django.urls import reverse

from tasks.models import Task, TaskEvent
from tasks.states import TaskStatus
from tests.console.scenes import pending_approval, pending_review, run_for
from tests.factories import ModelFactory, TaskFactory

pytestmark = pytest.mark.django_db


def events_after(task_id: int, after_id: int, own_ids: dict) -> list[tuple]:
    """The task's events after `after_id`, with ids of the scene's own objects made neutral.
    The API token an action went through (`api_token`, issue 21 item 5) and the door a
    decision came through (`via`: console, email_link, slack) are the differences by design:
    they are left out."""
    rows = []
    for event in TaskEvent.objects.filter(task_id=task_id, id__gt=after_id).order_by("id"):
        data = {
            k: own_ids.get((k, v), v) if isinstance(v, int) else v
            for k, v in event.data.items()
            if k not in ("api_token", "via")
        }
        rows.append(
            (
                event.kind,
                event.actor_kind,
                event.actor_label,
                event.actor_user_id,
                event.from_status,
                event.to_status,
                data,
            )
        )
    return rows


def last_event_id() -> int:
    return TaskEvent.objects.order_by("-id").values_list("id", flat=True).first() or 0


@pytest.fixture
def console(api):
    client = Client()
    client.force_login(api.user)
    return client


def _simple(state, *, console_post, api_post, **task_kwargs):
    """Two like tasks; one acted on through the console, the other through the API."""
    a, b = TaskFactory(status=state, **task_kwargs), TaskFactory(status=state, **task_kwargs)
    mark = last_event_id()
    via_console = console_post(a)
    via_api = api_post(b)
    assert via_console.status_code in (200, 302), via_console.content
    assert via_api.status_code == 200, via_api.content
    assert Task.objects.get(pk=a.pk).status == Task.objects.get(pk=b.pk).status
    return events_after(a.pk, mark, {}), events_after(b.pk, mark, {})


ACTIONS = [
    # (state, console view, form data, api path, api body)
    (TaskStatus.READY, "pause", {}, "pause", None),
    (TaskStatus.IN_PROGRESS, "pause", {}, "pause", None),
    (TaskStatus.PAUSE_REQUESTED, "withdraw_pause", {}, "withdraw-pause", None),
    (TaskStatus.PAUSED, "resume", {}, "resume", {}),
    (
        TaskStatus.READY,
        "cancel",
        {"reason": "no longer needed"},
        "cancel",
        {"reason": "no longer needed"},
    ),
    (TaskStatus.REVIEW, "close", {}, "close", None),
    (TaskStatus.REVIEW, "reopen", {"feedback": "cite it"}, "reopen", {"feedback": "cite it"}),
    (TaskStatus.FAILED, "retry", {}, "retry", {}),
]


@pytest.mark.parametrize(("state", "view", "form", "path", "body"), ACTIONS)
def test_task_actions_write_the_same_events(api, console, state, view, form, path, body):
    console_events, api_events = _simple(
        state,
        console_post=lambda t: console.post(reverse(f"tasks:{view}", args=[t.pk]), form),
        api_post=lambda t: api.post(f"/api/tasks/{t.pk}/{path}", body),
    )
    assert console_events and console_events == api_events


def test_resume_on_another_model_writes_the_same_events(api, console):
    model = ModelFactory()
    console_events, api_events = _simple(
        TaskStatus.PAUSED,
        console_post=lambda t: console.post(
            reverse("tasks:resume", args=[t.pk]), {"model": model.pk, "checked": model.pk}
        ),
        api_post=lambda t: api.post(f"/api/tasks/{t.pk}/resume", {"model_id": model.pk}),
    )
    assert console_events == api_events and console_events[0][-1]["model_id"] == model.pk


def test_retry_with_a_raised_limit_writes_the_same_events(api, console):
    a = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps", limit_turns=4)
    b = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps", limit_turns=4)
    run_for(a, model_turns=4)
    run_for(b, model_turns=4)
    mark = last_event_id()
    assert (
        console.post(reverse("tasks:retry", args=[a.pk]), {"limit_value": "9"}).status_code == 302
    )
    response = api.post(f"/api/tasks/{b.pk}/retry", {"limits": {"limit_turns": 9}})
    assert response.status_code == 200
    console_events, api_events = events_after(a.pk, mark, {}), events_after(b.pk, mark, {})
    assert [e[0] for e in console_events] == ["limits_changed", "retried"]
    assert console_events == api_events


def test_creating_a_task_writes_the_same_events(api, console):
    ModelFactory()  # the default model a new task runs on
    mark = last_event_id()
    form = {"title": "Same", "instruction": "Do it", "priority": 0, "tools": ["read_file"]}
    from tasks.services import default_limits

    # The form's limit fields as the console fills them (no money budget: an empty field).
    limits = {field: "" if value is None else value for field, value in default_limits().items()}
    page = console.post(
        reverse("tasks:create"),
        {**form, **limits, "files": SimpleUploadedFile("a.txt", b"x")},
    )
    assert page.status_code == 302, page.content
    response = api.post_form("/api/tasks", {**form, "files": SimpleUploadedFile("a.txt", b"x")})
    assert response.status_code == 201
    a, b = Task.objects.filter(title="Same").order_by("id")
    assert events_after(a.pk, mark, {}) == events_after(b.pk, mark, {})


@pytest.mark.parametrize("verb", ["approve", "deny"])
def test_decisions_on_approvals_write_the_same_events(api, console, verb):
    first, second = pending_approval(), pending_approval()
    mark = last_event_id()
    url = reverse(f"approvals:{verb}", args=[first.pk])
    assert console.post(url, {"arguments_hash": first.arguments_hash}).status_code == 302
    api_url = f"/api/tasks/{second.task_id}/approvals/{second.pk}/{verb}"
    assert api.post(api_url, {"arguments_hash": second.arguments_hash}).status_code == 200
    console_events = events_after(first.task_id, mark, {("approval_id", first.pk): "<op>"})
    api_events = events_after(second.task_id, mark, {("approval_id", second.pk): "<op>"})
    kind = {"approve": "approved", "deny": "denied"}[verb]
    assert [e[0] for e in console_events] == [kind, "resumed"]
    assert console_events == api_events


@pytest.mark.parametrize(("view", "path"), [("run_again", "run-again"), ("skip", "skip")])
def test_decisions_on_unknown_outcomes_write_the_same_events(api, console, view, path):
    first, second = pending_review(), pending_review()
    mark = last_event_id()
    url = reverse(f"approvals:{view}", args=[first.pk])
    assert console.post(url, {"arguments_hash": first.tool_call.arguments_hash}).status_code == 302
    api_url = f"/api/tasks/{second.task_id}/reviews/{second.pk}/{path}"
    body = {"arguments_hash": second.tool_call.arguments_hash}
    assert api.post(api_url, body).status_code == 200
    console_events = events_after(
        first.task_id, mark, {("tool_call_id", first.tool_call_id): "<op>"}
    )
    api_events = events_after(second.task_id, mark, {("tool_call_id", second.tool_call_id): "<op>"})
    assert len(console_events) == 2 and console_events == api_events


def test_every_console_action_has_its_endpoint():
    """A new console action needs its endpoint written by hand (its own body and text): this
    says which one is missing. Deleting is the REST verb on the task itself."""
    from acthelm_site.api.endpoints import api
    from console.actions import REGISTRY
    from tasks.states import Action

    prefix = {
        "task": "/tasks/{task_id}",
        "approval": "/tasks/{task_id}/approvals/{approval_id}",
        "review": "/tasks/{task_id}/reviews/{decision_id}",
    }
    routes = {
        (path.removeprefix("/api"), method)
        for path, methods in api.get_openapi_schema()["paths"].items()
        for method in methods
    }

    def route(entry):
        if entry.name == Action.DELETE:
            return (prefix[entry.target], "delete")
        return (f"{prefix[entry.target]}/{entry.slug}", "post")

    assert [entry.name for entry in REGISTRY.values() if route(entry) not in routes] == []
