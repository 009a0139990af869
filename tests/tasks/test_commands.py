import json

import pytest
from django.core.management.base import CommandError

from agents.models import Connection
from tasks.models import Task
from tasks.states import TaskStatus
from tests.factories import ModelFactory, TaskFactory, UserFactory


@pytest.fixture
def admin_user(transactional_db):
    return UserFactory(username="ops", is_superuser=True)


def test_create_prints_the_task_as_json(manage, admin_user, tmp_path):
    ModelFactory()  # the default model a new task runs on
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


def test_create_without_a_usable_model_is_refused_with_the_field(manage, admin_user):
    no_tools = ModelFactory(supports_tools=False)
    args = ["acthelm_task", "--json", "create", "--title", "T", "--instruction", "I"]
    result = manage(*args)
    assert result.returncode != 0 and "no_usable_model" in result.stderr
    assert json.loads(result.stdout) | {"message": ""} == {
        "ok": False,
        "error": "no_usable_model",
        "message": "",
        "field": "model",
    }
    assert not Task.objects.exists()
    # A model chosen by name that the task (with its default tools) cannot run on: refused too.
    result = manage(*args, "--model", no_tools.name)
    assert "model_not_tool_capable" in result.stderr and not Task.objects.exists()


def test_no_tools_and_tool_together_are_refused_by_name(manage, admin_user):
    ModelFactory()
    args = ["acthelm_task", "create", "--title", "T", "--instruction", "I"]
    both = manage(*args, "--tool", "read_file", "--no-tools")
    assert both.returncode != 0
    assert "argument --no-tools: not allowed with argument --tool" in both.stderr
    # A policy for a tool the task does not have says so (the API's and the form's rule).
    policy = manage(*args, "--no-tools", "--policy", "fetch_url=ask")
    assert policy.returncode != 0
    assert "a policy names tools the task does not use: fetch_url" in policy.stderr
    assert not Task.objects.exists()


def test_close_of_a_task_not_in_review_fails_clearly_and_changes_nothing(
    manage_process, admin_user
):
    manage = manage_process  # a real process: its exit status and stderr, as a shell sees them
    task = TaskFactory(status=TaskStatus.READY)
    result = manage("acthelm_task", "close", str(task.pk))
    assert result.returncode != 0
    assert "cannot" in result.stderr or "not possible" in result.stderr
    assert "transition_not_allowed" in result.stderr
    assert Task.objects.get(pk=task.pk).status == TaskStatus.READY


def test_json_errors_are_json(manage_process, admin_user):
    manage = manage_process  # a real process: the JSON on stdout and the exit status 1
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


def test_connection_add_exists_ok_runs_again_and_never_changes_a_connection(manage, admin_user):
    """Issue 49, item 7: a pasted block that adds its connection runs twice."""
    url = "http://127.0.0.1:11434/v1"
    add = ["acthelm_connection", "add", "ollama", "--kind", "openai_compatible", "--base-url",
           url, "--model", "qwen3:8b", "--cost-tier", "zero_cost"]  # fmt: skip
    assert manage(*add, "--exists-ok", check=True).stdout.strip() == "connection ollama added"
    again = manage(*add, "--exists-ok", check=True)
    assert again.stdout.strip() == (
        "connection ollama exists already with these settings: unchanged"
    )
    plain = manage(*add)  # without the flag, a second add is still refused
    assert plain.returncode != 0 and "exists already [invalid_input]" in plain.stderr
    other = manage(*add[:-2], "--cost-tier", "paid", "--exists-ok")
    assert other.returncode != 0
    assert "exists already with other settings (cost_tier: 'zero_cost', not 'paid')" in (
        other.stderr
    )
    more = manage(*add, "--model", "llama3", "--exists-ok")
    assert more.returncode != 0 and "no model 'llama3'" in more.stderr
    conn = Connection.objects.get(name="ollama")
    assert conn.cost_tier == "zero_cost" and [m.name for m in conn.models.all()] == ["qwen3:8b"]


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
        "ACTHELM_KEY_OLLAMA",
        check=True,
    )
    assert json.loads(result.stdout)["models"][0]["test_status"] == "untested"
    listed = json.loads(manage("acthelm_connection", "--json", "list", check=True).stdout)
    assert listed[0]["credential_env"] == "ACTHELM_KEY_OLLAMA"
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


