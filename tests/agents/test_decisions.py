import json

import pytest

from agents.actions import decisions
from agents.models import ToolCall
from agents.states import ToolCallStatus
from approvals.states import ApprovalStatus, ReviewChoice
from core.actors import Actor
from core.exceptions import InvalidInput, NotPermitted, StaleDecision
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.factories import ApprovalFactory, ReviewDecisionFactory, TaskFactory, ToolCallFactory

pytestmark = pytest.mark.django_db


def _approval(**kwargs):
    task = TaskFactory(status=TaskStatus.AWAITING_APPROVAL)
    call = ToolCallFactory(turn__run__task=task, status=ToolCallStatus.AWAITING_APPROVAL, **kwargs)
    return ApprovalFactory(tool_call=call)


def test_approve_with_the_right_hash_queues_the_task(actor):
    approval = _approval()
    decisions.approval_approve(
        actor=actor, approval_id=approval.pk, arguments_hash=approval.arguments_hash
    )
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == actor.user
    approval.tool_call.refresh_from_db()
    assert approval.tool_call.status == ToolCallStatus.APPROVED
    task = Task.objects.get(pk=approval.task_id)
    assert task.status == TaskStatus.READY
    assert task.events.filter(kind=EventKind.APPROVED).count() == 1


@pytest.mark.parametrize("bad_hash", ["", "0" * 64, "not-a-hash"])
def test_a_stale_or_altered_hash_changes_nothing(actor, bad_hash):
    approval = _approval()
    with pytest.raises(StaleDecision):
        decisions.approval_approve(actor=actor, approval_id=approval.pk, arguments_hash=bad_hash)
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert Task.objects.get(pk=approval.task_id).status == TaskStatus.AWAITING_APPROVAL


def test_a_decided_approval_cannot_be_decided_again(actor):
    approval = _approval()
    decisions.approval_deny(
        actor=actor, approval_id=approval.pk, arguments_hash=approval.arguments_hash
    )
    with pytest.raises(StaleDecision):
        decisions.approval_approve(
            actor=actor, approval_id=approval.pk, arguments_hash=approval.arguments_hash
        )


def test_deny_records_a_failed_call_for_the_model(actor):
    approval = _approval()
    decisions.approval_deny(
        actor=actor, approval_id=approval.pk, arguments_hash=approval.arguments_hash
    )
    call = approval.tool_call
    call.refresh_from_db()
    assert call.status == ToolCallStatus.DENIED and "denied" in call.result_for_model


def test_two_pending_calls_are_decided_one_by_one(actor):
    first = _approval()
    call2 = ToolCallFactory(turn=first.tool_call.turn, status=ToolCallStatus.AWAITING_APPROVAL)
    second = ApprovalFactory(tool_call=call2)
    decisions.approval_approve(
        actor=actor, approval_id=first.pk, arguments_hash=first.arguments_hash
    )
    assert Task.objects.get(pk=first.task_id).status == TaskStatus.AWAITING_APPROVAL
    decisions.approval_deny(
        actor=actor, approval_id=second.pk, arguments_hash=second.arguments_hash
    )
    assert Task.objects.get(pk=first.task_id).status == TaskStatus.READY


def test_deciding_needs_the_permission(outsider):
    approval = _approval()
    with pytest.raises(NotPermitted):
        decisions.approval_approve(
            actor=Actor.person(outsider),
            approval_id=approval.pk,
            arguments_hash=approval.arguments_hash,
        )


@pytest.mark.parametrize(
    ("func", "choice", "call_status"),
    [
        (decisions.review_run_again, ReviewChoice.RUN_AGAIN, ToolCallStatus.APPROVED),
        (decisions.review_skip, ReviewChoice.SKIP, ToolCallStatus.SKIPPED),
    ],
)
def test_needs_review_choices(actor, func, choice, call_status):
    task = TaskFactory(status=TaskStatus.NEEDS_REVIEW)
    decision = ReviewDecisionFactory(tool_call__turn__run__task=task)
    call = decision.tool_call
    with pytest.raises(StaleDecision):
        func(actor=actor, decision_id=decision.pk, arguments_hash="wrong")
    func(actor=actor, decision_id=decision.pk, arguments_hash=call.arguments_hash)
    decision.refresh_from_db()
    call.refresh_from_db()
    assert decision.choice == choice and call.status == call_status
    assert Task.objects.get(pk=task.pk).status == TaskStatus.READY


# -- Agent Inbox's answers: approve with edited arguments, deny with a message, a cancel's reason


