"""Reads of tasks for the console, the CLI and the API."""

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from typing import Any, TypedDict

from django.conf import settings
from django.db.models import BooleanField, Count, Model, QuerySet
from django.db.models.expressions import RawSQL

from core.numbers import money_text
from tasks.limits import LIMITS, Limit
from tasks.models import Goal, Task, TaskEvent
from tasks.states import OPEN, TaskStatus, allowed_actions


def _limit_value(value: int | Decimal | None, limit: Limit) -> int | Decimal | str | None:
    return money_text(value) if limit.money and isinstance(value, Decimal) else value


def tagged[Rows: QuerySet[Any]](tasks: Rows, tag: str) -> Rows:
    """The tasks that carry `tag`, whatever its case ("weekly report" finds "Weekly Report"):
    the console's filters and the API's list read tags the same way."""
    table = Task._meta.db_table
    has_tag = RawSQL(
        f'EXISTS (SELECT 1 FROM unnest("{table}"."tags") AS t(tag) WHERE lower(t.tag) = lower(%s))',
        (tag,),
        output_field=BooleanField(),
    )
    return tasks.filter(has_tag)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


def max_attempts() -> int:
    """ACTHELM_MAX_ATTEMPTS: the attempts a task gets in all, the first run among them (a run
    that stops for a pause, an approval or a hand-back is not an attempt)."""
    return max(1, settings.ACTHELM_MAX_ATTEMPTS)


def attempts_text(failed: int, of: int | None = None) -> str:
    """The one wording of a task's failed attempts, for the console, the CLI and the API:
    "1 of 3 attempts failed", "all 3 attempts failed"."""
    of = max_attempts() if of is None else of
    if failed >= of:
        return f"all {failed} attempts failed" if failed > 1 else "its one attempt failed"
    return f"{failed} of {of} attempt{'s' if of != 1 else ''} failed"


#: A task's fields as JSON, each written once: the CLI's --json, the API (its schemas pick the
#: fields they publish) and the goal page read them through `task_as_dict`.
TASK_FIELDS: dict[str, Callable[[Task], object]] = {
    "id": lambda t: t.pk,
    "title": lambda t: t.title,
    "instruction": lambda t: t.instruction,
    "status": lambda t: t.status,
    "kind": lambda t: t.kind,
    "origin": lambda t: t.origin,
    "is_evaluation": lambda t: t.is_evaluation,
    "goal_id": lambda t: t.goal_id,
    "priority": lambda t: t.priority,
    "tags": lambda t: list(t.tags),
    # .all(): a list that prefetched the links (acthelm_task list) asks nothing more.
    "depends_on": lambda t: [link.depends_on_id for link in t.dependency_links.all()],
    "tools": lambda t: list(t.tools),
    "tool_policies": lambda t: t.tool_policies,
    "allowed_domains": lambda t: list(t.allowed_domains),
    "acceptance_checks": lambda t: list(t.acceptance_checks or []),
    "connection": lambda t: t.connection.name if t.connection is not None else None,
    "model": lambda t: t.model.name if t.model is not None else None,
    "limits": lambda t: {
        limit.key: _limit_value(getattr(t, limit.field), limit) for limit in LIMITS
    },
    "claim_count": lambda t: t.claim_count,
    "lease_owner": lambda t: t.lease_owner or None,
    "lease_expires_at": lambda t: _iso(t.lease_expires_at),
    "not_before": lambda t: _iso(t.not_before),
    "failed_attempts": lambda t: t.failed_attempts,
    "max_attempts": lambda t: max_attempts(),
    "failure_code": lambda t: t.failure_code or None,
    "failure_message": lambda t: t.failure_message or None,
    "feedback": lambda t: t.feedback or None,
    "actions": lambda t: sorted(allowed_actions(t.status)),
    "created_at": lambda t: t.created_at.isoformat(),
    "updated_at": lambda t: t.updated_at.isoformat(),
}
#: A row of a task list (the API's list): no field that asks a query of its own; connection
#: and model are selected with the rows.
SUMMARY_FIELDS = (
    "id", "title", "status", "kind", "origin", "is_evaluation", "goal_id", "priority", "tags",
    "connection", "model", "failure_code", "actions", "created_at", "updated_at",
)  # fmt: skip
#: A row of a goal's newest tasks: model columns only (read with `.only(*GOAL_ROW_FIELDS)`).
GOAL_ROW_FIELDS = ("id", "title", "status", "kind", "origin", "failure_code", "created_at")