# -- issue 13, item 19: a CLI user can decide an operation --------------------------------------


def _open_operations():
    from agents.states import ToolCallStatus
    from tests.factories import ApprovalFactory, ReviewDecisionFactory, TaskFactory, ToolCallFactory

    waiting = TaskFactory(status=TaskStatus.AWAITING_APPROVAL, title="Fetch the report")
    call = ToolCallFactory(
        turn__run__task=waiting,
        status=ToolCallStatus.AWAITING_APPROVAL,
        arguments={"url": "https://example.com/report"},
    )
    approval = ApprovalFactory(tool_call=call, target="https://example.com/report")
    unsure = TaskFactory(status=TaskStatus.NEEDS_REVIEW, title="Post the summary")
    decision = ReviewDecisionFactory(
        tool_call=ToolCallFactory(
            turn__run__task=unsure,
            status=ToolCallStatus.UNKNOWN,
            arguments={"url": "https://example.com/hook"},
        )
    )
    # Not open: a decided approval, and a pending one of a task that is no longer waiting.
    ApprovalFactory(status="approved", decided_at="2026-01-01T00:00:00Z")
    ApprovalFactory(tool_call__turn__run__task=TaskFactory(status=TaskStatus.CANCELLED))
    return approval, decision


def test_show_lists_a_tasks_open_operations_with_ids_targets_arguments_and_hashes(
    manage, admin_user
):
    approval, decision = _open_operations()
    shown = json.loads(
        manage("acthelm_task", "--json", "show", str(approval.task_id), check=True).stdout
    )
    [op] = shown["open_operations"]
    assert op["kind"] == "approval" and op["id"] == approval.pk
    assert op["target"] == "https://example.com/report"
    assert op["arguments"] == {"url": "https://example.com/report"}
    assert op["arguments_hash"] == approval.arguments_hash
    text = manage("acthelm_task", "show", str(decision.task_id), check=True).stdout
    assert f"review {decision.pk}" in text and decision.tool_call.arguments_hash in text
    assert "https://example.com/hook" in text


def test_pending_lists_every_open_operation_across_tasks(manage, admin_user):
    approval, decision = _open_operations()
    rows = json.loads(manage("acthelm_task", "--json", "pending", check=True).stdout)
    assert [(r["kind"], r["id"]) for r in rows] == [
        ("approval", approval.pk),
        ("review", decision.pk),
    ]
    text = manage("acthelm_task", "pending", check=True).stdout
    assert f"approval {approval.pk}" in text and f"review {decision.pk}" in text
    assert text.count("decide: ") == 4
    one = json.loads(manage("acthelm_task", "--json", "pending", "--limit", "1").stdout)
    assert [(r["kind"], r["id"]) for r in one] == [("approval", approval.pk)]


@pytest.mark.parametrize(("first", "second"), [("approve", "run-again"), ("deny", "skip")])
def test_the_printed_commands_decide_the_operations_end_to_end(manage, admin_user, first, second):
    """Copy the decide line that `pending` printed, run it, and the operation is decided."""
    from approvals.models import Approval, ReviewDecision

    approval, decision = _open_operations()
    text = manage("acthelm_task", "pending", check=True).stdout
    lines = [
        line.split("decide: manage.py ", 1)[1] for line in text.splitlines() if "decide:" in line
    ]
    [chosen] = [c for c in lines if c.startswith(f"acthelm_task {first} ")]
    [review] = [c for c in lines if c.startswith(f"acthelm_task {second} ")]
    manage(*chosen.split(), check=True)
    manage(*review.split(), check=True)
    approval = Approval.objects.get(pk=approval.pk)
    assert approval.status == ("approved" if first == "approve" else "denied")
    assert ReviewDecision.objects.get(pk=decision.pk).choice == second.replace("-", "_")
    assert Task.objects.get(pk=approval.task_id).status == TaskStatus.READY
    assert Task.objects.get(pk=decision.task_id).status == TaskStatus.READY
    assert json.loads(manage("acthelm_task", "--json", "pending", check=True).stdout) == []


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


