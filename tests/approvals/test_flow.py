"""Approvals end to end: a real worker, the scripted model server, real PostgreSQL.

An approval is bound to one operation (the tool plus the hash of its validated arguments): the
decision must carry that hash, the worker checks it again before running, a changed argument is a
new operation, a denial reaches the model as a failed call, and several calls of one turn are
decided one by one."""

import pytest
from django.core.management import CommandError, call_command

from agents.actions.decisions import DENIED_RESULT, approval_approve, approval_deny
from agents.catalogue.tools import get_tool, operation_hash
from agents.engine.runtime.worker import Worker
from agents.models import Artifact, ToolCall
from agents.states import ToolCallStatus
from approvals.models import Approval
from approvals.states import ApprovalStatus
from core.exceptions import StaleDecision
from tasks.states import EventKind, TaskStatus
from tests.agents.scripted import (
    artifact_files,
    calls_of,
    fast_settings,
    status_of,
    tool_messages,
    tool_result_for,
    tool_task,
)
from tests.fakes.http_target import HttpTarget
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

pytestmark = pytest.mark.django_db(transaction=True)

ASK_WRITE = {"write_artifact": "ask"}


@pytest.fixture
def loop_settings(settings):
    return fast_settings(settings)


def work() -> None:
    Worker(worker_id="w", burst=True).run()


def write(name: str, content: str, call_id: str):
    return ("write_artifact", {"name": name, "content": content}, call_id)


def write_hash(name: str, content: str) -> str:
    """The operation hash of that write: of its parsed arguments, as the worker computes it."""
    args = get_tool("write_artifact").parse({"name": name, "content": content})
    return operation_hash("write_artifact", args)


def test_policy_ask_stops_the_task_and_approving_runs_exactly_that_call(loop_settings, actor):
    script = [reply_tool_calls([write("report.md", "# Hello", "w1")]), reply_text("Written.")]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["write_artifact"], tool_policies=ASK_WRITE)
        work()
        assert status_of(task) == TaskStatus.AWAITING_APPROVAL
        [call] = calls_of(task)
        approval = Approval.objects.get(task=task)
        # What the person sees: the tool, the exact target, the validated arguments, the effect.
        assert approval.tool == "write_artifact" and approval.target == "report.md"
        assert approval.arguments == {
            "name": "report.md",
            "content": "# Hello",
            "content_type": "text/plain",
        }
        assert approval.effect == "Writes artifact file report.md (7 bytes, text/plain)"
        assert approval.reason == "policy_ask" and approval.status == ApprovalStatus.PENDING
        expected = write_hash("report.md", "# Hello")
        assert approval.arguments_hash == call.arguments_hash == expected
        assert (call.status, call.run_count) == (ToolCallStatus.AWAITING_APPROVAL, 0)
        assert artifact_files(task) == [] and len(server.completion_requests) == 1

        approval_approve(actor=actor, approval_id=approval.pk, arguments_hash=expected)
        assert status_of(task) == TaskStatus.READY
        work()
        requests = server.completion_requests

    call.refresh_from_db()
    assert (call.status, call.run_count) == (ToolCallStatus.SUCCEEDED, 1)
    [path] = artifact_files(task)
    assert path.read_text() == "# Hello" and Artifact.objects.filter(task=task).count() == 1
    assert len(requests) == 2  # the model was not asked again for the call it already made
    assert tool_result_for(requests[1], "w1") == call.result_for_model
    assert status_of(task) == TaskStatus.REVIEW
    kinds = list(task.events.values_list("kind", flat=True))
    assert kinds.count(EventKind.APPROVAL_REQUESTED) >= 1 and EventKind.APPROVED in kinds


def test_a_stale_or_altered_hash_is_refused_and_nothing_runs(loop_settings, actor, person):
    script = [reply_tool_calls([write("report.md", "# Hello", "w1")]), reply_text("Written.")]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["write_artifact"], tool_policies=ASK_WRITE)
        work()
        approval = Approval.objects.get(task=task)
        altered = write_hash("report.md", "# Evil")
        for bad in ("", "0" * 64, altered, approval.arguments_hash.upper()):
            with pytest.raises(StaleDecision):
                approval_approve(actor=actor, approval_id=approval.pk, arguments_hash=bad)
        with pytest.raises(CommandError, match=r"stale_decision|hash"):
            call_command(
                "acthelm_task",
                "--user",
                person.username,
                "approve",
                str(task.pk),
                str(approval.pk),
                "--hash",
                altered,
            )
        work()  # nothing is ready: a worker finds no work
        assert len(server.completion_requests) == 1
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert status_of(task) == TaskStatus.AWAITING_APPROVAL
    assert calls_of(task)[0].run_count == 0 and artifact_files(task) == []


def test_the_worker_checks_the_hash_again_before_running(loop_settings, actor):
    """Approved, then the stored operation changed before a worker ran it: refused, not run."""
    script = [reply_tool_calls([write("report.md", "# Hello", "w1")]), reply_text("Understood.")]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["write_artifact"], tool_policies=ASK_WRITE)
        work()
        approval = Approval.objects.get(task=task)
        approval_approve(
            actor=actor, approval_id=approval.pk, arguments_hash=approval.arguments_hash
        )
        ToolCall.objects.filter(task=task).update(
            arguments={"name": "report.md", "content": "# Swapped after approval"}
        )
        work()
        requests = server.completion_requests
    [call] = calls_of(task)
    assert (call.status, call.error_code, call.run_count) == ("refused", "approval_mismatch", 0)
    assert artifact_files(task) == []
    assert "approval_mismatch" in tool_result_for(requests[1], "w1")


