"""Fixtures of the API tests: people with tokens, and a client that sends them."""

import json

import pytest
from django.test import Client

from acthelm_site.api.tokens import token_create
from agents.catalogue.tools.base import ERROR_CODES
from agents.failure_codes import FailureCode
from core.credentials import CREDENTIAL_DESTINATION_NOT_ALLOWED, CREDENTIAL_NOT_ALLOWED
from core.exceptions import ErrorCode
from tests.factories import UserFactory

ALL_PERMS = [
    "tasks.view_task",
    "tasks.add_task",
    "tasks.operate_task",
    "tasks.close_task",
    "approvals.decide_approval",
    "agents.manage_connections",
    "agents.view_agentrun",
    "tasks.view_goal",
    "tasks.add_goal",
    "tasks.change_goal",
]


class ApiClient:
    """Django's test client with a bearer token and JSON bodies."""

    def __init__(self, token: str | None):
        self.client = Client()
        self.token = token

    def _headers(self, headers):
        out = dict(headers or {})
        if self.token is not None:
            out.setdefault("Authorization", f"Bearer {self.token}")
        return out

    def get(self, path, params=None, headers=None):
        return self.client.get(path, params or {}, headers=self._headers(headers))

    def post(self, path, body=None, headers=None):
        return self.client.post(
            path,
            json.dumps(body) if body is not None else "",
            content_type="application/json",
            headers=self._headers(headers),
        )

    def patch(self, path, body=None, headers=None):
        return self.client.patch(
            path,
            json.dumps(body) if body is not None else "",
            content_type="application/json",
            headers=self._headers(headers),
        )

    def post_form(self, path, data, headers=None):
        return self.client.post(path, data, headers=self._headers(headers))

    def delete(self, path, headers=None):
        return self.client.delete(path, headers=self._headers(headers))


def client_for(username: str, perms: list[str]) -> ApiClient:
    user = UserFactory(username=username, perms=perms)
    api = ApiClient(token_create(user=user, name="tests").secret)
    api.user = user
    return api


@pytest.fixture
def api(db):
    """A person holding every permission the console's actions need."""
    return client_for("founder", ALL_PERMS)


@pytest.fixture
def powerless(db):
    """A person with a valid token and no permission at all."""
    return client_for("nobody", [])


# The codes of other registries a refusal passes on (ActhelmError.passing), answered as 400: a
# tool call's check of an edit, a model's refusal for a new task, a credential's.
PASSED_ON = (
    ERROR_CODES | set(FailureCode) | {CREDENTIAL_NOT_ALLOWED, CREDENTIAL_DESTINATION_NOT_ALLOWED}
)


def registered(code: str, status: int) -> None:
    """An error answer's code is a member of the registry and came with the member's status, or
    is a code passed on from another registry with a 400."""
    if code in ErrorCode.__members__.values():
        assert ErrorCode(code).http_status == status, (code, status)
    else:
        assert code in PASSED_ON and status == 400, (code, status)


def error_of(response) -> dict:
    """The error an answer carries: its shape, and its code registered with its status."""
    data = response.json()
    assert set(data) == {"code", "message", "field"}, data
    registered(data["code"], response.status_code)
    return data
