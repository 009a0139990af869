"""A credential goes only where the operator says (issue 32, item 4).

A staff user holding only `agents.manage_toolservers` added an HTTP tool server at a URL of their
choosing with `credential_env=OPENAI_API_KEY` (then `ACTHELM_KEY_GITHUB`), pressed Test, and the
web process sent `Authorization: Bearer sk-…` there. Each credential is now bound to the
destinations of ACTHELM_CREDENTIAL_DESTINATIONS (core.credentials.credential_for): a
tool server, a connection and a webhook target whose credential may not go to their URL are
refused when saved through the forms people use, when tested, and when used; a loopback receiver
the test runs sees no credential. An allowed destination still gets it, and a redirect never
carries it to another host.
"""

import os
import subprocess
import sys
import time

import pytest
from django.urls import reverse

from agents.catalogue.connections import provider_for
from agents.catalogue.providers import ProviderError, build_provider
from agents.catalogue.providers import _http as provider_http
from agents.catalogue.tools.base import ToolError
from agents.catalogue.tools.mcp import list_tools
from agents.catalogue.toolservers import find_mcp_tool, server_spec
from agents.checks import check_credential_destinations
from agents.models import Connection, ConnectionTest, ToolServer
from core.credentials import (
    CREDENTIAL_DESTINATION_NOT_ALLOWED,
    WELL_KNOWN_DESTINATIONS,
    credential_for,
    credential_refusal,
    parse_destinations,
)
from tasks.notify.models import NotificationTarget
from tests.conftest import ROOT
from tests.factories import ConnectionFactory, ModelFactory, UserFactory
from tests.fakes.http_target import HttpTarget
from tests.fakes.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.django_db

SECRET = "sk-live-0123456789abcdefSECRET"
# Names the suite does not list (tests/conftest.py): OPENAI_API_KEY keeps its default,
# api.openai.com; ACTHELM_KEY_GITHUB has no entry at all.
UNLISTED = ["OPENAI_API_KEY", "ACTHELM_KEY_GITHUB"]
SERVER_ADD = "/admin/agents/toolserver/add/"
SERVER_LIST = "/admin/agents/toolserver/"
TARGET_ADD = "/admin/tasks/notificationtarget/add/"
TARGET_LIST = "/admin/tasks/notificationtarget/"


@pytest.fixture
def receiver():
    with HttpTarget() as target:
        yield target


@pytest.fixture
def secrets(monkeypatch):
    for name in UNLISTED:
        monkeypatch.setenv(name, SECRET)


def allow(settings, name: str, *destinations: str) -> None:
    settings.ACTHELM_CREDENTIAL_DESTINATIONS = dict(settings.ACTHELM_CREDENTIAL_DESTINATIONS) | {
        name: destinations
    }


def credentials_seen(target: HttpTarget) -> list[str]:
    """Every Authorization header the receiver got, and any request carrying the value."""
    seen = [r.headers["authorization"] for r in target.requests if "authorization" in r.headers]
    seen += [r.target for r in target.requests if SECRET in str(r.headers) + r.target]
    return seen


def staff_client(client, username: str, perms: list[str]):
    client.force_login(UserFactory(username=username, is_staff=True, perms=perms))
    return client


@pytest.fixture
def toolserver_staff(client):
    """A staff user holding only the permission to manage tool servers (the issue's user)."""
    return staff_client(client, "tools-only", ["agents.manage_toolservers"])


@pytest.fixture
def connection_staff(client):
    return staff_client(client, "connections-only", ["agents.manage_connections"])


@pytest.fixture
def target_staff(client, settings):
    settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]  # the receiver runs on loopback
    return staff_client(
        client,
        "hooks-only",
        [
            "tasks.add_notificationtarget",
            "tasks.change_notificationtarget",
            "tasks.view_notificationtarget",
        ],
    )


def server_form(url: str, credential_env: str) -> dict:
    return {
        "name": "grab",
        "transport": "http",
        "command": "[]",
        "url": url,
        "credential_env": credential_env,
        "timeout_seconds": "5",
    }


def connection_form(base_url: str, credential_env: str) -> dict:
    return {
        "name": "grab",
        "kind": "openai_compatible",
        "base_url": base_url,
        "credential_env": credential_env,
        "cost_tier": "zero_cost",
        "priority": "0",
        "timeout_seconds": "5",
        "models": "m",
    }


def target_form(url: str, secret_env: str) -> dict:
    return {
        "name": "grab",
        "kind": "webhook",
        "address": url,
        "secret_env": secret_env,
        "events": "review",
        "enabled": "on",
    }


