"""acthelm_connection test: a real request against real peers; pass/fail and the window recorded."""

import json
import sys

import pytest

from agents.catalogue.connections import connection_add, connection_test
from agents.models import Connection, Model
from core.actors import Actor
from core.exceptions import InvalidInput, NotPermitted
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


def test_a_cli_connection_test_runs_the_command(actor, tmp_path, settings):
    settings.ACTHELM_CLI_EXECUTABLES = [sys.executable]  # the actor is not a superuser
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


def test_the_command_exits_non_zero_when_a_model_fails(
    manage_process, transactional_db, model_server
):
    manage = manage_process  # a real process: the exit status a script sees
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


# -- issue 13, item 18: the test proves what it claims ---------------------------------------------


def _probe_connection(actor, server, flavor):
    kind = "openai_compatible" if flavor == "openai" else "anthropic"
    url = server.url if flavor == "openai" else server.root_url
    return connection_add(
        actor=actor, name=f"probe-{flavor}", kind=kind, base_url=url, models=[{"name": "small"}]
    )


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_an_empty_answer_fails_the_test(model_server, actor, flavor):
    server = model_server([reply_text(""), reply_tool_calls([("ping", {})])], flavor=flavor)
    _probe_connection(actor, server, flavor)
    [result] = connection_test(actor=actor, name=f"probe-{flavor}")
    model = Model.objects.get(name="small")
    assert not result["ok"] and model.test_status == "failed"
    assert "empty text" in model.test_message


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_a_model_that_ignores_the_probe_tool_is_recorded_as_not_tool_capable(
    model_server, actor, flavor
):
    server = model_server([reply_text("OK"), reply_text("I would rather not.")], flavor=flavor)
    _probe_connection(actor, server, flavor)
    [result] = connection_test(actor=actor, name=f"probe-{flavor}")
    model = Model.objects.get(name="small")
    assert any(r.json.get("tools") for r in server.completion_requests)
    assert result["ok"] and model.test_status == "passed"
    assert model.supports_tools is False and result["supports_tools"] is False
    assert "did not call the probe tool" in model.test_message
    assert "NOT tool-capable" in model.test_message
    assert "tool calling works" not in model.test_message
    assert model.tools_override_by is None
    # A task with tools is then refused on this model.
    from agents.catalogue.connections import model_check_for_task
    from tests.factories import TaskFactory

    check = model_check_for_task(task=TaskFactory(tools=["read_file"]), model=model)
    assert not check.ok and "does not support tool calling" in check.problems[0]


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_a_model_that_calls_the_probe_tool_is_tool_capable(model_server, actor, flavor):
    server = model_server([reply_text("OK"), reply_tool_calls([("ping", {})])], flavor=flavor)
    _probe_connection(actor, server, flavor)
    [result] = connection_test(actor=actor, name=f"probe-{flavor}")
    model = Model.objects.get(name="small")
    assert result["ok"] and model.supports_tools is True
    assert "ping was called" in model.test_message


# -- issue 52: the test says whether the server streams -------------------------------------------

STREAM_REFUSED = {
    "openai": {"error": {"message": "Unrecognized request argument supplied: stream"}},
    "anthropic": {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": "stream: Extra inputs are not permitted",
        },
    },
}
PING = reply_tool_calls([("ping", {})])


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@pytest.mark.parametrize(
    ("server_kwargs", "script", "streams", "note"),
    [
        ({}, [reply_text("OK"), PING], True, "streamed answers work"),
        ({"streams": False}, [reply_text("OK"), PING], False, "came back whole"),
        ({}, ["refused", reply_text("OK"), PING], False, "turns are asked whole"),
        (
            {},
            [reply_text("OK", cut_after=1), reply_text("OK"), PING],
            False,
            "a streamed request failed",
        ),
    ],
    ids=["streams", "answers-whole", "refuses-stream", "broken-stream"],
)
def test_the_connection_test_records_whether_the_server_streams(
    model_server, actor, flavor, server_kwargs, script, streams, note
):
    script = [reply_error(400, STREAM_REFUSED[flavor]) if s == "refused" else s for s in script]
    server = model_server(script, flavor=flavor, **server_kwargs)
    _probe_connection(actor, server, flavor)
    [result] = connection_test(actor=actor, name=f"probe-{flavor}")
    model = Model.objects.get(name="small")
    assert result["ok"] and model.test_status == "passed" and model.supports_tools
    assert model.streams is streams and result["streams"] is streams
    assert note in model.test_message and "ping was called" in model.test_message
    assert server.completion_requests[0].json["stream"] is True  # a streamed request was tried
    assert not server.remaining_steps  # the script as written: a request each step


