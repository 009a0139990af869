"""The connections page: health, models and their tests, adding and testing; no credential shown."""

import time
from datetime import timedelta

import pytest
from django.test import Client
from django.urls import reverse
from django.utils import timezone

from agents.models import Connection, Model
from agents.states import ConnectionKind, ModelTestStatus
from tests.factories import ConnectionFactory, ModelFactory, UserFactory
from tests.fakes.model_server import ScriptedModelServer, reply_error, reply_text

pytestmark = pytest.mark.django_db

PAGE = "/connections/"
ADD = reverse("agents:connection_add")
SECRET = "sk-live-very-secret-value-1234"


@pytest.fixture
def manager(client):
    client.force_login(UserFactory(username="ops", perms=["agents.manage_connections"]))
    return client


def test_the_page_requires_login_and_a_permission(client):
    assert client.get(PAGE).status_code == 302
    client.force_login(UserFactory(username="plain", perms=["tasks.view_task"]))
    assert client.get(PAGE).status_code == 403


def test_connections_show_health_and_model_tests(manager):
    cooling = ConnectionFactory(
        name="groq-free",
        cooldown_until=timezone.now() + timedelta(minutes=20),
        last_error_code="provider_rate_limited",
        last_error_message="429 Too Many Requests",
        last_error_at=timezone.now(),
    )
    ModelFactory(connection=cooling, name="llama-70b", context_window=131072, streams=True)
    ModelFactory(
        connection=cooling,
        name="broken",
        test_status=ModelTestStatus.FAILED,
        test_message="provider_auth: bad key",
        context_window=None,
    )
    ModelFactory(connection=cooling, name="whole-only", streams=False)
    ConnectionFactory(name="local-ollama")
    page = manager.get(PAGE).content.decode()
    groq = page[page.index(f'id="conn-{cooling.pk}"') :]
    assert "cooling down until" in groq and "provider_rate_limited" in groq
    assert "429 Too Many Requests" in groq
    assert "llama-70b" in groq and "131072" in groq and "Passed" in groq
    assert "broken" in groq and "Failed" in groq and "provider_auth: bad key" in groq
    # Whether each model's server streams, by its test: yes, unknown (not told), no.
    rows = {name: groq[groq.index(f"<code>{name}</code>") :] for name in ("llama-70b", "broken")}
    assert rows["llama-70b"].index('data-streams="yes"') < rows["llama-70b"].index("</tr>")
    assert rows["broken"].index('data-streams="unknown"') < rows["broken"].index("</tr>")
    whole = groq[groq.index("<code>whole-only</code>") :]
    assert 'data-streams="no"' in whole[: whole.index("</tr>")] and "whole answers" in whole
    local = page[page.index("local-ollama") :]
    assert "available" in local


def test_credentials_are_never_rendered(manager, monkeypatch):
    monkeypatch.setenv("ACTHELM_KEY_TEST", SECRET)
    ConnectionFactory(
        name="paid",
        credential_env="ACTHELM_KEY_TEST",
        base_url="https://user:hunter2@api.example.com/v1?key=abc",
    )
    ConnectionFactory(
        name="cli",
        kind=ConnectionKind.CLI,
        base_url="",
        command=["claude", "--api-key", SECRET],
    )
    page = manager.get(PAGE).content.decode()
    assert "ACTHELM_KEY_TEST" in page
    assert SECRET not in page and "hunter2" not in page and "key=abc" not in page
    assert "api.example.com/v1" in page and "claude" in page


def test_add_a_connection(manager):
    response = manager.post(
        ADD,
        {
            "name": "local-vllm",
            "kind": ConnectionKind.OPENAI_COMPATIBLE,
            "base_url": "http://127.0.0.1:8001/v1",
            "credential_env": "ACTHELM_KEY_VLLM",
            "cost_tier": "zero_cost",
            "priority": "5",
            "timeout_seconds": "60",
            "models": "qwen-32b 32768\nllama-8b",
        },
    )
    assert response.status_code == 302
    conn = Connection.objects.get(name="local-vllm")
    assert conn.credential_env == "ACTHELM_KEY_VLLM" and conn.priority == 5
    models = {m.name: m for m in conn.models.all()}
    assert models["qwen-32b"].context_window == 32768 and models["llama-8b"].context_window is None
    assert all(m.test_status == ModelTestStatus.UNTESTED for m in models.values())
    assert "Connection local-vllm added" in manager.get(PAGE).content.decode()


