"""agents.selectors.task_read: one read of a task for the task page, the API and the CLI."""

import pytest
from django.utils import timezone

from agents.selectors import task_read
from approvals.states import ApprovalStatus
from tests.factories import (
    AgentRunFactory,
    ApprovalFactory,
    ReviewDecisionFactory,
    ToolCallFactory,
    TurnFactory,
)

pytestmark = pytest.mark.django_db


def test_an_unknown_task_reads_as_none():
    assert task_read(999_999) is None


def test_the_pending_operations_read_the_same_from_the_page_and_from_an_older_page():
    run = AgentRunFactory()
    turns = [TurnFactory(run=run, index=i) for i in range(3)]
    approval = ApprovalFactory(tool_call=ToolCallFactory(turn=turns[-1], position=0))
    ApprovalFactory(
        tool_call=ToolCallFactory(turn=turns[-1], position=1),
        status=ApprovalStatus.APPROVED,
        decided_at=timezone.now(),
    )
    review = ReviewDecisionFactory(tool_call=ToolCallFactory(turn=turns[-1], position=2))

    newest = task_read(run.task_id)
    older = task_read(run.task_id, turns_before=turns[-1].index)
    without = task_read(run.task_id, transcript=False, all_events=True)
    for read in (newest, older, without):
        assert read is not None
        assert read.pending_approvals == [approval]
        assert read.pending_reviews == [review]
        assert read.pending_reviews[0].tool_call == review.tool_call
    assert [t.index for t in newest.turns] == [0, 1, 2] and newest.older_turns is None
    assert [t.index for t in older.turns] == [0, 1]
    assert without.turns == [] and without.older_events is None
    assert [f.run for f in newest.runs] == [run]


def test_a_call_reads_the_head_of_its_result_and_its_length():
    call = ToolCallFactory(result="x" * 5000, result_for_model="x" * 5000)
    read = task_read(call.task_id)
    assert read is not None
    (shown,) = read.turns[0].tool_calls.all()
    assert (len(shown.result_head), shown.full_result_chars, shown.full_differs) == (
        4000,
        5000,
        False,
    )
