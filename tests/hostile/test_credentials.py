"""A connection cannot reach the server's own secrets (issue 13, item 15).

A credential names an environment variable from an allowed prefix, never DJANGO_*, DATABASE_URL,
POSTGRES_*: refused by the console, the CLI, the admin and the service, and again at use time so
that an old row never sends the value anywhere. A model CLI child sees PATH, HOME, LANG and its one
credential in a scratch directory, and may be limited to listed executables.
"""

import os
import shutil
from pathlib import Path

import pytest
from django.test import Client
from django.urls import reverse

from agents.catalogue.connections import connection_add, connection_test, provider_for
from agents.catalogue.providers import Message, ProviderError
from agents.models import Connection, Model
from core.exceptions import InvalidInput
from tests.factories import ConnectionFactory, ModelFactory
from tests.fakes.model_server import ScriptedModelServer, reply_text

pytestmark = pytest.mark.django_db

SERVER_SECRETS = ["DJANGO_SECRET_KEY", "DATABASE_URL", "POSTGRES_PASSWORD", "django_debug"]
SECRET_VALUE = "s3cret-server-value-0123456789"


def _add(actor, credential_env, **kwargs):
    return connection_add(
        actor=actor,
        name=kwargs.pop("name", "c"),
        kind=kwargs.pop("kind", "openai_compatible"),
        base_url=kwargs.pop("base_url", "http://127.0.0.1:9/v1"),
        credential_env=credential_env,
        models=[{"name": "m"}],
        **kwargs,
    )


@pytest.mark.parametrize("name", [*SERVER_SECRETS, "HOME", "AWS_SECRET_ACCESS_KEY", "sk-abc!"])
def test_the_service_refuses_a_credential_outside_the_allowed_prefixes(actor, name):
    with pytest.raises(InvalidInput) as refused:
        _add(actor, name)
    assert refused.value.code == "credential_not_allowed"
    assert not Connection.objects.exists()


@pytest.mark.parametrize(
    "name, base_url",
    [
        ("ACTHELM_KEY_LOCAL", "http://127.0.0.1:9/v1"),
        ("OPENAI_API_KEY", "https://api.openai.com/v1"),
        ("ANTHROPIC_API_KEY", "https://api.anthropic.com"),
    ],
)
def test_allowed_credential_names_are_accepted(actor, name, base_url):
    """Each at a destination allowed for it (the suite's list, the providers' own hosts)."""
    assert _add(actor, name, base_url=base_url).credential_env == name


@pytest.mark.parametrize("name", SERVER_SECRETS)
def test_a_server_secret_stays_refused_even_when_a_person_allows_its_prefix(actor, settings, name):
    settings.ACTHELM_CREDENTIAL_PREFIXES = ["DJANGO_", "DATABASE_URL", "POSTGRES_", "django_"]
    with pytest.raises(InvalidInput) as refused:
        _add(actor, name)
    assert refused.value.code == "credential_not_allowed"


def test_the_console_refuses_a_server_secret(person):
    client = Client()
    client.force_login(person)
    response = client.post(
        reverse("agents:connection_add"),
        {
            "name": "leak",
            "kind": "openai_compatible",
            "base_url": "http://127.0.0.1:9/v1",
            "credential_env": "DJANGO_SECRET_KEY",
            "cost_tier": "zero_cost",
            "priority": "0",
            "timeout_seconds": "60",
            "models": "m",
        },
    )
    assert response.status_code == 400
    assert "credential_not_allowed" in response.content.decode()
    assert not Connection.objects.filter(name="leak").exists()


def test_the_cli_refuses_a_server_secret(manage, admin_user):
    result = manage(
        "acthelm_connection",
        "add",
        "leak",
        "--kind",
        "openai_compatible",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--credential-env",
        "DATABASE_URL",
        "--model",
        "m",
    )
    assert result.returncode != 0 and "[credential_not_allowed]" in result.stderr
    assert not Connection.objects.filter(name="leak").exists()


def test_the_admin_refuses_a_server_secret(admin_client):
    response = admin_client.post(
        reverse("admin:agents_connection_add"),
        {
            "name": "leak",
            "kind": "openai_compatible",
            "base_url": "http://127.0.0.1:9/v1",
            "command": "[]",
            "credential_env": "DJANGO_SECRET_KEY",
            "cost_tier": "zero_cost",
            "priority": "0",
            "timeout_seconds": "60",
            "enabled": "on",
            "models-TOTAL_FORMS": "0",
            "models-INITIAL_FORMS": "0",
        },
    )
    assert response.status_code == 200  # the form again, with the error
    assert "can never be a credential" in response.content.decode()
    assert not Connection.objects.filter(name="leak").exists()