@pytest.mark.django_db
def test_list_asks_the_same_number_of_queries_for_3_or_30_tasks():
    """Issue 21 item 12: one dependency query per task (31 for 31 tasks)."""
    from io import StringIO

    from django.core.management import call_command
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    from tasks.models import TaskDependency

    UserFactory(username="ops", is_superuser=True)
    first = TaskFactory(status=TaskStatus.DONE)

    def queries_for_list() -> tuple[int, list]:
        out = StringIO()
        with CaptureQueriesContext(connection) as queries:
            call_command(
                "acthelm_task", "--json", "--user", "ops", "list", "--limit", "100", stdout=out
            )
        return len(queries), json.loads(out.getvalue())

    def add_tasks(count: int) -> None:
        for _ in range(count):
            task = TaskFactory(status=TaskStatus.BLOCKED)
            TaskDependency.objects.create(task=task, depends_on=first)

    add_tasks(2)
    few, rows = queries_for_list()
    assert len(rows) == 3
    add_tasks(27)
    many, rows = queries_for_list()
    assert len(rows) == 30 and few == many
    assert all(r["depends_on"] == [first.pk] for r in rows if r["id"] != first.pk)


def test_show_prints_the_answer_the_verdict_and_the_artifacts(admin_user, tmp_path):
    from io import StringIO

    from django.core.management import call_command
    from django.utils import timezone

    from agents.models import Artifact
    from tasks.workspace import add_input_file, artifacts_dir
    from tests.factories import AgentRunFactory

    task = TaskFactory(status=TaskStatus.REVIEW, title="Summarise")
    AgentRunFactory(
        task=task,
        status="succeeded",
        finished_at=timezone.now(),
        answer="Three themes.\x1b[2J Login first.",
        verdict="approved",
        verdict_reason="names the themes",
    )
    (artifacts_dir(task.pk) / "report.md").write_text("# Report\nLogin.\n")
    Artifact.objects.create(task=task, name="report.md", path="x", size=16, sha256="0" * 64)
    add_input_file(task.pk, name="tickets.csv", data=b"id,topic\n1,login\n")
    out = StringIO()
    call_command("acthelm_task", "show", str(task.pk), stdout=out)
    text = out.getvalue()
    assert "verdict: approved by the supervisor: names the themes" in text
    assert "answer:\n  Three themes.\ufffd[2J Login first." in text  # no escape reaches the tty
    assert (
        "artifacts: report.md (16 bytes)" in text and "input files: tickets.csv (17 bytes)" in text
    )
    out = StringIO()
    call_command("acthelm_task", "--json", "show", str(task.pk), stdout=out)
    data = json.loads(out.getvalue())
    assert data["answer"].startswith("Three themes.") and data["verdict"] == "approved"
    assert [a["name"] for a in data["artifacts"]] == ["report.md"]

    target = tmp_path / "copy.md"
    call_command("acthelm_task", "artifact", str(task.pk), "report.md", "-o", str(target))
    assert target.read_text() == "# Report\nLogin.\n"
    out = StringIO()
    call_command("acthelm_task", "artifact", str(task.pk), "tickets.csv", stdout=out)
    assert out.getvalue() == "id,topic\n1,login\n"  # an input file when no artifact has the name
    with pytest.raises(CommandError, match="not_found"):
        call_command("acthelm_task", "artifact", str(task.pk), "report.md", "--input")


def test_show_counts_the_attempts_as_the_settings_do(settings, db):
    """ACTHELM_MAX_ATTEMPTS counts attempts, the first run among them: the CLI and the API say
    how many failed of how many."""
    from io import StringIO

    from django.core.management import call_command

    settings.ACTHELM_MAX_ATTEMPTS = 3
    task = TaskFactory(status=TaskStatus.READY, failed_attempts=2)
    out = StringIO()
    call_command("acthelm_task", "show", str(task.pk), stdout=out)
    assert out.getvalue().splitlines()[1] == "2 of 3 attempts failed"
    out = StringIO()
    call_command("acthelm_task", "--json", "show", str(task.pk), stdout=out)
    shown = json.loads(out.getvalue())
    assert (shown["failed_attempts"], shown["max_attempts"]) == (2, 3)
