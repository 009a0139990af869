"""Retention: remove the heavy history of tasks closed long ago.

For each `done` or `cancelled` task whose last update is older than the horizon, pruning deletes
its transcript (turns, tool calls and the approvals / needs_review decisions bound to them,
compaction decisions, the stored system prompt and plan), its artifacts (rows and files), the
memory selections of its runs, and the timeline events that narrate that transcript (one per
model turn, tool result and operation decision: the bulk of the timeline).

It keeps the task row, its dependencies, its runs (status, verdict, usage) and its lifecycle
events (created, claimed, failed, submitted, reopened, closed, cancelled, …: a few per attempt),
so the task list, the dependency graph, the audit of who closed or cancelled what, the scorecard
and the /metrics counters (counted from those events and runs) stay whole. Open tasks (every
other state, `failed` included) are never touched.

Work happens in batches, one transaction per batch with the batch's rows locked; files are
removed after the batch commits. A second pass finds nothing: a task qualifies only while it still
has something to remove.
"""

import logging
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from django.db import transaction
from django.db.models import Exists, Model, OuterRef, Q, QuerySet, Sum
from django.utils import timezone

from agents.models import Artifact, CompactionDecision, Conversation, ToolCall, Turn
from approvals.models import Approval, ReviewDecision
from memory.models import MemorySelection
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tasks.workspace import artifacts_dir

log = logging.getLogger("acthelm.retention")

PRUNABLE_STATES = (TaskStatus.DONE, TaskStatus.CANCELLED)
# The events that narrate the transcript (they point at turns and tool calls that go with it).
# Every other kind is lifecycle and stays; a kind added later stays too unless listed here.
REMOVED_EVENT_KINDS = (
    EventKind.MODEL_TURN,
    EventKind.TOOL_RESULT,
    EventKind.APPROVAL_REQUESTED,
    EventKind.APPROVED,
    EventKind.DENIED,
    EventKind.NEEDS_REVIEW,
    EventKind.RUN_AGAIN,
    EventKind.SKIPPED,
)
DEFAULT_BATCH_SIZE = 500
SAMPLE_IDS = 20


def _events(task_ids: Iterable[int]) -> QuerySet[TaskEvent]:
    return TaskEvent.objects.filter(task_id__in=task_ids, kind__in=REMOVED_EVENT_KINDS)


# What is removed, in the order it is deleted (children before the rows they point to).
# Each is given the tasks' ids: a batch's list, or (a dry run) the subquery of the tasks.
CATEGORIES: dict[str, Callable[[Iterable[int]], QuerySet[Model]]] = {
    "approvals": lambda ids: Approval.objects.filter(task_id__in=ids),
    "review_decisions": lambda ids: ReviewDecision.objects.filter(task_id__in=ids),
    "compactions": lambda ids: CompactionDecision.objects.filter(task_id__in=ids),
    "artifacts": lambda ids: Artifact.objects.filter(task_id__in=ids),
    "tool_calls": lambda ids: ToolCall.objects.filter(task_id__in=ids),
    "turns": lambda ids: Turn.objects.filter(task_id__in=ids),
    "memory_selections": lambda ids: MemorySelection.objects.filter(run__task_id__in=ids),
    "conversations": lambda ids: Conversation.objects.filter(task_id__in=ids),
    "events": _events,
}


@dataclass
class PruneReport:
    dry_run: bool
    horizon: datetime
    tasks: int = 0
    removed: dict[str, int] = field(default_factory=lambda: dict.fromkeys(CATEGORIES, 0))
    artifact_bytes: int = 0
    batches: int = 0
    sample_task_ids: list[int] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dry_run": self.dry_run,
            "horizon": self.horizon.isoformat(),
            "tasks": self.tasks,
            ("would_remove" if self.dry_run else "removed"): self.removed,
            "artifact_bytes": self.artifact_bytes,
            "batches": self.batches,
            "sample_task_ids": self.sample_task_ids,
        }

    def summary(self) -> str:
        verb = "would remove" if self.dry_run else "removed"
        parts = ", ".join(f"{n} {name.replace('_', ' ')}" for name, n in self.removed.items())
        text = (
            f"{self.tasks} done/cancelled task(s) last updated before "
            f"{self.horizon:%Y-%m-%d %H:%M} UTC: {verb} {parts} "
            f"({self.artifact_bytes} artifact bytes)."
        )
        if self.dry_run:
            text += " Dry run: nothing was removed; add --yes to remove it."
        return text


