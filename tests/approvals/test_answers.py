# ruff: noqa: F811 - the MCP server fixture of tests/agents/test_loop_mcp.py is imported below
"""Agent Inbox's answers end to end: a real worker, the scripted model server, real PostgreSQL.

Approve with edited arguments: the tool runs with the edit (and only the edit), the model's
history shows the call as it ran, and the hash the worker checks is the edit's. Deny with a
message: the model receives the message as the call's result in its next request and responds."""

import json

import pytest
from django.core.management import call_command

from agents.actions.decisions import approval_approve
from agents.catalogue.tools import get_tool, operation_hash
from agents.engine.runtime.worker import Worker
from agents.models import Artifact, ToolServer
from agents.states import ToolCallStatus
from approvals.models import Approval
from approvals.states import ApprovalStatus
from core.actors import Actor
from core.exceptions import InvalidInput
from tasks.states import EventKind, TaskStatus
from tasks.workspace import workspace_dir
from tests.agents.scripted import (
    artifact_files,
    calls_of,
    fast_settings,
    status_of,
    tool_result_for,
    tool_task,
)
from tests.agents.test_loop_mcp import mcp  # noqa: F401 - the fixture: a recorded MCP server
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def loop_settings(settings):
    return fast_settings(settings)


def work() -> None:
    Worker(worker_id="w", burst=True).run()


def _assistant_call(request, call_id: str) -> dict:
    """The arguments of `call_id` as the request's history shows the model's own call."""
    for message in request.json["messages"]:
        for call in message.get("tool_calls") or []:
            if call["id"] == call_id:
                return json.loads(call["function"]["arguments"])
    raise AssertionError(f"no call {call_id} in the request")


def test_approved_with_edited_arguments_the_tool_runs_the_edit(loop_settings, actor):
    script = [
        reply_tool_calls([("write_artifact", {"name": "report.md", "content": "# Draft"}, "w1")]),
        reply_text("Written."),
    ]
    edit = {"name": "summary.md", "content": "# Three bullets\n- a\n- b\n- c\n"}
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["write_artifact"], tool_policies={"write_artifact": "ask"})
        work()
        assert status_of(task) == TaskStatus.AWAITING_APPROVAL
        approval = Approval.objects.get(task=task)
        decided = approval_approve(
            actor=actor,
            approval_id=approval.pk,
            arguments_hash=approval.arguments_hash,
            arguments=json.dumps(edit),
        )
        expected = operation_hash("write_artifact", get_tool("write_artifact").parse(edit))
        assert decided.edited_arguments_hash == expected != approval.arguments_hash
        work()
        requests = server.completion_requests
    [call] = calls_of(task)
    assert (call.status, call.run_count) == (ToolCallStatus.SUCCEEDED, 1)
    assert call.arguments_hash == expected
    # The edit ran, and only the edit: summary.md with the person's content, no report.md.
    [path] = artifact_files(task)
    assert (path.name, path.read_text()) == ("summary.md", edit["content"])
    assert list(Artifact.objects.filter(task=task).values_list("name", flat=True)) == ["summary.md"]
    # The next request shows the call as it ran, with its result; the model was not asked again.
    assert len(requests) == 2
    assert _assistant_call(requests[1], "w1") == edit | {"content_type": "text/plain"}
    assert "summary.md" in tool_result_for(requests[1], "w1")
    assert status_of(task) == TaskStatus.REVIEW
    event = task.events.get(kind=EventKind.APPROVED)
    assert event.data["original_arguments"]["name"] == "report.md"
    assert event.data["edited_arguments"]["name"] == "summary.md"


def test_denied_with_a_message_the_model_reads_it_and_responds(loop_settings, person):
    """Through the CLI: the model is told why and reads the file the person named instead."""

    def after_the_denial(request_json):
        told = [m["content"] for m in request_json["messages"] if m.get("role") == "tool"]
        if told and "use notes.txt instead" in told[-1]:
            return reply_tool_calls([("read_file", {"path": "notes.txt"}, "r2")])
        return reply_text("I was not told why; giving up.")

    script = [
        reply_tool_calls([("read_file", {"path": "secret.txt"}, "r1")]),
        after_the_denial,
        reply_text("Summary of notes.txt: the meeting moved to Tuesday."),
    ]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["read_file"], tool_policies={"read_file": "ask"})
        folder = workspace_dir(task.pk)
        (folder / "notes.txt").write_text("The meeting moved to Tuesday.\n")
        (folder / "secret.txt").write_text("not for the model\n")
        work()
        first = Approval.objects.get(task=task)
        call_command(
            "acthelm_task",
            "--user",
            person.username,
            "deny",
            str(task.pk),
            str(first.pk),
            "--hash",
            first.arguments_hash,
            "--message",
            "use notes.txt instead",
        )
        first.refresh_from_db()
        assert (first.status, first.message) == (ApprovalStatus.DENIED, "use notes.txt instead")
        work()  # the model asks to read notes.txt: a new approval (read_file asks on this task)
        second = Approval.objects.get(task=task, status=ApprovalStatus.PENDING)
        assert second.target == "notes.txt"
        approval_approve(
            actor=Actor.person(person),
            approval_id=second.pk,
            arguments_hash=second.arguments_hash,
        )
        work()
        requests = server.completion_requests
    told = tool_result_for(requests[1], "r1")
    assert told.startswith("denied by a person: use notes.txt instead")
    assert "Tuesday" in tool_result_for(requests[2], "r2")
    assert status_of(task) == TaskStatus.REVIEW
    denied, read = calls_of(task)
    assert (denied.status, denied.run_count) == (ToolCallStatus.DENIED, 0)
    assert (read.status, read.run_count) == (ToolCallStatus.SUCCEEDED, 1)
    event = task.events.get(kind=EventKind.DENIED)
    assert event.data["message"] == "use notes.txt instead"


def test_an_mcp_tools_edit_is_checked_against_the_schema_the_task_pinned(loop_settings, mcp, actor):
    """The server re-lists its tool with another schema mid-task: an edit is still checked
    against the schema the task's model read (as the engine checks the model's calls)."""
    script = [reply_tool_calls([("local__echo", {"text": "hi"}, "e1")]), reply_text("Done.")]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["local__echo"])
        work()
        approval = Approval.objects.get(task=task)
        server_row = ToolServer.objects.get(name="local")
        changed = [
            {**t, "input_schema": {"type": "object", "required": ["evil"],
                                   "properties": {"evil": {"type": "string"}}}}
            if t["name"] == "echo" else t
            for t in server_row.tools
        ]  # fmt: skip
        ToolServer.objects.filter(pk=server_row.pk).update(tools=changed)
        for refused in ({"evil": "x"}, {"text": 5}):
            with pytest.raises(InvalidInput) as error:
                approval_approve(
                    actor=actor,
                    approval_id=approval.pk,
                    arguments_hash=approval.arguments_hash,
                    arguments=refused,
                )
            assert error.value.code == "invalid_arguments"
        assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING
        approval_approve(
            actor=actor,
            approval_id=approval.pk,
            arguments_hash=approval.arguments_hash,
            arguments={"text": "bye"},
        )
        work()
        requests = server.completion_requests
    assert tool_result_for(requests[1], "e1") == "bye"
    assert mcp("echo") == 1
    assert status_of(task) == TaskStatus.REVIEW
