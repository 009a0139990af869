"""acthelm_connection test: a real request against real peers; pass/fail and the window recorded."""

import json
import sys

import pytest

from agents.models import Connection, Model
from agents.services import connection_add, connection_test
from tasks.actors import Actor
from tasks.exceptions import InvalidInput, NotPermitted
from tests.agents.conftest import SCRIPTED_CLI
from tests.fakes.model_server import reply_error, reply_text, reply_tool_calls

pytestmark = pytest.mark.django_db


def test_an_openai_compatible_connection_passes_and_records_the_context_window(model_server, actor):
    server = model_server(
        [reply_text("OK"), reply_tool_calls([("ping", {})])],
        context_length=131072,
        model_ids=("qwen3",),
    )
    connection_add(
        actor=actor,
        name="local",
        kind="openai_compatible",
        base_url=server.url,
        cost_tier="zero_cost",
        models=[{"name": "qwen3"}],
    )
    [result] = connection_test(actor=actor, name="local")
    model = Model.objects.get(name="qwen3")
    assert result["ok"] and model.test_status == "passed" and model.tested_at
    assert model.context_window == 131072
    # A real request was made, with a tool-calling probe since the model claims tools.
    assert any(r.json.get("tools") for r in server.completion_requests)


def test_a_failing_provider_fails_the_test_with_its_code(model_server, actor):
    server = model_server([reply_error(401)] * 4)
    connection_add(
        actor=actor,
        name="bad",
        kind="openai_compatible",
        base_url=server.url,
        models=[{"name": "m"}],
    )
    [result] = connection_test(actor=actor, name="bad")
    model = Model.objects.get(name="m")
    assert not result["ok"] and model.test_status == "failed"
    assert "provider_auth" in model.test_message


def test_a_cli_connection_test_runs_the_command(actor, tmp_path):
    counter = tmp_path / "calls"
    connection_add(
        actor=actor,
        name="cli",
        kind="cli",
        command=[
            sys.executable,
            SCRIPTED_CLI,
            "--count-file",
            str(counter),
            "--mode",
            "text",
            "--text",
            "OK",
        ],
        models=[{"name": "default", "supports_tools": False}],
    )
    [result] = connection_test(actor=actor, name="cli")
    assert result["ok"] and counter.read_text().strip()


def test_the_test_needs_the_permission_and_an_existing_connection(actor, outsider):
    with pytest.raises(InvalidInput):
        connection_test(actor=actor, name="nope")
    Connection.objects.create(name="x", kind="openai_compatible", base_url="http://h/v1")
    with pytest.raises(NotPermitted):
        connection_test(actor=Actor.person(outsider), name="x")


def test_the_command_exits_non_zero_when_a_model_fails(manage, transactional_db, model_server):
    from tests.factories import UserFactory

    UserFactory(username="ops", is_superuser=True)
    server = model_server([reply_error(500)] * 6)
    manage(
        "acthelm_connection",
        "add",
        "srv",
        "--kind",
        "openai_compatible",
        "--base-url",
        server.url,
        "--model",
        "m",
        check=True,
    )
    result = manage("acthelm_connection", "--json", "test", "srv")
    assert result.returncode == 1
    assert json.loads(result.stdout)[0]["ok"] is False