# -- tool servers -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", UNLISTED)
def test_a_tool_server_whose_credential_may_not_go_to_its_url_is_refused_in_the_admin(
    toolserver_staff, receiver, secrets, name
):
    response = toolserver_staff.post(SERVER_ADD, server_form(receiver.url + "/mcp", name))
    page = response.content.decode()
    assert response.status_code == 200  # the form again, with the error
    assert CREDENTIAL_DESTINATION_NOT_ALLOWED in page
    assert f"may not be sent to 127.0.0.1:{receiver.port}" in page
    assert not ToolServer.objects.exists()
    assert receiver.total == 0 and SECRET not in page


@pytest.mark.parametrize("name", UNLISTED)
def test_a_tool_server_written_around_the_rule_sends_nothing_at_test_or_use(
    toolserver_staff, receiver, secrets, name, tmp_path
):
    server = ToolServer.objects.create(
        name="grab",
        transport="http",
        url=receiver.url + "/mcp",
        credential_env=name,
        tools=[{"name": "echo", "input_schema": {"type": "object"}}],
    )
    response = toolserver_staff.post(
        SERVER_LIST, {"action": "test_servers", "_selected_action": [server.pk]}, follow=True
    )
    page = response.content.decode()
    assert CREDENTIAL_DESTINATION_NOT_ALLOWED in page and SECRET not in page
    server.refresh_from_db()
    assert server.test_status == "failed"
    assert server.test_message.startswith(CREDENTIAL_DESTINATION_NOT_ALLOWED)
    # The worker's use: the resolver's tool refuses, and the spec itself refuses (the one door).
    tool = find_mcp_tool("grab__echo")
    with pytest.raises(ToolError) as refused:
        tool.run(tool.parse({}), None)
    assert refused.value.code == CREDENTIAL_DESTINATION_NOT_ALLOWED
    with pytest.raises(ToolError) as refused:
        list_tools(server_spec(server))
    assert refused.value.code == CREDENTIAL_DESTINATION_NOT_ALLOWED
    assert receiver.total == 0 and credentials_seen(receiver) == []


def test_an_allowed_destination_gets_the_credential_and_a_redirect_does_not_carry_it(
    toolserver_staff, receiver, secrets, settings
):
    allow(settings, "OPENAI_API_KEY", f"127.0.0.1:{receiver.port}")
    with HttpTarget() as elsewhere:
        receiver.redirect("/mcp", elsewhere.url + "/mcp", status=307)
        response = toolserver_staff.post(
            SERVER_ADD, server_form(receiver.url + "/mcp", "OPENAI_API_KEY")
        )
        assert response.status_code == 302, response.content.decode()[:3000]
        server = ToolServer.objects.get(name="grab")
        toolserver_staff.post(
            SERVER_LIST, {"action": "test_servers", "_selected_action": [server.pk]}
        )
        assert f"Bearer {SECRET}" in credentials_seen(receiver)
        assert elsewhere.total == 0  # the 307 was not followed, with or without the key
    server.refresh_from_db()
    assert server.test_status == "failed"  # not an MCP server; the point is where the key went


# -- connections ------------------------------------------------------------------------------


def press_test_and_wait(client, conn) -> str:
    """Press the connection's Test and wait for the test, which runs in the background, to
    end; the progress fragment the page then shows."""
    client.post(reverse("agents:connection_test", args=[conn.pk]))
    progress = reverse("agents:connection_test_progress", args=[conn.pk])
    end = time.monotonic() + 15
    while time.monotonic() < end:
        if ConnectionTest.objects.filter(connection=conn, finished_at__isnull=False).exists():
            return client.get(progress).content.decode()
        time.sleep(0.05)
    raise AssertionError("the connection's test did not end")


@pytest.mark.django_db(transaction=True)  # the console's test runs in a thread of its own
@pytest.mark.parametrize("name", UNLISTED)
def test_a_connection_whose_credential_may_not_go_to_its_url_is_refused_and_sends_nothing(
    connection_staff, receiver, secrets, name
):
    response = connection_staff.post(
        reverse("agents:connection_add"), connection_form(receiver.url + "/v1", name)
    )
    page = response.content.decode()
    assert response.status_code == 400 and CREDENTIAL_DESTINATION_NOT_ALLOWED in page
    assert not Connection.objects.exists()
    # A row written around the rule: its test and its provider send nothing.
    conn = ConnectionFactory(name="grab", base_url=receiver.url + "/v1", credential_env=name)
    model = ModelFactory(connection=conn, name="m", supports_tools=False)
    page = press_test_and_wait(connection_staff, conn)
    assert CREDENTIAL_DESTINATION_NOT_ALLOWED in page and SECRET not in page
    model.refresh_from_db()
    assert model.test_status == "failed" and model.test_message.startswith("provider_config")
    provider = provider_for(conn)
    assert provider.api_key is None
    with pytest.raises(ProviderError) as refused:
        provider_http.request(provider, "GET", receiver.url + "/v1/models", headers={})
    assert refused.value.code == "provider_config"
    assert CREDENTIAL_DESTINATION_NOT_ALLOWED in refused.value.message
    assert receiver.total == 0 and credentials_seen(receiver) == []