def test_an_old_row_naming_a_server_secret_never_sends_it(actor, monkeypatch):
    """The Test button on a row written before the rules: no request at all, provider_config."""
    monkeypatch.setenv("DJANGO_SECRET_KEY", SECRET_VALUE)
    with ScriptedModelServer([reply_text("OK")] * 4, flavor="openai") as server:
        conn = ConnectionFactory(base_url=server.url, credential_env="DJANGO_SECRET_KEY")
        ModelFactory(connection=conn, name="m", supports_tools=False, test_status="untested")
        [result] = connection_test(actor=actor, name=conn.name)
        requests = list(server.requests)
    assert not result["ok"] and "provider_config" in result["message"]
    assert requests == []
    assert SECRET_VALUE not in result["message"]
    assert Model.objects.get(connection=conn).test_status == "failed"


def test_an_old_cli_row_naming_a_server_secret_does_not_start_the_command(tmp_path, monkeypatch):
    monkeypatch.setenv("DATABASE_URL", SECRET_VALUE)
    marker = tmp_path / "ran"
    conn = ConnectionFactory(
        kind="cli",
        base_url="",
        command=[shutil.which("touch"), str(marker)],
        credential_env="DATABASE_URL",
    )
    with pytest.raises(ProviderError) as refused:
        _complete(conn)
    assert refused.value.code == "provider_config"
    assert not marker.exists()


def _complete(conn):
    return provider_for(conn).complete(
        model="m", messages=[Message(role="user", content="hi")], tools=[], max_tokens=8
    )


def test_a_cli_child_sees_only_path_home_lang_and_its_one_credential(monkeypatch):
    """A real child process runs `env`: nothing of the server's environment reaches it."""
    monkeypatch.setenv("DJANGO_SECRET_KEY", SECRET_VALUE)
    monkeypatch.setenv("DATABASE_URL", "postgresql://acthelm:" + SECRET_VALUE + "@db/acthelm")
    monkeypatch.setenv("ACTHELM_KEY_OTHER", "other-connections-key")
    monkeypatch.setenv("ACTHELM_KEY_MINE", "my-key-value")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("HOME", "/home/acthelm-test")
    conn = ConnectionFactory(
        kind="cli", base_url="", command=[shutil.which("env")], credential_env="ACTHELM_KEY_MINE"
    )
    text = _complete(conn).text
    seen = dict(line.split("=", 1) for line in text.splitlines() if "=" in line)
    assert set(seen) == {"PATH", "HOME", "LANG", "ACTHELM_KEY_MINE"}
    assert seen["ACTHELM_KEY_MINE"] == "my-key-value"
    assert seen["HOME"] == "/home/acthelm-test" and seen["PATH"] == os.environ["PATH"]
    assert SECRET_VALUE not in text and "other-connections-key" not in text


def test_a_cli_child_runs_in_a_scratch_directory_removed_afterwards():
    conn = ConnectionFactory(kind="cli", base_url="", command=[shutil.which("pwd")])
    cwd = Path(_complete(conn).text)
    assert cwd.name.startswith("acthelm-cli-")
    assert cwd != Path.cwd() and not cwd.exists()


def test_cli_executables_can_be_limited_by_a_setting(actor, settings, tmp_path):
    settings.ACTHELM_CLI_EXECUTABLES = ["llm", "/usr/local/bin/claude"]
    with pytest.raises(InvalidInput) as refused:
        _add(actor, "", kind="cli", base_url="", command=["env"])
    assert refused.value.code == "executable_not_allowed"
    assert _add(actor, "", name="ok", kind="cli", base_url="", command=["llm", "-m", "x"])
    # An older row with another executable is refused at use time; nothing starts.
    marker = tmp_path / "ran"
    conn = ConnectionFactory(kind="cli", base_url="", command=[shutil.which("touch"), str(marker)])
    with pytest.raises(ProviderError) as at_use:
        _complete(conn)
    assert at_use.value.code == "provider_config" and not marker.exists()


def test_an_empty_executable_list_allows_any(settings):
    settings.ACTHELM_CLI_EXECUTABLES = []
    conn = ConnectionFactory(kind="cli", base_url="", command=[shutil.which("echo"), "hello"])
    assert _complete(conn).text == "hello"
