"""`agents.manage_connections` is not a shell: a model CLI connection's command runs at its Test
(in the web process) and on every worker, so a person without superuser status may name only an
executable listed in ACTHELM_CLI_EXECUTABLES — at the console, the admin, the command and the
service, for a new connection and for a new kind or command of an old one."""

import pytest
from django.core.management import CommandError, call_command
from django.test import Client
from django.urls import reverse

from agents.catalogue.connections import connection_update
from agents.models import Connection
from core.actors import Actor
from core.exceptions import InvalidInput
from tests.factories import ConnectionFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def no_listed_executables(settings):
    settings.ACTHELM_CLI_EXECUTABLES = []  # the default


@pytest.fixture
def manager():
    """Staff holding the connection rights (the admin's too), not a superuser."""
    return UserFactory(
        username="conn-ops",
        perms=[
            "agents.manage_connections",
            "agents.view_connection",
            "agents.add_connection",
            "agents.change_connection",
        ],
    )


@pytest.fixture
def marker(tmp_path):
    return tmp_path / "ran"


def _client(user) -> Client:
    client = Client()
    client.force_login(user)
    return client


def _console_form(command: str, name: str = "shell") -> dict:
    return {
        "name": name,
        "kind": "cli",
        "command": command,
        "cost_tier": "zero_cost",
        "priority": "0",
        "timeout_seconds": "60",
        "models": "m",
        "no_tools": "on",
    }


def _admin_form(command: str, name: str = "shell") -> dict:
    return {
        "name": name,
        "kind": "cli",
        "base_url": "",
        "command": command,
        "answer_field": "",
        "credential_env": "",
        "cost_tier": "zero_cost",
        "priority": "0",
        "timeout_seconds": "60",
        "enabled": "on",
        "models-TOTAL_FORMS": "0",
        "models-INITIAL_FORMS": "0",
    }


def _shell(marker) -> str:
    return f'["sh", "-c", "touch {marker}"]'


def test_the_console_refuses_a_shell_from_a_person_who_is_not_a_superuser(manager, marker):
    response = _client(manager).post(
        reverse("agents:connection_add"), _console_form(_shell(marker))
    )
    assert response.status_code == 400
    page = response.content.decode()
    assert "executable_not_allowed" in page and "ACTHELM_CLI_EXECUTABLES" in page
    assert not Connection.objects.exists() and not marker.exists()


def test_the_admin_refuses_a_shell_from_a_person_who_is_not_a_superuser(manager, marker):
    response = _client(manager).post(
        reverse("admin:agents_connection_add"), _admin_form(_shell(marker))
    )
    assert response.status_code == 200  # the form again, with the error on the command
    errors = response.context["adminform"].form.errors
    assert "executable_not_allowed" in str(errors["command"])
    assert not Connection.objects.exists() and not marker.exists()


def test_a_listed_executable_is_accepted(manager, settings):
    settings.ACTHELM_CLI_EXECUTABLES = ["llm"]
    client = _client(manager)
    response = client.post(reverse("agents:connection_add"), _console_form('["llm", "-m", "x"]'))
    assert response.status_code == 302
    response = client.post(
        reverse("admin:agents_connection_add"), _admin_form('["llm", "-m", "y"]', name="other")
    )
    assert response.status_code == 302
    assert sorted(Connection.objects.values_list("command", flat=True)) == [
        ["llm", "-m", "x"],
        ["llm", "-m", "y"],
    ]


def test_a_superuser_may_name_any_program(admin_user, marker):
    client = _client(admin_user)
    response = client.post(reverse("agents:connection_add"), _console_form(_shell(marker)))
    assert response.status_code == 302
    response = client.post(
        reverse("admin:agents_connection_add"), _admin_form(_shell(marker), name="other")
    )
    assert response.status_code == 302
    assert Connection.objects.filter(kind="cli").count() == 2 and not marker.exists()


def test_the_operators_command_acts_as_the_one_it_names(manager, admin_user, marker):
    """`acthelm_connection` acts as --user, else the only superuser (as acthelm_toolserver)."""
    add = ["add", "shell", "--kind", "cli", "--command", _shell(marker), "--model", "m"]
    with pytest.raises(CommandError, match="executable_not_allowed"):
        call_command("acthelm_connection", "--user", "conn-ops", *add)
    assert not Connection.objects.exists()
    call_command("acthelm_connection", *add)
    assert Connection.objects.get(name="shell").command[0] == "sh" and not marker.exists()


def test_changing_a_connections_command_or_kind_is_refused_the_same_way(manager):
    ops = Actor.person(manager)
    cli = ConnectionFactory(kind="cli", base_url="", command=["llm", "-m", "a"])
    with pytest.raises(InvalidInput) as refused:
        connection_update(actor=ops, connection_id=cli.pk, changes={"command": ["sh", "-c", "id"]})
    assert refused.value.code == "executable_not_allowed"
    http = ConnectionFactory(kind="openai_compatible", command=["python3", "-c", "1"])
    with pytest.raises(InvalidInput) as refused:
        connection_update(actor=ops, connection_id=http.pk, changes={"kind": "cli"})
    assert refused.value.code == "executable_not_allowed"
    cli.refresh_from_db(), http.refresh_from_db()
    assert (cli.command, http.kind) == (["llm", "-m", "a"], "openai_compatible")
    # What a superuser set stays usable by those who edit only the rest.
    root_made = ConnectionFactory(kind="cli", base_url="", command=["sh", "-c", "id"])
    assert connection_update(actor=ops, connection_id=root_made.pk, changes={"priority": 5})


def test_the_admin_refuses_a_changed_command(manager, marker):
    conn = ConnectionFactory(name="cli", kind="cli", base_url="", command=["llm"])
    url = reverse("admin:agents_connection_change", args=[conn.pk])
    response = _client(manager).post(url, _admin_form(_shell(marker), name="cli"))
    assert response.status_code == 200
    assert "executable_not_allowed" in str(response.context["adminform"].form.errors["command"])
    conn.refresh_from_db()
    assert conn.command == ["llm"] and not marker.exists()