@pytest.mark.django_db(transaction=True)
def test_a_connection_at_an_allowed_destination_sends_its_key_there_only(
    connection_staff, receiver, secrets, settings
):
    allow(settings, "OPENAI_API_KEY", f"127.0.0.1:{receiver.port}")
    with HttpTarget() as elsewhere:
        for path in ("/v1/chat/completions", "/v1/models"):
            receiver.redirect(path, elsewhere.url + path, status=307)
        response = connection_staff.post(
            reverse("agents:connection_add"),
            connection_form(receiver.url + "/v1", "OPENAI_API_KEY"),
        )
        assert response.status_code == 302, response.content.decode()[:3000]
        conn = Connection.objects.get(name="grab")
        press_test_and_wait(connection_staff, conn)
        assert f"Bearer {SECRET}" in credentials_seen(receiver)
        assert elsewhere.total == 0
        # The key was released for the base URL's host and port: a request built elsewhere
        # is refused before anything is sent.
        provider = provider_for(conn)
        with pytest.raises(ProviderError) as refused:
            provider_http.request(provider, "GET", elsewhere.url + "/v1/models", headers={})
        assert CREDENTIAL_DESTINATION_NOT_ALLOWED in refused.value.message
        assert elsewhere.total == 0


def test_a_provider_built_with_a_key_never_sends_it_off_its_base_url(receiver):
    provider = build_provider(
        "openai_compatible", base_url="http://127.0.0.1:9/v1", api_key=SECRET, timeout=5
    )
    with pytest.raises(ProviderError) as refused:
        provider_http.request(provider, "GET", receiver.url + "/v1/models", headers={})
    assert refused.value.code == "provider_config" and receiver.total == 0


# -- webhook targets --------------------------------------------------------------------------


@pytest.mark.parametrize("name", UNLISTED)
def test_a_webhook_whose_secret_may_not_go_to_its_url_is_refused_and_signs_nothing(
    target_staff, secrets, name
):
    with WebhookReceiver(secret=SECRET) as hook:
        response = target_staff.post(TARGET_ADD, target_form(hook.url, name))
        page = response.content.decode()
        assert response.status_code == 200 and CREDENTIAL_DESTINATION_NOT_ALLOWED in page
        assert not NotificationTarget.objects.exists()
        target = NotificationTarget.objects.create(
            name="grab", kind="webhook", address=hook.url, secret_env=name
        )
        response = target_staff.post(
            TARGET_LIST, {"action": "send_test", "_selected_action": [target.pk]}, follow=True
        )
        assert CREDENTIAL_DESTINATION_NOT_ALLOWED in response.content.decode()
        assert hook.received == []


def test_a_webhook_at_an_allowed_destination_is_signed(target_staff, secrets, settings):
    with WebhookReceiver(secret=SECRET) as hook:
        allow(settings, "ACTHELM_KEY_GITHUB", f"127.0.0.1:{hook.httpd.server_address[1]}")
        response = target_staff.post(TARGET_ADD, target_form(hook.url, "ACTHELM_KEY_GITHUB"))
        assert response.status_code == 302, response.content.decode()[:3000]
        target = NotificationTarget.objects.get(name="grab")
        target_staff.post(TARGET_LIST, {"action": "send_test", "_selected_action": [target.pk]})
        assert [r.signature_ok for r in hook.received] == [True]


# -- the rule itself --------------------------------------------------------------------------


def test_the_setting_reads_hosts_ports_wildcards_addresses_and_programs():
    table = parse_destinations(
        "ACTHELM_KEY_GH = api.github.com, *.githubusercontent.com:443 ;"
        "\nACTHELM_KEY_LOCAL=127.0.0.1,[::1]:8080,exec:codex;OPENAI_API_KEY="
    )
    assert table["OPENAI_API_KEY"] == ()  # listed with nothing: it goes nowhere
    assert table["ACTHELM_KEY_GH"] == ("api.github.com", "*.githubusercontent.com:443")
    for bad in ("X=*", "X=https://api.example.com/v1", "X", "X=a.*.com", "X=::1", "X=h:0", "1X=h"):
        with pytest.raises(ValueError):
            parse_destinations(bad)
    with pytest.raises(ValueError, match="listed twice"):
        parse_destinations("X=a.example.com;X=b.example.com")