def test_add_a_cli_connection_with_a_json_command(manager, settings):
    settings.ACTHELM_CLI_EXECUTABLES = ["claude"]  # what a person who is not a superuser may use
    manager.post(
        ADD,
        {
            "name": "claude-cli",
            "kind": ConnectionKind.CLI,
            "command": '["claude", "-p", "--output-format", "json"]',
            "answer_field": "result",
            "cost_tier": "zero_cost",
            "priority": "0",
            "timeout_seconds": "120",
            "models": "sonnet",
        },
    )
    conn = Connection.objects.get(name="claude-cli")
    assert conn.command == ["claude", "-p", "--output-format", "json"]
    assert conn.models.get().supports_tools is False


def test_adding_reports_a_refusal_and_changes_nothing(manager):
    ConnectionFactory(name="taken")
    response = manager.post(
        ADD,
        {
            "name": "taken",
            "kind": ConnectionKind.OPENAI_COMPATIBLE,
            "base_url": "http://127.0.0.1:1/v1",
            "cost_tier": "paid",
            "priority": "0",
            "timeout_seconds": "10",
            "models": "m",
        },
    )
    assert response.status_code == 400 and "exists already" in response.content.decode()
    assert Connection.objects.filter(name="taken").count() == 1
    missing_url = manager.post(
        ADD,
        {
            "name": "nourl",
            "kind": ConnectionKind.OPENAI_COMPATIBLE,
            "cost_tier": "paid",
            "priority": "0",
            "timeout_seconds": "10",
            "models": "m",
        },
    )
    assert missing_url.status_code == 400 and "needs a base URL" in missing_url.content.decode()
    assert not Connection.objects.filter(name="nourl").exists()


def test_add_and_test_need_the_manage_permission(client):
    client.force_login(UserFactory(username="looker", perms=["agents.view_connection"]))
    conn = ConnectionFactory()
    page = client.get(PAGE).content.decode()
    assert conn.name in page and 'data-action="test"' not in page and "Add a connection" not in page
    data = {"name": "x", "kind": "anthropic", "base_url": "http://h/", "models": "m"}
    assert client.post(ADD, data).status_code == 403
    test_url = reverse("agents:connection_test", args=[conn.pk])
    assert client.post(test_url).status_code == 403
    assert not Connection.objects.filter(name="x").exists()


def _progress(client, conn) -> str:
    return client.get(reverse("agents:connection_test_progress", args=[conn.pk])).content.decode()


def _until_finished(client, conn, timeout: float = 15.0) -> str:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        html = _progress(client, conn)
        if "hx-trigger" not in html:  # no longer polled: the test ended
            return html
        time.sleep(0.1)
    raise AssertionError("the test did not end")


