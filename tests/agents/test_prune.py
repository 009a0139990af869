"""Retention: old done/cancelled tasks lose their heavy history in batches; open tasks never."""

import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.utils import timezone

from agents.engine.runtime.prune import REMOVED_EVENT_KINDS, prune
from agents.models import AgentRun, Artifact, CompactionDecision, Conversation, ToolCall, Turn
from agents.states import RunStatus
from approvals.models import Approval
from memory.models import MemorySelection
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tasks.workspace import add_input_file, artifacts_dir
from tests.factories import (
    AgentRunFactory,
    ApprovalFactory,
    ArtifactFactory,
    ConversationFactory,
    MemorySelectionFactory,
    TaskEventFactory,
    TaskFactory,
    ToolCallFactory,
    TurnFactory,
)

pytestmark = pytest.mark.django_db

DAYS = 30


def with_history(status, *, age_days):
    """A task with a run, two turns, a tool call with an approval, a compaction decision, an
    artifact (row and file), a memory selection, a conversation and events of every sort."""
    task = TaskFactory(status=status)
    run = AgentRunFactory(
        task=task, status=RunStatus.SUCCEEDED, finished_at=timezone.now(), input_tokens=123
    )
    TurnFactory(task=task, run=run, index=0)
    call = ToolCallFactory(turn=TurnFactory(task=task, run=run, index=1))
    ApprovalFactory(tool_call=call)
    compaction = CompactionDecision.objects.create(
        task=task, run=run, estimated_tokens_before=10, estimated_tokens_after=5
    )
    compaction.tool_calls.add(call)
    artifact_file = artifacts_dir(task.pk) / "report.md"
    artifact_file.write_text("# report")
    ArtifactFactory(task=task, run=run, name="report.md", size=8)
    MemorySelectionFactory(run=run)
    ConversationFactory(task=task)
    claim = TaskEventFactory(task=task, kind=EventKind.CLAIMED, run=run)
    AgentRun.objects.filter(pk=run.pk).update(claim_event=claim)
    for kind in (
        EventKind.CREATED,
        EventKind.MODEL_TURN,
        EventKind.TOOL_RESULT,
        EventKind.APPROVAL_REQUESTED,
        EventKind.APPROVED,
        EventKind.SUBMITTED,
    ):
        TaskEventFactory(task=task, kind=kind, run=run)
    if status == TaskStatus.DONE:
        TaskEventFactory(task=task, kind=EventKind.CLOSED, actor_kind="person")
    add_input_file(task.pk, name="input.csv", data="a,b\n1,2\n")
    Task.objects.filter(pk=task.pk).update(updated_at=timezone.now() - timedelta(days=age_days))
    return task


def history(task) -> dict:
    return {
        "turns": Turn.objects.filter(task=task).count(),
        "tool_calls": ToolCall.objects.filter(task=task).count(),
        "approvals": Approval.objects.filter(task=task).count(),
        "compactions": CompactionDecision.objects.filter(task=task).count(),
        "artifacts": Artifact.objects.filter(task=task).count(),
        "artifact_file": (artifacts_dir(task.pk, create=False) / "report.md").exists(),
        "memory_selections": MemorySelection.objects.filter(run__task=task).count(),
        "conversations": Conversation.objects.filter(task=task).count(),
        "events": TaskEvent.objects.filter(task=task).count(),
    }


FULL = {
    "turns": 2,
    "tool_calls": 1,
    "approvals": 1,
    "compactions": 1,
    "artifacts": 1,
    "artifact_file": True,
    "memory_selections": 1,
    "conversations": 1,
}


@pytest.fixture
def tasks():
    return {
        "old_done": with_history(TaskStatus.DONE, age_days=DAYS + 5),
        "old_cancelled": with_history(TaskStatus.CANCELLED, age_days=DAYS + 1),
        "recent_done": with_history(TaskStatus.DONE, age_days=DAYS - 1),
        **{
            f"old_{status}": with_history(status, age_days=DAYS + 100)
            for status in TaskStatus
            if status not in (TaskStatus.DONE, TaskStatus.CANCELLED)
        },
    }