@pytest.mark.parametrize(
    "name, destination, allowed",
    [
        ("ACTHELM_KEY_GH", "https://api.github.com/mcp", True),
        ("ACTHELM_KEY_GH", "http://api.github.com:8080/", True),  # a host without port: any
        ("ACTHELM_KEY_GH", "https://raw.githubusercontent.com/x", True),
        ("ACTHELM_KEY_GH", "https://a.b.githubusercontent.com/x", True),
        ("ACTHELM_KEY_GH", "https://githubusercontent.com/x", False),  # not the domain itself
        ("ACTHELM_KEY_GH", "http://raw.githubusercontent.com/x", False),  # port 80, not 443
        ("ACTHELM_KEY_GH", "https://api.github.com.evil.example/", False),
        ("ACTHELM_KEY_GH", "https://api.github.com@evil.example/", False),  # user info
        ("ACTHELM_KEY_GH", "https://API.GITHUB.COM./", True),
        ("ACTHELM_KEY_LOCAL", "http://127.1:9/", True),  # the same address in another spelling
        ("ACTHELM_KEY_LOCAL", "http://[::1]:8080/", True),
        ("ACTHELM_KEY_LOCAL", "http://[::1]:8081/", False),
        ("ACTHELM_KEY_LOCAL", "http://localhost:9/", False),  # a name is not an address
        ("ACTHELM_KEY_LOCAL", "exec:codex", True),
        ("ACTHELM_KEY_LOCAL", "exec:/usr/bin/codex", False),  # command[0] exactly
        ("ACTHELM_KEY_LOCAL", "file:///etc/passwd", False),
        ("ACTHELM_KEY_NOWHERE", "https://api.github.com/", False),  # no entry: nowhere
        ("OPENAI_API_KEY", "https://api.openai.com/v1", True),  # the default
        ("OPENAI_API_KEY", "http://127.0.0.1:9/v1", False),
    ],
)
def test_a_credential_goes_only_to_a_listed_destination(
    settings, monkeypatch, name, destination, allowed
):
    settings.ACTHELM_CREDENTIAL_DESTINATIONS = dict(WELL_KNOWN_DESTINATIONS) | parse_destinations(
        "ACTHELM_KEY_GH=api.github.com,*.githubusercontent.com:443;"
        "ACTHELM_KEY_LOCAL=127.0.0.1,[::1]:8080,exec:codex"
    )
    monkeypatch.setenv(name, SECRET)
    refusal = credential_refusal(name, destination)
    assert (refusal is None) is allowed, refusal
    if allowed:
        assert credential_for(name, destination) == SECRET
    else:
        assert refusal.code == CREDENTIAL_DESTINATION_NOT_ALLOWED
        assert SECRET not in refusal.message


def test_a_server_secret_is_refused_by_name_before_any_destination(settings):
    allow(settings, "DJANGO_SECRET_KEY", "127.0.0.1")
    assert credential_refusal("DJANGO_SECRET_KEY", "http://127.0.0.1/").code == (
        "credential_not_allowed"
    )


def test_a_malformed_setting_stops_the_server_at_start_up_with_a_clear_error():
    env = dict(os.environ)
    env.update(
        ACTHELM_CREDENTIAL_DESTINATIONS="OPENAI_API_KEY=*",
        DATABASE_URL="postgresql://nobody@127.0.0.1:1/unused",  # never connected to
        DJANGO_SETTINGS_MODULE="acthelm_site.settings",
    )
    done = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert "ImproperlyConfigured: ACTHELM_CREDENTIAL_DESTINATIONS: '*': list the hosts" in (
        done.stderr
    )


def test_the_system_check_refuses_a_malformed_value_from_a_settings_file(settings):
    settings.ACTHELM_CREDENTIAL_DESTINATIONS = {"OPENAI_API_KEY": ["https://api.openai.com/v1"]}
    errors = check_credential_destinations()
    assert [e.id for e in errors] == ["acthelm.E010"]
    assert "not a URL" in errors[0].msg
    settings.ACTHELM_CREDENTIAL_DESTINATIONS = {"OPENAI_API_KEY": ["api.openai.com"]}
    assert check_credential_destinations() == []
