"""Every endpoint refuses a request without a live token (401) and a person without the
permission (403), before it reads or changes anything."""

import re

import pytest
from django.utils import timezone

from acthelm_site.api.endpoints import api as ninja_api
from acthelm_site.api.models import ApiToken
from acthelm_site.api.tokens import token_create, token_revoke
from tasks.models import Goal, Task
from tasks.states import TaskStatus
from tests.api.conftest import ApiClient, error_of
from tests.factories import TaskFactory, UserFactory

pytestmark = pytest.mark.django_db

# (client method, path, body): one row per endpoint, with a body that passes validation.
ENDPOINTS = [
    ("get", "/api/tasks", None),
    ("post_form", "/api/tasks", {"title": "T", "instruction": "I"}),
    ("get", "/api/tasks/1", None),
    ("get", "/api/tasks/1/calls/1/result", None),
    ("get", "/api/tasks/1/artifacts/1", None),
    ("get", "/api/tasks/1/files/1", None),
    ("get", "/api/tasks/1/events", None),
    ("post", "/api/tasks/1/pause", None),
    ("post", "/api/tasks/1/withdraw-pause", None),
    ("post", "/api/tasks/1/resume", {}),
    ("get", "/api/tasks/1/model-check?model_id=1", None),
    ("post", "/api/tasks/1/cancel", {}),
    ("post", "/api/tasks/1/close", None),
    ("post", "/api/tasks/1/reopen", {"feedback": "again"}),
    ("post", "/api/tasks/1/retry", {}),
    ("post", "/api/tasks/1/accept", {"reason": "good enough"}),
    ("patch", "/api/tasks/1", {"instruction": "Other"}),
    ("delete", "/api/tasks/1", None),
    ("post", "/api/tasks/1/approvals/1/approve", {"arguments_hash": "h"}),
    ("post", "/api/tasks/1/approvals/1/deny", {"arguments_hash": "h"}),
    ("post", "/api/tasks/1/reviews/1/run-again", {"arguments_hash": "h"}),
    ("post", "/api/tasks/1/reviews/1/skip", {"arguments_hash": "h"}),
    ("get", "/api/approvals", None),
    ("get", "/api/connections", None),
    ("post", "/api/connections/1/test", {}),
    ("get", "/api/scorecard", None),
    ("get", "/api/goals", None),
    ("post", "/api/goals", {"title": "G"}),
    ("get", "/api/goals/1", None),
    ("post", "/api/goals/1/deactivate", None),
    ("get", "/api/schedules", None),
    (
        "post",
        "/api/schedules",
        {"name": "S", "cron": "0 8 * * 1-5", "title": "T", "instruction": "I"},
    ),
    ("get", "/api/schedules/1", None),
    ("post", "/api/schedules/1/pause", None),
    ("post", "/api/schedules/1/resume", None),
    ("post", "/api/schedules/1/run-now", None),
    ("delete", "/api/schedules/1", None),
]
IDS = [f"{method.split('_')[0].upper()} {path}" for method, path, _ in ENDPOINTS]


def call(client: ApiClient, method: str, path: str, body):
    fn = getattr(client, method)
    return fn(path) if body is None and method in ("get", "delete") else fn(path, body)


def test_the_table_covers_every_endpoint_of_the_schema():
    schema = ninja_api.get_openapi_schema()
    documented = {
        (method, re.sub(r"\{[^}]+\}", "1", path))
        for path, ops in schema["paths"].items()
        for method in ops
    }
    tested = {(m.split("_")[0], p.split("?")[0]) for m, p, _ in ENDPOINTS}
    assert documented == tested


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS, ids=IDS)
def test_a_missing_token_is_401(method, path, body):
    response = call(ApiClient(None), method, path, body)
    assert response.status_code == 401
    assert error_of(response)["code"] == "token_missing"
    assert response["WWW-Authenticate"].startswith("Bearer")


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS, ids=IDS)
def test_an_invalid_token_is_401(method, path, body):
    UserFactory(username="someone")
    for bad in ("acthelm_00000000_" + "x" * 43, "not-a-token", ""):
        response = call(ApiClient(bad), method, path, body)
        assert response.status_code == 401, bad
        assert error_of(response)["code"] in ("token_invalid", "token_missing")


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS, ids=IDS)
def test_a_revoked_token_is_401_and_changes_nothing(method, path, body):
    TaskFactory(pk=1, status=TaskStatus.REVIEW)
    user = UserFactory(username="boss", is_superuser=True)
    new = token_create(user=user, name="old")
    token_revoke(token_id=new.token.pk)
    response = call(ApiClient(new.secret), method, path, body)
    assert response.status_code == 401
    assert error_of(response)["code"] == "token_revoked"
    assert Task.objects.get(pk=1).status == TaskStatus.REVIEW and not Goal.objects.exists()


@pytest.mark.parametrize(("method", "path", "body"), ENDPOINTS, ids=IDS)
def test_without_the_permission_it_is_403_and_changes_nothing(method, path, body, powerless):
    TaskFactory(pk=1, status=TaskStatus.REVIEW)
    response = call(powerless, method, path, body)
    assert response.status_code == 403, response.content
    data = error_of(response)
    assert data["code"] == "permission_denied" and "nobody lacks" in data["message"]
    assert Task.objects.get(pk=1).status == TaskStatus.REVIEW and not Goal.objects.exists()