def task_as_dict(task: Task, fields: Iterable[str] | None = None) -> dict[str, Any]:
    """The task as JSON: every field of `TASK_FIELDS`, or those named in `fields`. The whole task
    also says `loop` when it failed in an error loop and, on a list annotated with
    `cost_total`, its `cost`."""
    if fields is not None:
        return {name: TASK_FIELDS[name](task) for name in fields}
    data: dict[str, Any] = {name: field(task) for name, field in TASK_FIELDS.items()}
    if task.failure_code == "error_loop":
        data["loop"] = True
    if hasattr(task, "cost_total"):
        data["cost"] = money_text(task.cost_total)
    return data


# A timeline event as the API and the CLI show it ("from" is a keyword: the functional form).
EventJSON = TypedDict(
    "EventJSON",
    {
        "id": int,
        "kind": str,
        "actor": str,
        "actor_kind": str,
        "from": str | None,
        "to": str | None,
        "run_id": int | None,
        "data": dict[str, Any],  # what the event's kind records
        "at": str,
    },
)


def event_as_dict(event: TaskEvent) -> EventJSON:
    return {
        "id": event.pk,
        "kind": event.kind,
        "actor": event.actor_label,
        "actor_kind": event.actor_kind,
        "from": event.from_status or None,
        "to": event.to_status or None,
        "run_id": event.run_id,
        "data": event.data,
        "at": event.created_at.isoformat(),
    }


def blocking_reason(task: Task) -> str | None:
    """Why a blocked task waits, naming each unfinished dependency and its state; None when the
    task is not blocked. A cancelled or failed dependency is called out: it will not finish by
    itself, so the task stays blocked until a person acts."""
    if task.status != TaskStatus.BLOCKED:
        return None
    deps = list(
        Task.objects.filter(dependant_links__task=task)
        .exclude(status=TaskStatus.DONE)
        .order_by("id")
        .values("id", "title", "status")
    )
    if not deps:
        return "All its dependencies are done; it becomes ready at the next reconciler pass."
    waiting: list[str] = []
    stuck: list[str] = []
    for dep in deps:
        name = f"#{dep['id']} “{dep['title']}”"
        if dep["status"] == TaskStatus.CANCELLED:
            stuck.append(f"{name} was cancelled and will never be done")
        elif dep["status"] == TaskStatus.FAILED:
            stuck.append(f"{name} failed and is done only if it is retried and closed")
        else:
            waiting.append(f"{name} ({TaskStatus(dep['status']).label.lower()})")
    parts: list[str] = []
    if waiting:
        parts.append("Waits for " + ", ".join(waiting) + " to be done.")
    if stuck:
        parts.append(
            "Stuck: "
            + "; ".join(stuck)
            + ". This task stays blocked until every dependency is done; cancel it if it is no "
            "longer needed."
        )
    return " ".join(parts)


#: States whose tasks pile up for ever: the status filters count the others only.
_UNCOUNTED = (TaskStatus.DONE, TaskStatus.CANCELLED)
_COUNTED = [value for value in TaskStatus.values if value not in _UNCOUNTED]


def status_counts(*, evaluation: bool = False) -> dict[str, int]:
    """Tasks per state for the console's status filters, in one GROUP BY over task_status_idx;
    done and cancelled (which only grow) are not counted (not in the answer); the others are,
    0 included."""
    rows = (
        Task.objects.filter(is_evaluation=evaluation, status__in=_COUNTED)
        .values_list("status")
        .annotate(n=Count("id"))
        .order_by()
    )
    counts = dict.fromkeys(_COUNTED, 0)
    return counts | dict(rows)


