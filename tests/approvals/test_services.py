"""approvals.services writes the approval and needs_review rows: in the caller's transaction (the
recorder's fenced step), in as few statements as the rows need."""

import pytest
from django.db import transaction
from django.utils import timezone

from approvals.models import Approval, ReviewDecision
from approvals.services import ApprovalRequest, open_review_row, request_approvals
from approvals.states import ApprovalStatus, ReviewChoice
from tests.factories import ReviewDecisionFactory, ToolCallFactory, TurnFactory, UserFactory

pytestmark = pytest.mark.django_db


def _request(call) -> ApprovalRequest:
    return {
        "tool": call.tool,
        "target": "https://example.com/",
        "arguments": call.arguments,
        "arguments_hash": call.arguments_hash,
        "reason": "policy_ask",
        "effect": "Sends an HTTP GET request to https://example.com/",
    }


def test_approvals_are_requested_in_one_insert_of_the_callers_transaction(
    django_assert_num_queries,
):
    turn = TurnFactory()
    calls = [ToolCallFactory(turn=turn, status="awaiting_approval") for _ in range(3)]
    with django_assert_num_queries(0):
        request_approvals(task_id=turn.task_id, run_id=turn.run_id, requests=[])
    with transaction.atomic():
        with django_assert_num_queries(1):
            request_approvals(
                task_id=turn.task_id,
                run_id=turn.run_id,
                requests=[(call.pk, _request(call)) for call in calls],
            )
        rows = Approval.objects.filter(task_id=turn.task_id, run_id=turn.run_id)
        assert sorted(rows.values_list("tool_call_id", flat=True)) == [c.pk for c in calls]
        assert {r.status for r in rows} == {ApprovalStatus.PENDING}
        transaction.set_rollback(True)  # the caller's transaction decides: nothing was committed
    assert not Approval.objects.exists()


def test_a_spent_review_decision_is_opened_again():
    decision = ReviewDecisionFactory(
        choice=ReviewChoice.RUN_AGAIN, decided_by=UserFactory(), decided_at=timezone.now()
    )
    open_review_row(task_id=decision.task_id, tool_call_id=decision.tool_call_id)
    decision.refresh_from_db()
    assert (decision.choice, decision.decided_by, decision.decided_at) == (
        ReviewChoice.PENDING,
        None,
        None,
    )
    call = ToolCallFactory(status="unknown")
    open_review_row(task_id=call.task_id, tool_call_id=call.pk)
    assert ReviewDecision.objects.get(tool_call=call).choice == ReviewChoice.PENDING