def test_prunes_old_closed_tasks_and_keeps_everything_else_whole(
    tasks, django_capture_on_commit_callbacks
):
    before = {name: history(task) for name, task in tasks.items()}

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        report = prune(older_than_days=DAYS, dry_run=False, batch_size=1)

    assert report.tasks == 2 and report.batches == 2
    assert len(callbacks) == 2  # the files of each batch go once its transaction commits
    assert sorted(report.sample_task_ids) == sorted(
        [tasks["old_done"].pk, tasks["old_cancelled"].pk]
    )
    assert report.removed == {
        "approvals": 2,
        "review_decisions": 0,
        "compactions": 2,
        "artifacts": 2,
        "tool_calls": 2,
        "turns": 4,
        "memory_selections": 2,
        "conversations": 2,
        "events": 2 * 4,  # model_turn, tool_result, approval_requested, approved of each
    }
    assert report.artifact_bytes == 16
    for name in ("old_done", "old_cancelled"):
        task = Task.objects.get(pk=tasks[name].pk)  # the row stays
        left = history(task)
        assert left == dict.fromkeys(FULL, 0) | {"artifact_file": False, "events": left["events"]}
        assert not set(task.events.values_list("kind", flat=True)) & set(REMOVED_EVENT_KINDS)
        run = task.runs.get()
        assert run.input_tokens == 123  # the runs stay: the scorecard and /metrics count them
        assert run.claim_event.kind == EventKind.CLAIMED
        # Input files a person gave are not artifacts: they stay.
        assert (artifacts_dir(task.pk, create=False).parent / "workspace" / "input.csv").exists()
    kept = set(TaskEvent.objects.filter(task=tasks["old_done"].pk).values_list("kind", flat=True))
    assert kept == {EventKind.CREATED, EventKind.CLAIMED, EventKind.SUBMITTED, EventKind.CLOSED}
    for name, task in tasks.items():
        if name not in ("old_done", "old_cancelled"):
            assert history(task) == before[name], name
            assert history(task) | {"events": 0} == FULL | {"events": 0}


def test_a_second_run_removes_nothing(tasks, django_capture_on_commit_callbacks):
    with django_capture_on_commit_callbacks(execute=True):
        prune(older_than_days=DAYS, dry_run=False)
    before = {name: history(task) for name, task in tasks.items()}
    events = TaskEvent.objects.count()

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        again = prune(older_than_days=DAYS, dry_run=False)

    assert again.tasks == 0 and again.batches == 0 and not callbacks
    assert set(again.removed.values()) == {0}
    assert {name: history(task) for name, task in tasks.items()} == before
    assert TaskEvent.objects.count() == events
    assert prune(older_than_days=DAYS).tasks == 0  # nor would a dry run


def test_a_dry_run_counts_and_removes_nothing(tasks):
    before = {name: history(task) for name, task in tasks.items()}
    report = prune(older_than_days=DAYS)
    assert report.dry_run and report.tasks == 2 and report.removed["turns"] == 4
    assert report.removed["events"] == 8 and report.artifact_bytes == 16
    assert {name: history(task) for name, task in tasks.items()} == before


def test_the_command_is_a_dry_run_unless_told_yes(tasks, django_capture_on_commit_callbacks):
    out = StringIO()
    call_command("acthelm_prune", "--older-than", str(DAYS), stdout=out)
    assert "would remove" in out.getvalue() and "--yes" in out.getvalue()
    assert history(tasks["old_done"])["turns"] == 2

    out = StringIO()
    with django_capture_on_commit_callbacks(execute=True):
        call_command(
            "acthelm_prune",
            "--older-than",
            str(DAYS),
            "--yes",
            "--json",
            "--batch-size",
            "1",
            stdout=out,
        )
    data = json.loads(out.getvalue())
    assert data["dry_run"] is False and data["tasks"] == 2 and data["removed"]["turns"] == 4
    assert history(tasks["old_done"])["turns"] == 0
    assert history(tasks["recent_done"])["turns"] == 2


@pytest.mark.parametrize("days", ["-1", "soon"])
def test_the_command_refuses_a_bad_horizon(days):
    with pytest.raises(CommandError):
        call_command("acthelm_prune", "--older-than", days, stdout=StringIO())


def test_events_that_counters_and_the_scorecard_count_are_kept():
    counted = {
        # /metrics counters (docs/operations.md)
        EventKind.CLAIMED,
        EventKind.LOST,
        EventKind.REQUEUED,
        EventKind.RETRY_SCHEDULED,
        EventKind.HANDED_BACK,
        EventKind.PROVIDER_COOLDOWN,
        EventKind.FAILED,
        # the scorecard, and the audit of what people decided about tasks
        EventKind.CLOSED,
        EventKind.AUTO_CLOSED,
        EventKind.REOPENED,
        EventKind.CANCELLED,
        EventKind.CREATED,
    }
    assert not counted & set(REMOVED_EVENT_KINDS)