@dataclass(frozen=True)
class TaskPage:
    """One page of a newest-first task list, and the keys of the pages around it."""

    tasks: list[Task]
    older: int | None  # pass as `before` for the next (older) page
    newer: int | None  # pass as `after` for the previous (newer) page


def newest_page[M: Model](
    rows: QuerySet[M], *, key: str, size: int, before: int | None = None
) -> tuple[list[M], int | None]:
    """The newest `size` rows by `key` (those below `before` when given), oldest first, and the
    cursor of the next older page: pass it back as `before` (None when there is none). One
    bounded query, however long the transcript or the timeline."""
    if before is not None:
        rows = rows.filter(**{f"{key}__lt": before})
    page = list(rows.order_by(f"-{key}")[: size + 1])
    older: int | None = getattr(page[size - 1], key) if len(page) > size else None
    return page[:size][::-1], older


# The task page and the API's task document show the same pages: the newest turns and events,
# older ones page by page; "all turns" is bounded too.
TRANSCRIPT_SIZE = 100
TRANSCRIPT_ALL_MAX = 500
TIMELINE_SIZE = 200


def transcript_page[M: Model](
    turns: QuerySet[M], *, all_turns: bool = False, before: int | None = None
) -> tuple[list[M], int | None]:
    """A task's transcript page (`turns` is its turn queryset, prefetched as the caller needs):
    the newest 100 turns (500 with `all_turns`) below `before`, and the next older cursor."""
    size = TRANSCRIPT_ALL_MAX if all_turns else TRANSCRIPT_SIZE
    return newest_page(turns, key="index", size=size, before=before)


def timeline_page(task: Task, *, before: int | None = None) -> tuple[list[TaskEvent], int | None]:
    """A task's timeline page: the newest 200 events below `before`, and the next older cursor."""
    return newest_page(task.events.all(), key="id", size=TIMELINE_SIZE, before=before)


def task_keyset_page(
    tasks: QuerySet[Task], *, before: int | None, after: int | None, size: int
) -> TaskPage:
    """Newest first, keyset-paginated on the primary key (no COUNT, no OFFSET): `before` gives
    the page of tasks older than that id, `after` the page newer than it."""
    if after and not before:
        rows = list(tasks.filter(id__gt=after).order_by("id")[: size + 1])
        has_newer = len(rows) > size
        rows = rows[:size][::-1]
        has_older = True
    else:
        if before:
            tasks = tasks.filter(id__lt=before)
        rows = list(tasks.order_by("-id")[: size + 1])
        has_older = len(rows) > size
        rows = rows[:size]
        has_newer = bool(before)
    return TaskPage(
        tasks=rows,
        older=rows[-1].pk if rows and has_older else None,
        newer=rows[0].pk if rows and has_newer else None,
    )


def goal_as_dict(goal: Goal, *, with_tasks: int = 0) -> dict[str, Any]:
    """A goal, its open-task counts by state, and (with_tasks) its newest tasks."""
    counts = dict(
        Task.objects.filter(goal=goal)
        .values_list("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    data: dict[str, Any] = {
        "id": goal.pk,
        "title": goal.title,
        "description": goal.description,
        "active": goal.active,
        "acceptance_checks": list(goal.acceptance_checks or []),
        "created_by": goal.created_by.get_username() if goal.created_by is not None else None,
        "created_at": goal.created_at.isoformat(),
        "task_counts": counts,
        "open_tasks": sum(n for status, n in counts.items() if status in OPEN),
    }
    if with_tasks:
        tasks = Task.objects.filter(goal=goal).order_by("-id")[:with_tasks]
        data["tasks"] = [task_as_dict(t, GOAL_ROW_FIELDS) for t in tasks.only(*GOAL_ROW_FIELDS)]
    return data