def _operation(tool: str, arguments: dict, **task_fields):
    """A task awaiting approval of one call with real, engine-computed hashes."""
    from agents.catalogue.tools import get_tool, operation_hash

    parsed = get_tool(tool).parse(arguments)
    canonical = parsed.model_dump(mode="json")
    task = TaskFactory(
        status=TaskStatus.AWAITING_APPROVAL,
        tools=["update_plan", tool],
        **task_fields,
    )
    call = ToolCallFactory(
        turn__run__task=task,
        tool=tool,
        arguments=canonical,
        arguments_hash=operation_hash(tool, parsed),
        status=ToolCallStatus.AWAITING_APPROVAL,
    )
    target = next(str(arguments[k]) for k in ("path", "url", "name") if k in arguments)
    return ApprovalFactory(tool_call=call, target=target)


def _hash(tool: str, arguments: dict) -> str:
    from agents.catalogue.tools import get_tool, operation_hash

    return operation_hash(tool, get_tool(tool).parse(arguments))


def _unchanged(approval) -> None:
    before_args, before_hash = approval.arguments, approval.arguments_hash
    approval.refresh_from_db()
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert approval.status == ApprovalStatus.PENDING and approval.edited_arguments_hash == ""
    assert (call.arguments, call.arguments_hash) == (before_args, before_hash)
    assert call.status == ToolCallStatus.AWAITING_APPROVAL
    assert Task.objects.get(pk=approval.task_id).status == TaskStatus.AWAITING_APPROVAL
    assert not TaskEvent.objects.filter(
        task_id=approval.task_id, kind__in=[EventKind.APPROVED, EventKind.DENIED]
    ).exists()


def test_approve_with_edited_arguments_binds_the_edit(actor):
    approval = _operation("write_artifact", {"name": "report.md", "content": "# Draft"})
    proposed, proposed_hash = approval.arguments, approval.arguments_hash
    edit = {"name": "summary.md", "content": "# Final"}
    decided = decisions.approval_approve(
        actor=actor,
        approval_id=approval.pk,
        arguments_hash=proposed_hash,
        arguments=json.dumps(edit),
    )
    new_hash = _hash("write_artifact", edit)
    assert new_hash != proposed_hash
    assert decided.status == ApprovalStatus.APPROVED
    assert decided.edited_arguments_hash == new_hash == decided.approved_hash
    # The proposal stays as the model made it; the edit is stored beside it, defaults applied.
    assert decided.arguments == proposed and decided.arguments_hash == proposed_hash
    assert decided.edited_arguments == edit | {"content_type": "text/plain"}
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.status == ToolCallStatus.APPROVED
    assert (call.arguments, call.arguments_hash) == (decided.edited_arguments, new_hash)
    event = TaskEvent.objects.get(task_id=approval.task_id, kind=EventKind.APPROVED)
    assert event.data["edited"] is True
    assert event.data["original_arguments"] == proposed
    assert event.data["edited_arguments"] == decided.edited_arguments
    assert event.data["arguments_hash"] == proposed_hash
    assert event.data["edited_arguments_hash"] == new_hash
    assert event.data["edited_target"] == "summary.md"
    assert Task.objects.get(pk=approval.task_id).status == TaskStatus.READY


def test_an_edit_as_an_object_and_an_edit_that_changes_nothing(actor):
    approval = _operation("write_artifact", {"name": "report.md", "content": "# Draft"})
    # The proposal itself, without the default the model left out: the same operation.
    decided = decisions.approval_approve(
        actor=actor,
        approval_id=approval.pk,
        arguments_hash=approval.arguments_hash,
        arguments={"content": "# Draft", "name": "report.md"},
    )
    assert decided.status == ApprovalStatus.APPROVED and decided.edited_arguments_hash == ""
    assert decided.edited_arguments is None
    event = TaskEvent.objects.get(task_id=approval.task_id, kind=EventKind.APPROVED)
    assert "edited" not in event.data


@pytest.mark.parametrize(
    ("tool", "proposal", "edit", "code", "words"),
    [
        ("write_artifact", {"name": "a.md", "content": "x"}, "{not json", "invalid_arguments",
         "not valid JSON"),
        ("write_artifact", {"name": "a.md", "content": "x"}, "[1, 2]", "invalid_arguments",
         "must be a JSON object"),
        ("write_artifact", {"name": "a.md", "content": "x"}, "  ", "invalid_arguments",
         "are empty"),
        ("write_artifact", {"name": "a.md", "content": "x"}, {"content": "x"},
         "invalid_arguments", "name"),
        ("write_artifact", {"name": "a.md", "content": "x"}, {"name": "../a.md", "content": "x"},
         "artifact_name_invalid", "../a.md"),
        ("write_artifact", {"name": "a.md", "content": "x"}, {"name": "a.md", "content": "x" * 600},
         "artifact_too_large", "600 bytes"),
        ("read_file", {"path": "notes.txt"}, {"path": "../../etc/passwd"},
         "path_outside_workspace", "'..'"),
        ("read_file", {"path": "notes.txt"}, {"path": "/etc/passwd"},
         "path_outside_workspace", "Absolute paths"),
        ("fetch_url", {"url": "https://example.org/a"}, {"url": "http://127.0.0.1:8000/admin"},
         "url_address_not_allowed", "127.0.0.1"),
        ("fetch_url", {"url": "https://example.org/a"}, {"url": "ftp://example.org/a"},
         "url_scheme_not_allowed", "ftp"),
    ],
)  # fmt: skip
def test_an_invalid_edit_names_what_is_wrong_and_decides_nothing(
    actor, settings, tool, proposal, edit, code, words
):
    settings.ACTHELM_FETCH_ALLOW_PRIVATE = False
    approval = _operation(tool, proposal, limit_artifact_bytes=500)
    with pytest.raises(InvalidInput) as refused:
        decisions.approval_approve(
            actor=actor,
            approval_id=approval.pk,
            arguments_hash=approval.arguments_hash,
            arguments=edit,
        )
    assert refused.value.code == code and words in refused.value.message
    _unchanged(approval)


