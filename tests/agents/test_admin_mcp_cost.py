"""Admin: registering an MCP server with the same checks as the command; filling prices."""

import sys
from decimal import Decimal

import pytest

from agents.models import Model, ToolServer
from tests.factories import ConnectionFactory, ModelFactory, UserFactory


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


def test_admin_adds_and_tests_a_server(admin_client):
    response = admin_client.post(
        "/admin/agents/toolserver/add/",
        {
            "name": "local",
            "transport": "stdio",
            "command": f'["{sys.executable}", "-m", "tests.fakes.mcp_server"]',
            "url": "",
            "credential_env": "MCP_TEST_TOKEN",
            "timeout_seconds": "20",
        },
    )
    assert response.status_code == 302, response.content[:2000]
    server = ToolServer.objects.get(name="local")
    response = admin_client.post(
        "/admin/agents/toolserver/",
        {"action": "test_servers", "_selected_action": [server.pk]},
    )
    assert response.status_code == 302
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
