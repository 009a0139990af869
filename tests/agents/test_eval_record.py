"""What the grader sees of a task is what the database stored: state, answer, artifacts with
their text (read as the acceptance checks read it), calls with their statuses, approvals, plan,
usage and the models that ran it."""

import pytest
from django.utils import timezone

from agents.engine.verdict.evidence import CallSeen
from agents.eval.grading import ApprovalRecord
from agents.eval.record import task_record
from agents.states import RunStatus, ToolCallStatus
from tasks.states import TaskStatus
from tests.factories import (
    AgentRunFactory,
    ApprovalFactory,
    ArtifactFactory,
    ConversationFactory,
    ModelFactory,
    TaskFactory,
    ToolCallFactory,
    TurnFactory,
)

pytestmark = pytest.mark.django_db


def test_the_record_of_a_task(tmp_path):
    model, other = ModelFactory(), ModelFactory()
    task = TaskFactory(status=TaskStatus.REVIEW, is_evaluation=True, model=model)
    first = AgentRunFactory(
        task=task,
        number=1,
        model=model,
        status=RunStatus.CANCELLED,
        finished_at=timezone.now(),
        model_turns=2,
        input_tokens=20,
        output_tokens=10,
        active_seconds=1.5,
    )
    second = AgentRunFactory(
        task=task,
        number=2,
        model=other,
        status=RunStatus.SUCCEEDED,
        finished_at=timezone.now(),
        answer="It is teal.",
        answer_stored_at=timezone.now(),
        model_turns=1,
        input_tokens=5,
        output_tokens=5,
        active_seconds=0.5,
    )
    turn = TurnFactory(run=first, task=task, index=1)
    ToolCallFactory(turn=turn, position=0, tool="update_plan", status="succeeded", run_count=1)
    denied = ToolCallFactory(turn=turn, position=1, tool="write_artifact", status="denied")
    ToolCallFactory(
        turn=TurnFactory(run=second, task=task, index=3),
        position=0,
        tool="fetch_url",
        status=ToolCallStatus.REFUSED,
        error_code="tool_not_allowed",
    )
    ApprovalFactory(
        tool_call=denied, target="decision.md", status="denied", decided_at=timezone.now()
    )
    text, binary = tmp_path / "report.md", tmp_path / "blob.bin"
    text.write_text("# Report\n")
    binary.write_bytes(b"\xff\xfe\x00")
    ArtifactFactory(task=task, name="report.md", path=str(text))
    ArtifactFactory(task=task, name="blob.bin", path=str(binary))
    ArtifactFactory(task=task, name="gone.md", path=str(tmp_path / "gone.md"))
    ConversationFactory(task=task, plan={"steps": [{"step": "x"}]})

    record = task_record(task.pk)
    assert record.state == TaskStatus.REVIEW and record.answer == "It is teal."
    assert record.calls == (
        CallSeen("update_plan", "succeeded", "", 1),
        CallSeen("write_artifact", "denied", "", 0),
        CallSeen("fetch_url", "refused", "tool_not_allowed", 0),
    )
    assert record.approvals == (ApprovalRecord("write_artifact", "decision.md", "denied"),)
    # Listed by name; the text read through the acceptance checks' reader (None: not text).
    assert {name: record.text(name) for name in record.artifacts} == {
        "report.md": "# Report\n",
        "blob.bin": None,
        "gone.md": None,
    }
    assert record.plan is True
    assert (record.model_turns, record.input_tokens, record.output_tokens) == (3, 25, 15)
    assert record.active_seconds == 2.0
    assert record.model_ids == (model.pk, other.pk)


def test_a_task_that_never_ran():
    task = TaskFactory(status=TaskStatus.CANCELLED)
    record = task_record(task.pk)
    assert record.state == TaskStatus.CANCELLED and record.answer == "" and record.calls == ()
    assert record.plan is False and record.model_turns == 0 and record.model_ids == ()