def _has_history() -> Q:
    task = OuterRef("pk")
    return (
        Q(Exists(Turn.objects.filter(task=task)))
        | Q(Exists(ToolCall.objects.filter(task=task)))
        | Q(Exists(Artifact.objects.filter(task=task)))
        | Q(Exists(Conversation.objects.filter(task=task)))
        | Q(Exists(CompactionDecision.objects.filter(task=task)))
        | Q(Exists(MemorySelection.objects.filter(run__task=task)))
        | Q(Exists(TaskEvent.objects.filter(task=task, kind__in=REMOVED_EVENT_KINDS)))
    )


def prunable_tasks(horizon: datetime) -> QuerySet[Task]:
    """Done/cancelled tasks last updated before `horizon` that still have history to remove."""
    return Task.objects.filter(status__in=PRUNABLE_STATES, updated_at__lt=horizon).filter(
        _has_history()
    )


def prune(
    *,
    older_than_days: float,
    dry_run: bool = True,
    batch_size: int = DEFAULT_BATCH_SIZE,
    now: datetime | None = None,
) -> PruneReport:
    if older_than_days < 0:
        raise ValueError("older_than_days must not be negative")
    if batch_size < 1:
        raise ValueError("batch_size must be positive")
    horizon = (now or timezone.now()) - timedelta(days=older_than_days)
    report = PruneReport(dry_run=dry_run, horizon=horizon)
    if dry_run:
        ids = prunable_tasks(horizon).values_list("id", flat=True)
        report.tasks = prunable_tasks(horizon).count()
        report.sample_task_ids = list(
            prunable_tasks(horizon).order_by("id").values_list("id", flat=True)[:SAMPLE_IDS]
        )
        report.removed = {name: qs(ids).count() for name, qs in CATEGORIES.items()}
        report.artifact_bytes = _artifact_bytes(ids)
        return report

    last_id = 0
    while True:
        batch = list(
            prunable_tasks(horizon)
            .filter(id__gt=last_id)
            .order_by("id")
            .values_list("id", flat=True)[:batch_size]
        )
        if not batch:
            break
        last_id = batch[-1]
        pruned = _prune_batch(batch, horizon=horizon, report=report)
        report.batches += 1
        report.tasks += len(pruned)
        room = SAMPLE_IDS - len(report.sample_task_ids)
        report.sample_task_ids += pruned[:room]
    log.info(
        "tasks.pruned",
        extra={"tasks": report.tasks, "batches": report.batches, **report.removed},
    )
    return report


def _artifact_bytes(ids: Iterable[int]) -> int:
    return Artifact.objects.filter(task_id__in=ids).aggregate(n=Sum("size"))["n"] or 0


def _prune_batch(candidate_ids: list[int], *, horizon: datetime, report: PruneReport) -> list[int]:
    with transaction.atomic():
        # Lock and re-check: a task deleted meanwhile is gone; done/cancelled cannot reopen.
        ids = list(
            Task.objects.select_for_update()
            .filter(pk__in=candidate_ids, status__in=PRUNABLE_STATES, updated_at__lt=horizon)
            .order_by("id")
            .values_list("id", flat=True)
        )
        if not ids:
            return []
        report.artifact_bytes += _artifact_bytes(ids)
        for name, queryset in CATEGORIES.items():
            qs = queryset(ids)
            _, per_model = qs.delete()
            report.removed[name] += per_model.get(qs.model._meta.label, 0)
        transaction.on_commit(lambda: _remove_artifact_files(ids))
    return ids


def _remove_artifact_files(task_ids: list[int]) -> None:
    for task_id in task_ids:
        shutil.rmtree(artifacts_dir(task_id, create=False), ignore_errors=True)
