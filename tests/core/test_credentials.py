"""One credential-name rule for connections, tool servers and webhook secrets, checked when a
row is written and again when it is used (issue 21 item 4); one redaction helper (item 11)."""

import json

import pytest

from agents.catalogue.tools import ToolContext, ToolError, get_tool
from agents.catalogue.toolservers import toolserver_add, toolserver_test
from agents.models import ToolServer
from core.actors import Actor
from core.credentials import (
    CREDENTIAL_NOT_ALLOWED,
    credential_name_refusal,
    credential_problem,
    redact,
)
from core.exceptions import InvalidInput
from tasks.notify.channels import DeliveryFailed
from tasks.notify.models import NotificationTarget
from tasks.notify.targets import target_add, target_test
from tests.factories import UserFactory
from tests.fakes.http_target import HttpTarget
from tests.fakes.webhook_receiver import WebhookReceiver

SERVER_SECRETS = [
    "DJANGO_SECRET_KEY",
    "DATABASE_URL",
    "POSTGRES_PASSWORD",
    "PGPASSWORD",
    "AWS_SECRET_ACCESS_KEY",
    "EMAIL_HOST_PASSWORD",
    "OTEL_EXPORTER_OTLP_HEADERS",
    "ACTHELM_METRICS_TOKEN",
    "acthelm_metrics_token",
]


@pytest.mark.parametrize("name", SERVER_SECRETS)
def test_the_servers_own_secrets_are_refused_even_when_their_prefix_is_allowed(name):
    assert credential_name_refusal(name, ["ACTHELM_KEY_"]) is not None
    everything = ["D", "P", "A", "E", "O", "a", "DJANGO_", "ACTHELM_", "PG", "AWS_"]
    assert "own secrets" in credential_name_refusal(name, everything)


@pytest.mark.parametrize("name", ["ACTHELM_KEY_GITHUB", "OPENAI_API_KEY"])
def test_a_credential_under_an_allowed_prefix_is_accepted(name):
    assert credential_problem(name) is None


@pytest.mark.parametrize("name", ["HOME", "GITHUB_TOKEN", "sk-live-abc", "A B", ""])
def test_anything_else_is_refused(name):
    assert credential_name_refusal(name, ["ACTHELM_KEY_"]) is not None


# -- written: every kind of row refuses it ------------------------------------------------------


@pytest.fixture
def ops(db):
    return Actor.person(
        UserFactory(username="tools-ops", is_superuser=True, perms=["agents.manage_toolservers"])
    )


@pytest.mark.parametrize("name", ["DJANGO_SECRET_KEY", "DATABASE_URL"])
def test_a_tool_server_refuses_a_server_secret(ops, name):
    with pytest.raises(InvalidInput) as refused:
        toolserver_add(
            actor=ops, name="leak", transport="http", url="http://127.0.0.1:9/", credential_env=name
        )
    assert refused.value.code == CREDENTIAL_NOT_ALLOWED
    assert not ToolServer.objects.exists()


@pytest.mark.django_db
@pytest.mark.parametrize("name", ["DJANGO_SECRET_KEY", "DATABASE_URL", "GITHUB_TOKEN"])
def test_a_webhook_target_refuses_a_server_secret(name):
    with pytest.raises(InvalidInput, match=CREDENTIAL_NOT_ALLOWED):
        target_add(name="hook", kind="webhook", address="https://x.example.org/h", secret_env=name)
    assert not NotificationTarget.objects.exists()


# -- used: a row written before the rule sends nothing and says why -----------------------------


def test_a_tool_server_row_with_a_server_secret_is_never_tested(ops, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://acthelm:pw@db/acthelm")
    with HttpTarget() as target:
        server = ToolServer.objects.create(  # around the service, as an old row
            name="leak", transport="http", url=target.url + "/echo", credential_env="DATABASE_URL"
        )
        result = toolserver_test(actor=ops, name="leak")
        assert target.total == 0
    assert not result["ok"] and result["test_message"].startswith(CREDENTIAL_NOT_ALLOWED)
    server.refresh_from_db()
    assert server.test_status == "failed"


def test_a_recorded_tool_of_such_a_server_fails_without_connecting(ops, tmp_path, monkeypatch):
    monkeypatch.setenv("DJANGO_SECRET_KEY", "the-servers-own-key")
    with HttpTarget() as target:
        ToolServer.objects.create(
            name="leak",
            transport="http",
            url=target.url + "/echo",
            credential_env="DJANGO_SECRET_KEY",
            tools=[{"name": "echo", "input_schema": {"type": "object"}}],
            test_status="passed",
        )
        tool = get_tool("leak__echo")
        ctx = ToolContext(workspace=tmp_path, artifacts_dir=tmp_path / "a")
        with pytest.raises(ToolError) as refused:
            tool.run(tool.parse({}), ctx)
        assert target.total == 0
    assert refused.value.code == CREDENTIAL_NOT_ALLOWED


@pytest.mark.django_db
def test_a_webhook_row_with_a_server_secret_sends_nothing(monkeypatch):
    monkeypatch.setenv("DJANGO_SECRET_KEY", "the-servers-own-key")
    with WebhookReceiver() as receiver:
        NotificationTarget.objects.create(
            name="old", kind="webhook", address=receiver.url, secret_env="DJANGO_SECRET_KEY"
        )
        with pytest.raises(DeliveryFailed) as refused:
            target_test(name="old")
        assert receiver.received == []
    assert refused.value.code == CREDENTIAL_NOT_ALLOWED


# -- the one redaction helper (item 11) ---------------------------------------------------------

SECRET = "stdio-s3cret/value+\u00e9x"


@pytest.mark.parametrize(
    "text",
    [
        f"upstream refused token {SECRET}",
        json.dumps({"error": f"bad key {SECRET}"}),
        json.dumps({"error": f"bad key {SECRET}"}, ensure_ascii=False),
        "https://h/x?key=stdio-s3cret%2Fvalue%2B%C3%A9x",
        f"...{SECRET[:9]}",  # a clipped end
        f"{SECRET[-8:]} and more",  # a tail that starts inside the value
    ],
)
def test_redact_removes_the_value_in_every_form_a_peer_may_echo(text):
    out = redact(text, [SECRET, None, ""])
    assert "[redacted]" in out
    assert "s3cret" not in out and "value+" not in out and "lue%2B" not in out


def test_redact_leaves_short_values_and_other_text_alone():
    assert redact("a b c", ["b"]) == "a b c"
    assert redact("nothing to see", [SECRET]) == "nothing to see"
