"""Admin: registering an MCP server with the same checks as the command; filling prices."""

import json
import sys
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import call_command

from agents.models import Model, ToolServer
from tests.factories import ConnectionFactory, ModelFactory, UserFactory


@pytest.fixture(autouse=True)
def allowed_executables(settings):
    """The fake server's interpreter is what an operator allowed (issue 21 item 3); its test
    credential's name too (core.credentials)."""
    settings.ACTHELM_MCP_EXECUTABLES = [sys.executable, "x"]
    settings.ACTHELM_CREDENTIAL_PREFIXES = ["ACTHELM_KEY_", "MCP_TEST_"]


@pytest.fixture
def admin_client(client, db):
    user = UserFactory(
        username="admin-ops",
        is_staff=True,
        perms=[
            "agents.manage_toolservers",
            "agents.manage_connections",
            "agents.add_toolserver",
            "agents.change_toolserver",
            "agents.view_toolserver",
            "agents.change_model",
            "agents.view_model",
        ],
    )
    client.force_login(user)
    return client


def test_admin_adds_a_server_and_its_test_runs_on_a_worker_host(admin_client, tmp_path):
    """Test never starts a stdio server's command in the web process (issue 21 item 3): the
    admin says where to run it, and `acthelm_toolserver test` there records the tools."""
    marker = tmp_path / "started"
    response = admin_client.post(
        "/admin/agents/toolserver/add/",
        {
            "name": "local",
            "transport": "stdio",
            "command": json.dumps(
                [sys.executable, "-c", f"open({str(marker)!r}, 'w')", "-m", "tests.fakes.x"]
            ),
            "url": "",
            "credential_env": "MCP_TEST_TOKEN",
            "timeout_seconds": "20",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    server = ToolServer.objects.get(name="local")
    assert server.created_by.username == "admin-ops" == server.changed_by.username
    response = admin_client.post(
        "/admin/agents/toolserver/",
        {"action": "test_servers", "_selected_action": [server.pk]},
        follow=True,
    )
    assert "acthelm_toolserver test local" in response.content.decode()
    assert "test_on_worker" in response.content.decode()
    assert not marker.exists()
    server.refresh_from_db()
    assert server.test_status == "untested"

    ToolServer.objects.filter(pk=server.pk).update(
        command=[sys.executable, "-m", "tests.fakes.mcp_server"]
    )
    call_command("acthelm_toolserver", "--user", "admin-ops", "test", "local", stdout=StringIO())
    server.refresh_from_db()
    assert server.test_status == "passed" and any(t["name"] == "echo" for t in server.tools)


@pytest.mark.parametrize(
    "field, value", [("name", "a__b"), ("credential_env", "sk-live-123"), ("name", "Bad")]
)
def test_admin_refuses_what_the_service_refuses(admin_client, field, value):
    data = {
        "name": "ok",
        "transport": "stdio",
        "command": '["x"]',
        "url": "",
        "credential_env": "",
        "timeout_seconds": "20",
    } | {field: value}
    response = admin_client.post("/admin/agents/toolserver/add/", data)
    assert response.status_code == 200  # the form again, with the error
    assert not ToolServer.objects.exists()


def test_admin_fill_prices_action(admin_client):
    conn = ConnectionFactory(kind="anthropic", base_url="https://api.anthropic.com")
    model = ModelFactory(connection=conn, name="claude-sonnet-4-5")
    response = admin_client.post(
        "/admin/agents/model/", {"action": "fill_prices", "_selected_action": [model.pk]}
    )
    assert response.status_code == 302
    model = Model.objects.get(pk=model.pk)
    assert model.price_input_per_mtok > Decimal(0)
    assert model.prices_source == "genai-prices"


def test_a_person_enters_every_price_on_the_model_page_and_the_test_stands(admin_client):
    from decimal import Decimal

    from django.urls import reverse

    from agents.models import Model
    from tests.factories import ModelFactory
    from tests.hostile.test_admin_edits import _edit

    model = ModelFactory(test_status="passed")
    url = reverse("admin:agents_model_change", args=[model.pk])
    prices = {
        "price_input_per_mtok": "3",
        "price_output_per_mtok": "15",
        "price_cached_input_per_mtok": "0.3",
        "price_cache_write_per_mtok": "3.75",
        "prices_source": "a person",
    }
    assert _edit(admin_client, url, **prices).status_code == 302
    model = Model.objects.get(pk=model.pk)
    assert model.price_cached_input_per_mtok == Decimal("0.3")
    assert model.price_cache_write_per_mtok == Decimal("3.75")
    assert (model.prices_source, model.test_status) == ("a person", "passed")


# -- who may register what a stdio server runs (issue 21 item 3) --------------------------------

SHELL = ["sh", "-c", "id > /tmp/acthelm-pwned; env >> /tmp/acthelm-pwned"]


def _form(**fields) -> dict:
    return {
        "name": "shell",
        "transport": "stdio",
        "command": json.dumps(SHELL),
        "url": "",
        "credential_env": "",
        "timeout_seconds": "20",
    } | fields


@pytest.fixture
def toolserver_staff(client, db):
    """A staff user holding only the permission to manage tool servers."""
    user = UserFactory(username="tools-only", is_staff=True, perms=["agents.manage_toolservers"])
    client.force_login(user)
    return client


def test_a_staff_user_with_only_the_permission_cannot_register_a_shell(toolserver_staff):
    response = toolserver_staff.post("/admin/agents/toolserver/add/", _form())
    assert response.status_code == 200  # the form again, with the error on the command
    assert "executable_not_allowed" in response.content.decode()
    assert response.context["adminform"].form.errors["command"]
    assert not ToolServer.objects.exists()


def test_a_superuser_can_register_a_stdio_command(client, db):
    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(root)
    response = client.post("/admin/agents/toolserver/add/", _form())
    assert response.status_code == 302, response.content[:2000]
    server = ToolServer.objects.get(name="shell")
    assert server.command == SHELL and server.created_by == root


def test_a_staff_user_cannot_turn_an_allowed_server_into_a_shell(toolserver_staff, settings):
    from agents.catalogue.toolservers import toolserver_add
    from core.actors import Actor

    root = UserFactory(username="root", is_staff=True, is_superuser=True)
    server = toolserver_add(
        actor=Actor.person(root), name="shell", transport="stdio", command=["x", "--serve"]
    )
    response = toolserver_staff.post(
        f"/admin/agents/toolserver/{server.pk}/change/", _form(name="shell")
    )
    assert response.status_code == 200
    assert response.context["adminform"].form.errors["command"]
    server.refresh_from_db()
    assert server.command == ["x", "--serve"] and server.changed_by == root


def test_an_edit_of_what_the_server_reaches_resets_its_test(toolserver_staff):
    server = ToolServer.objects.create(
        name="remote",
        transport="http",
        url="http://127.0.0.1:9/mcp",
        test_status="passed",
        tools=[{"name": "echo"}],
        test_message="1 tools listed",
    )
    response = toolserver_staff.post(
        f"/admin/agents/toolserver/{server.pk}/change/",
        _form(name="remote", transport="http", command="[]", url="http://127.0.0.1:9/other"),
    )
    assert response.status_code == 302, response.content[:3000]
    server.refresh_from_db()
    assert (server.url, server.test_status, server.tools) == (
        "http://127.0.0.1:9/other",
        "untested",
        [],
    )
    assert server.changed_by.username == "tools-only" and server.changed_at is not None