@pytest.mark.django_db(transaction=True)  # the test runs in a thread of its own
def test_the_test_button_starts_a_background_test_whose_progress_the_page_polls(
    manager, monkeypatch
):
    monkeypatch.setenv("ACTHELM_KEY_TEST", SECRET)
    with ScriptedModelServer(flavor="openai", context_length=65536) as server:
        server.enqueue(reply_text("OK", delay=2))  # a slow model
        conn = ConnectionFactory(
            name="fake-openai", base_url=server.url, credential_env="ACTHELM_KEY_TEST"
        )
        model = ModelFactory(
            connection=conn,
            name="test-model",
            supports_tools=False,
            test_status=ModelTestStatus.UNTESTED,
            context_window=None,
        )
        url = reverse("agents:connection_test", args=[conn.pk])
        started = manager.post(url, HTTP_HX_REQUEST="true").content.decode()
        # The answer is the progress, polled every half second, before the model has answered.
        assert f'id="conn-test-{conn.pk}"' in started and 'hx-trigger="every 500ms"' in started
        assert "Testing:" in started
        deadline = time.monotonic() + 10
        while "waiting for the model" not in (html := _progress(manager, conn)):
            assert time.monotonic() < deadline, html
            time.sleep(0.05)
        assert "<code>test-model</code>" in html and " s)…" in html
        # The whole page shows the running test too, and a second click starts nothing.
        page = manager.get(PAGE).content.decode()
        assert "waiting for the model" in page
        manager.post(url, HTTP_HX_REQUEST="true")
        finished = _until_finished(manager, conn)
        assert len(server.completion_requests) == 1
    model.refresh_from_db()
    assert model.test_status == ModelTestStatus.PASSED and model.context_window == 65536
    assert "fake-openai/test-model</code> — " in finished and "passed" in finished
    assert "context window 65536" in finished and SECRET not in finished
    assert 'data-streams="yes"' in finished and "streams its answers" in finished
    assert model.streams is True
    assert 'data-test-phase="finished"' in finished


@pytest.mark.django_db(transaction=True)
def test_a_failed_test_is_shown_without_the_key(manager, monkeypatch):
    monkeypatch.setenv("ACTHELM_KEY_TEST", SECRET)
    with ScriptedModelServer(flavor="openai") as server:
        server.enqueue(reply_error(401, {"error": {"message": "bad key"}}))
        conn = ConnectionFactory(base_url=server.url, credential_env="ACTHELM_KEY_TEST")
        model = ModelFactory(connection=conn, name="test-model", supports_tools=False)
        # Without JavaScript: the page, which shows the test and polls it.
        response = manager.post(reverse("agents:connection_test", args=[conn.pk]), follow=True)
        assert f'id="conn-test-{conn.pk}"' in response.content.decode()
        finished = _until_finished(manager, conn)
    assert Model.objects.get(pk=model.pk).test_status == ModelTestStatus.FAILED
    assert 'data-test-result="failed"' in finished and "test-model</code>" in finished
    assert SECRET not in finished and SECRET not in manager.get(PAGE).content.decode()


def test_csrf_is_enforced_on_connections():
    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory(username="csrf-ops", perms=["agents.manage_connections"]))
    conn = ConnectionFactory()
    assert client.post(reverse("agents:connection_test", args=[conn.pk])).status_code == 403
    data = {"name": "y", "kind": "anthropic", "base_url": "http://h/", "models": "m"}
    assert client.post(ADD, data).status_code == 403
    assert not Connection.objects.filter(name="y").exists()


# --- Model prices (issue 24) ----------------------------------------------------------------


def test_model_prices_are_shown_and_set_from_the_console(manager, client):
    from decimal import Decimal

    model = ModelFactory(name="gpt", connection=ConnectionFactory(name="hosted"))
    url = reverse("agents:model_prices")
    page = manager.get(url)
    assert page.status_code == 200 and 'id="model-' in page.content.decode()
    form = {"model": model.pk, "price_input_per_mtok": "2.5", "price_output_per_mtok": "10"}
    response = manager.post(url, {**form, "price_cached_input_per_mtok": ""})
    assert response.status_code == 302
    model.refresh_from_db()
    assert (model.price_input_per_mtok, model.price_output_per_mtok) == (
        Decimal("2.5"),
        Decimal("10"),
    )
    assert model.price_cached_input_per_mtok is None and model.prices_source.startswith("set by")
    bad = manager.post(url, {**form, "price_output_per_mtok": "-1"})
    assert bad.status_code == 400 and "price from 0" in bad.content.decode()
    model.refresh_from_db()
    assert model.price_output_per_mtok == Decimal("10")
    # Someone who may only look sees the prices and cannot change them.
    client.force_login(UserFactory(username="looker", perms=["agents.view_connection"]))
    assert "$2.5000" in client.get(url).content.decode()
    assert client.post(url, form).status_code == 403
