import json

import pytest

from tasks.models import Task
from tasks.states import TaskStatus
from tests.factories import TaskFactory, UserFactory


@pytest.fixture
def admin_user(transactional_db):
    return UserFactory(username="ops", is_superuser=True)


def test_create_prints_the_task_as_json(manage, admin_user, tmp_path):
    note = tmp_path / "notes.txt"
    note.write_text("hello")
    result = manage(
        "acthelm_task",
        "--json",
        "create",
        "--title",
        "T",
        "--instruction",
        "I",
        "--file",
        str(note),
        check=True,
    )
    data = json.loads(result.stdout)
    assert data["status"] == "ready" and data["id"]
    assert Task.objects.get(pk=data["id"]).title == "T"


def test_close_of_a_task_not_in_review_fails_clearly_and_changes_nothing(manage, admin_user):
    task = TaskFactory(status=TaskStatus.READY)
    result = manage("acthelm_task", "close", str(task.pk))
    assert result.returncode != 0
    assert "cannot" in result.stderr or "not possible" in result.stderr
    assert "transition_not_allowed" in result.stderr
    assert Task.objects.get(pk=task.pk).status == TaskStatus.READY


def test_json_errors_are_json(manage, admin_user):
    task = TaskFactory(status=TaskStatus.DONE)
    result = manage("acthelm_task", "--json", "cancel", str(task.pk))
    assert result.returncode == 1
    assert json.loads(result.stdout)["error"] == "transition_not_allowed"


@pytest.mark.parametrize(
    "args",
    [
        ["show", "999999"],
        ["show", "abc"],
        ["create", "--title", "T"],
        ["create", "--title", "T", "--instruction", "I", "--limit", "limit_turns"],
        ["create", "--title", "T", "--instruction", "I", "--tool", "format_disk"],
        ["approve", "1", "2"],
        ["frobnicate"],
    ],
)
def test_bad_input_exits_non_zero_with_a_message(manage, admin_user, args):
    result = manage("acthelm_task", *args)
    assert result.returncode != 0
    assert result.stderr.strip()
    assert not Task.objects.exists()


def test_list_show_and_the_action_flow(manage, admin_user):
    task = TaskFactory(status=TaskStatus.REVIEW)
    rows = json.loads(manage("acthelm_task", "--json", "list", check=True).stdout)
    assert [r["id"] for r in rows] == [task.pk]
    assert json.loads(manage("acthelm_task", "--json", "show", str(task.pk), check=True).stdout)[
        "actions"
    ] == ["cancel", "close", "reopen"]
    out = manage("acthelm_task", "--json", "close", str(task.pk), check=True)
    assert json.loads(out.stdout)["status"] == "done"


def test_connection_add_and_list(manage, admin_user):
    result = manage(
        "acthelm_connection",
        "--json",
        "add",
        "local",
        "--kind",
        "openai_compatible",
        "--base-url",
        "http://127.0.0.1:11434/v1",
        "--model",
        "qwen3",
        "--cost-tier",
        "zero_cost",
        "--credential-env",
        "OLLAMA_KEY",
        check=True,
    )
    assert json.loads(result.stdout)["models"][0]["test_status"] == "untested"
    listed = json.loads(manage("acthelm_connection", "--json", "list", check=True).stdout)
    assert listed[0]["credential_env"] == "OLLAMA_KEY"
    bad = manage("acthelm_connection", "add", "x", "--kind", "cli", "--command", "not json")
    assert bad.returncode != 0 and "JSON list" in bad.stderr
    secret = manage(
        "acthelm_connection",
        "add",
        "y",
        "--kind",
        "openai_compatible",
        "--base-url",
        "http://h/v1",
        "--credential-env",
        "sk-live-abc123-secret!",
    )
    assert secret.returncode != 0 and "NAME of an environment variable" in secret.stderr


def test_demo_is_idempotent(manage, transactional_db):
    first = manage("acthelm_demo", env={"ACTHELM_DEMO_PASSWORD": "pw12345"}, check=True)
    assert "founder / pw12345" in first.stdout
    manage("acthelm_demo", check=True)
    assert Task.objects.count() == 1


def test_show_and_list_print_the_cost_and_the_money_budget(manage, admin_user):
    from decimal import Decimal

    from tests.factories import AgentRunFactory, TurnFactory

    task = TaskFactory(limit_cost=Decimal("2"))
    run = AgentRunFactory(task=task, number=1)
    TurnFactory(task=task, run=run, index=1, cost=Decimal("0.125"), cached_input_tokens=80)
    TurnFactory(task=task, run=run, index=2, cost=Decimal("0.25"))
    shown = json.loads(manage("acthelm_task", "--json", "show", str(task.pk), check=True).stdout)
    assert Decimal(shown["cost"]) == Decimal("0.375")
    assert shown["limits"]["cost"] == "2.0000" and shown["limits"]["mcp_calls"] == 20
    listed = json.loads(manage("acthelm_task", "--json", "list", check=True).stdout)
    assert Decimal(listed[0]["cost"]) == Decimal("0.375")
    raised = manage(
        "acthelm_task", "--json", "limits", str(task.pk), "--limit", "limit_cost=3.5", check=True
    )
    assert json.loads(raised.stdout)["limits"]["cost"] == "3.5000"