def test_an_inactive_persons_token_is_refused():
    user = UserFactory(username="gone", is_superuser=True)
    secret = token_create(user=user, name="t").secret
    user.is_active = False
    user.save()
    assert error_of(ApiClient(secret).get("/api/tasks"))["code"] == "token_revoked"


def test_other_schemes_are_refused():
    user = UserFactory(username="basic", is_superuser=True)
    secret = token_create(user=user, name="t").secret
    response = ApiClient(None).get("/api/tasks", headers={"Authorization": f"Basic {secret}"})
    assert response.status_code == 401


def test_a_session_is_not_enough(client):
    """The console's session cookie does not open the API: scripts use tokens (and no CSRF
    token is needed, or accepted, in its place)."""
    client.force_login(UserFactory(username="staff", is_superuser=True))
    assert client.get("/api/tasks").status_code == 401


def test_use_is_recorded_at_most_once_a_minute(api):
    token = ApiToken.objects.get(user=api.user)
    assert token.last_used_at is None
    assert api.get("/api/tasks").status_code == 200
    token.refresh_from_db()
    first = token.last_used_at
    assert first is not None and first <= timezone.now()
    assert api.get("/api/tasks").status_code == 200
    token.refresh_from_db()
    assert token.last_used_at == first


def test_the_schema_and_docs_are_for_signed_in_staff_only(client):
    assert client.get("/api/openapi.json").status_code == 302
    assert client.get("/api/docs").status_code == 302
    secret = token_create(user=UserFactory(username="tok", is_superuser=True), name="t").secret
    # A token is not a staff sign-in.
    assert client.get("/api/docs", headers={"Authorization": f"Bearer {secret}"}).status_code == 302
    client.force_login(UserFactory(username="clerk", is_staff=False))
    assert client.get("/api/openapi.json").status_code == 302
    client.force_login(UserFactory(username="staffer", is_staff=True))
    schema = client.get("/api/openapi.json")
    assert schema.status_code == 200
    paths = schema.json()["paths"]
    assert "/api/tasks/{task_id}/approvals/{approval_id}/approve" in paths
    assert schema.json()["components"]["securitySchemes"]["BearerToken"]["scheme"] == "bearer"
    docs = client.get("/api/docs")
    assert docs.status_code == 200
    # The Swagger UI comes from our static files, not a CDN.
    assert "/static/ninja/" in docs.content.decode() and "cdn." not in docs.content.decode()


def test_each_action_needs_the_same_permission_as_in_the_console():
    from acthelm_site.api import endpoints
    from approvals import permissions as approval_perms
    from console import actions
    from console.views import approvals as approval_views
    from tasks import permissions as task_perms

    assert {n: e.perm for n, e in actions.REGISTRY.items()} == endpoints.ACTION_PERMS
    assert set(endpoints.ACTION_PERMS) == set(endpoints.A)
    assert endpoints.INBOX_PERMS == approval_views.INBOX_PERMS == approval_perms.INBOX_PERMS
    assert (endpoints.VIEW_TASK, endpoints.ADD_TASK) == (task_perms.VIEW_TASK, task_perms.ADD_TASK)


@pytest.mark.parametrize(
    ("perm", "allowed", "refused"),
    [
        ("tasks.operate_task", "pause", "close"),
        ("tasks.close_task", "close", "pause"),
    ],
)
def test_a_permission_opens_only_its_own_actions(perm, allowed, refused):
    from tests.api.conftest import client_for

    api = client_for("partial", ["tasks.view_task", perm])
    state = {"pause": TaskStatus.READY, "close": TaskStatus.REVIEW}
    ok = TaskFactory(status=state[allowed])
    no = TaskFactory(status=state[refused])
    assert api.post(f"/api/tasks/{ok.pk}/{allowed}").status_code == 200
    assert api.post(f"/api/tasks/{no.pk}/{refused}").status_code == 403
    assert Task.objects.get(pk=no.pk).status == state[refused]


def test_an_action_taken_with_a_token_records_which_token(api):
    """Issue 21 item 5: the event names the token (id and prefix), never its secret."""
    from tasks.models import TaskEvent

    task = TaskFactory(status=TaskStatus.READY)
    response = api.post(f"/api/tasks/{task.pk}/pause")
    assert response.status_code == 200, response.content
    token = ApiToken.objects.get(user=api.user)
    event = TaskEvent.objects.filter(task=task, actor_user=api.user).latest("pk")
    assert event.data["api_token"] == {"id": token.pk, "prefix": token.prefix}
    assert api.token not in str(event.data)


def test_a_token_of_a_person_who_lost_staff_status_is_refused(api):
    type(api.user).objects.filter(pk=api.user.pk).update(is_staff=False)
    response = api.get("/api/tasks")
    assert response.status_code == 401
    assert error_of(response)["code"] == "token_holder_not_allowed"