def test_an_approval_does_not_cover_a_changed_argument(loop_settings, actor):
    """fetch_url to a domain outside the allow-list: each URL is its own operation."""
    with HttpTarget() as target:
        target.route("/a", body="page A")
        target.route("/b", body="page B")
        url_a, url_b = target.url_for("/a", "localhost"), target.url_for("/b", "localhost")
        script = [
            reply_tool_calls([("fetch_url", {"url": url_a}, "f1")]),
            reply_tool_calls([("fetch_url", {"url": url_b}, "f2")]),
            reply_text("Read both pages."),
        ]
        with ScriptedModelServer(script) as server:
            task = tool_task(server, ["fetch_url"], allowed_domains=["example.org"])
            work()
            first = Approval.objects.get(task=task)
            assert (first.reason, first.target) == ("domain_not_allowed", url_a)
            assert first.effect.startswith(f"Sends an HTTP GET request to {url_a}")
            approval_approve(actor=actor, approval_id=first.pk, arguments_hash=first.arguments_hash)
            work()
            # The same tool with a different URL: a new operation, waiting for a new approval.
            assert status_of(task) == TaskStatus.AWAITING_APPROVAL
            second = Approval.objects.exclude(pk=first.pk).get(task=task)
            assert second.target == url_b and second.status == ApprovalStatus.PENDING
            assert second.arguments_hash != first.arguments_hash
            assert target.counts == {"/a": 1}
            with pytest.raises(StaleDecision):
                approval_approve(
                    actor=actor, approval_id=second.pk, arguments_hash=first.arguments_hash
                )
            approval_approve(
                actor=actor, approval_id=second.pk, arguments_hash=second.arguments_hash
            )
            work()
            requests = server.completion_requests
        assert target.counts == {"/a": 1, "/b": 1}
    assert "page A" in tool_result_for(requests[1], "f1")
    assert "page B" in tool_result_for(requests[2], "f2")
    assert status_of(task) == TaskStatus.REVIEW


def test_a_denial_reaches_the_model_as_a_failed_call_and_the_task_goes_on(loop_settings, person):
    script = [
        reply_tool_calls([write("report.md", "# Hello", "w1")]),
        reply_text("The write was denied; here is the summary inline instead."),
    ]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["write_artifact"], tool_policies=ASK_WRITE)
        work()
        approval = Approval.objects.get(task=task)
        call_command(
            "acthelm_task",
            "--user",
            person.username,
            "deny",
            str(task.pk),
            str(approval.pk),
            "--hash",
            approval.arguments_hash,
        )
        assert status_of(task) == TaskStatus.READY
        work()
        requests = server.completion_requests
    [call] = calls_of(task)
    assert (call.status, call.error_code, call.run_count) == ("denied", "denied", 0)
    assert tool_result_for(requests[1], "w1") == DENIED_RESULT
    assert artifact_files(task) == [] and not Artifact.objects.filter(task=task).exists()
    assert status_of(task) == TaskStatus.REVIEW
    assert task.runs.filter(status="succeeded").get().answer.startswith("The write was denied")


def test_two_pending_calls_of_one_turn_are_decided_one_by_one(loop_settings, actor):
    script = [
        reply_tool_calls([write("a.md", "A", "wa"), write("b.md", "B", "wb")]),
        reply_text("One written, one denied."),
    ]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["write_artifact"], tool_policies=ASK_WRITE)
        work()
        a, b = (Approval.objects.get(task=task, target=n) for n in ("a.md", "b.md"))
        assert a.status == b.status == ApprovalStatus.PENDING
        approval_approve(actor=actor, approval_id=a.pk, arguments_hash=a.arguments_hash)
        assert status_of(task) == TaskStatus.AWAITING_APPROVAL  # b is still open
        work()  # nothing to claim yet
        assert artifact_files(task) == [] and len(server.completion_requests) == 1
        approval_deny(actor=actor, approval_id=b.pk, arguments_hash=b.arguments_hash)
        assert status_of(task) == TaskStatus.READY
        work()
        requests = server.completion_requests
    call_a, call_b = calls_of(task)
    assert (call_a.status, call_a.run_count) == (ToolCallStatus.SUCCEEDED, 1)
    assert (call_b.status, call_b.run_count) == (ToolCallStatus.DENIED, 0)
    assert [p.name for p in artifact_files(task)] == ["a.md"]
    assert len(requests) == 2 and len(tool_messages(requests[1])) == 2
    assert tool_result_for(requests[1], "wb") == DENIED_RESULT
    assert "Wrote artifact a.md" in tool_result_for(requests[1], "wa")
    assert status_of(task) == TaskStatus.REVIEW


def test_a_forbidden_address_is_refused_without_asking_anyone(settings):
    """No approval can make a loopback, private or metadata address valid: refused at once."""
    fast_settings(settings, allow_private=False)
    urls = [
        "http://127.0.0.1:9/",
        "http://10.1.2.3/",
        "http://169.254.169.254/latest/meta-data/",
        "http://[::1]/",
        "file:///etc/passwd",
    ]
    calls = [("fetch_url", {"url": url}, f"f{i}") for i, url in enumerate(urls)]
    with ScriptedModelServer([reply_tool_calls(calls), reply_text("none allowed")]) as server:
        task = tool_task(server, ["fetch_url"], allowed_domains=["example.org"])
        work()
    assert not Approval.objects.filter(task=task).exists()
    codes = [(c.status, c.error_code, c.run_count) for c in calls_of(task)]
    assert codes == [("refused", "url_address_not_allowed", 0)] * 4 + [
        ("refused", "url_scheme_not_allowed", 0)
    ]
    assert task.runs.get().network_requests == 0
    assert status_of(task) == TaskStatus.REVIEW
