"""The three doors that create a task — the console's form, `POST /api/tasks` and `acthelm_task
create` — resolve the goal, the dependencies, the connection and the model through one service
(`agents.actions.task.task_create_by_name`): the same bad reference is refused with the same
code and message at each, and the CLI's input files are copied as the API's are."""

import io
import json

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.urls import reverse

from tasks.models import Task
from tests.api.conftest import client_for
from tests.factories import ConnectionFactory, ModelFactory, UserFactory

pytestmark = pytest.mark.django_db

BASE_FORM = {"title": "T", "instruction": "I"}
BASE_ARGS = ["--title", "T", "--instruction", "I"]

# A bad reference, as the API's form fields and as the CLI's options.
BAD = {
    "goal": ({"goal_id": 999999}, ["--goal", "999999"]),
    "dependency": ({"depends_on": [999999]}, ["--depends-on", "999999"]),
    "connection": ({"connection": "nope"}, ["--connection", "nope"]),
    "model": ({"model": "nope"}, ["--model", "nope"]),
    "ambiguous model": ({"model": "twin"}, ["--model", "twin"]),
    "policy": (
        {"tools": ["read_file"], "ask_tools": ["fetch_url"]},
        ["--tool", "read_file", "--policy", "fetch_url=ask"],
    ),
}


@pytest.fixture
def founder():
    return client_for("founder", ["tasks.view_task", "tasks.add_task"])


def _cli(*args) -> dict:
    out = io.StringIO()
    with pytest.raises(CommandError):
        call_command("acthelm_task", "--json", "--user", "founder", "create", *args, stdout=out)
    return json.loads(out.getvalue())


@pytest.mark.parametrize("what", BAD)
def test_a_bad_reference_is_refused_alike_by_the_api_and_the_cli(founder, what):
    ModelFactory()  # a usable default model: only the reference can be wrong
    for connection in ("one", "two"):
        ModelFactory(connection=ConnectionFactory(name=connection), name="twin")
    form, args = BAD[what]
    api = founder.post_form("/api/tasks", BASE_FORM | form).json()
    cli = _cli(*BASE_ARGS, *args)
    assert (cli["error"], cli["message"]) == (api["code"], api["message"]), what
    assert api["code"] == "invalid_input"
    assert not Task.objects.exists()


def test_the_console_form_refuses_a_policy_as_the_api_does(client, founder):
    ModelFactory()
    client.force_login(UserFactory(username="boss", perms=["tasks.view_task", "tasks.add_task"]))
    form, _args = BAD["policy"]
    api = founder.post_form("/api/tasks", BASE_FORM | form).json()
    page = client.post(reverse("tasks:create"), BASE_FORM | form | {"priority": 0})
    assert page.status_code == 400
    assert f"{api['message']} [{api['code']}]" in page.content.decode()
    assert api["field"] == "ask_tools"
    assert not Task.objects.exists()


def test_the_cli_copies_input_files_through_the_same_service(founder, tmp_path):
    """Two files of one name: refused by the CLI as by the API, and no task is left."""
    ModelFactory()
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "data.txt").write_text(folder)
    files = [str(tmp_path / "a" / "data.txt"), str(tmp_path / "b" / "data.txt")]
    cli = _cli(*BASE_ARGS, "--file", files[0], "--file", files[1])
    assert (cli["error"], cli["field"]) == ("invalid_input", "files")
    assert cli["message"] == "two files are named data.txt"
    assert not Task.objects.exists()