def test_a_failed_test_cannot_tell_whether_the_server_streams(model_server, actor):
    server = model_server([reply_error(401)])
    _probe_connection(actor, server, "openai")
    Model.objects.filter(name="small").update(streams=False)  # an older test's finding
    [result] = connection_test(actor=actor, name="probe-openai")
    model = Model.objects.get(name="small")
    assert not result["ok"] and model.streams is None and result["streams"] is None
    assert len(server.completion_requests) == 1  # an auth error is not asked again whole


def test_the_override_flag_keeps_a_model_tool_capable_and_records_who(
    manage, transactional_db, model_server
):
    from tests.factories import UserFactory

    ops = UserFactory(username="ops", is_superuser=True)
    server = model_server([reply_text("OK"), reply_text("no tools for me")] * 2)
    manage(
        "acthelm_connection", "add", "llama", "--kind", "openai_compatible",
        "--base-url", server.url, "--model", "small", check=True,
    )  # fmt: skip
    result = manage("acthelm_connection", "--json", "test", "llama", "--override-tools")
    assert result.returncode == 0, result.stderr
    [row] = json.loads(result.stdout)
    model = Model.objects.get(name="small")
    assert model.supports_tools is True and row["supports_tools"] is True
    assert model.tools_override_by == ops and model.tools_override_at is not None
    assert row["tools_override_by"] == "ops" and "explicit override of ops" in row["message"]
    # Without the flag, a second test keeps the person's override (it is on the row).
    again = json.loads(manage("acthelm_connection", "--json", "test", "llama").stdout)
    assert again[0]["supports_tools"] is True and "explicit override" in again[0]["message"]


def test_the_admin_action_overrides_the_probe_with_who_did_it(model_server, actor, admin_client):
    from django.urls import reverse

    server = model_server([reply_text("OK"), reply_text("nope")] * 2)
    _probe_connection(actor, server, "openai")
    connection_test(actor=actor, name="probe-openai")
    model = Model.objects.get(name="small")
    assert model.supports_tools is False
    admin_client.post(
        reverse("admin:agents_model_changelist"),
        {"action": "override_tools", "_selected_action": [model.pk]},
        follow=True,
    )
    model.refresh_from_db()
    assert model.supports_tools is True and model.tools_override_by.username == "admin"
    [result] = connection_test(actor=actor, name="probe-openai")
    assert result["supports_tools"] is True and "explicit override of admin" in result["message"]


def test_a_person_sets_a_models_prices_from_the_command(manager_actor_user):
    from decimal import Decimal
    from io import StringIO

    from django.core.management import call_command

    from tests.factories import ConnectionFactory, ModelFactory

    model = ModelFactory(name="big", connection=ConnectionFactory(name="hosted"))
    out = StringIO()
    call_command(
        "acthelm_connection", "--user", manager_actor_user.username, "prices", "hosted",
        "--input", "3", "--output", "15", "--cached-input", "0.3", stdout=out,
    )  # fmt: skip
    assert "hosted/big: input 3.0000, output 15.0000, cached input 0.3000" in out.getvalue()
    assert "USD per million tokens (set by" in out.getvalue()
    model.refresh_from_db()
    assert model.price_output_per_mtok == Decimal("15")
    call_command(
        "acthelm_connection", "--user", manager_actor_user.username, "prices", "hosted",
        "--cached-input", "none", stdout=StringIO(),
    )  # fmt: skip
    model.refresh_from_db()
    assert model.price_cached_input_per_mtok is None and model.price_input_per_mtok == 3
    with pytest.raises(Exception, match="price from 0"):
        call_command(
            "acthelm_connection", "--user", manager_actor_user.username, "prices", "hosted",
            "--input", "-2",
        )  # fmt: skip


@pytest.fixture
def manager_actor_user(db):
    from tests.factories import UserFactory

    return UserFactory(username="pricer", perms=["agents.manage_connections"])
