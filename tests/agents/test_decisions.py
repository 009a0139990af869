import pytest

from agents.actions import decisions
from agents.states import ToolCallStatus
from approvals.states import ApprovalStatus, ReviewChoice
from core.actors import Actor
from core.exceptions import NotPermitted, StaleDecision
from tasks.models import Task
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