def test_an_edit_with_a_stale_hash_decides_nothing(actor):
    approval = _operation("write_artifact", {"name": "report.md", "content": "# Draft"})
    with pytest.raises(StaleDecision):
        decisions.approval_approve(
            actor=actor,
            approval_id=approval.pk,
            arguments_hash=_hash("write_artifact", {"name": "report.md", "content": "# Other"}),
            arguments={"name": "summary.md", "content": "# Final"},
        )
    _unchanged(approval)


def test_an_edit_of_a_tool_no_longer_on_the_task_is_refused(actor):
    approval = _operation("write_artifact", {"name": "report.md", "content": "# Draft"})
    Task.objects.filter(pk=approval.task_id).update(tools=["update_plan"])
    with pytest.raises(InvalidInput, match="no longer on the task's list"):
        decisions.approval_approve(
            actor=actor,
            approval_id=approval.pk,
            arguments_hash=approval.arguments_hash,
            arguments={"name": "summary.md", "content": "# Final"},
        )
    _unchanged(approval)


def test_deny_with_a_message_is_the_call_result_and_the_event(actor):
    approval = _operation("read_file", {"path": "secret.txt"})
    decided = decisions.approval_deny(
        actor=actor,
        approval_id=approval.pk,
        arguments_hash=approval.arguments_hash,
        message="  use notes.txt instead ",
    )
    assert decided.status == ApprovalStatus.DENIED and decided.message == "use notes.txt instead"
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.status == ToolCallStatus.DENIED
    assert call.result_for_model.startswith("denied by a person: use notes.txt instead")
    event = TaskEvent.objects.get(task_id=approval.task_id, kind=EventKind.DENIED)
    assert event.data["message"] == "use notes.txt instead"


def test_deny_without_a_message_keeps_the_fixed_text(actor):
    approval = _operation("read_file", {"path": "secret.txt"})
    decisions.approval_deny(
        actor=actor, approval_id=approval.pk, arguments_hash=approval.arguments_hash
    )
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.result_for_model == decisions.DENIED_RESULT


def test_a_denial_message_is_bounded(actor):
    approval = _operation("read_file", {"path": "secret.txt"})
    with pytest.raises(InvalidInput, match="at most 2000"):
        decisions.approval_deny(
            actor=actor,
            approval_id=approval.pk,
            arguments_hash=approval.arguments_hash,
            message="x" * (decisions.MESSAGE_MAX_CHARS + 1),
        )
    _unchanged(approval)


def test_a_cancel_settles_open_approvals_with_its_reason(actor):
    from agents.actions.task import task_cancel

    approval = _operation("read_file", {"path": "secret.txt"})
    task_cancel(actor=actor, task_id=approval.task_id, reason="wrong file, starting over")
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.CANCELLED
    assert approval.message == "wrong file, starting over"
    event = TaskEvent.objects.get(task_id=approval.task_id, kind=EventKind.CANCELLED)
    assert event.data["reason"] == "wrong file, starting over"
    assert event.data["approvals_settled"] == 1


def test_a_long_edit_is_named_in_the_event_and_kept_whole_on_the_approval(actor):
    approval = _operation("write_artifact", {"name": "report.md", "content": "# Draft"})
    content = "word " * 5_000  # 25,000 characters: more than an event copies
    decided = decisions.approval_approve(
        actor=actor,
        approval_id=approval.pk,
        arguments_hash=approval.arguments_hash,
        arguments={"name": "report.md", "content": content},
    )
    assert decided.edited_arguments["content"] == content
    event = TaskEvent.objects.get(task_id=approval.task_id, kind=EventKind.APPROVED)
    size = len(json.dumps(decided.edited_arguments))
    assert event.data["edited_arguments"] == {
        "omitted": f"{size} characters; the approval keeps them"
    }
    assert event.data["original_arguments"] == approval.arguments
    assert event.data["edited_arguments_hash"] == decided.edited_arguments_hash
