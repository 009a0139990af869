"""The filters a person finds tasks with — text, tag, goal, model, dates and state — read from a
query string, so a filtered page is a bookmark. One definition for the review page and the tasks
list: the same names in the URL, the same meaning, the same form (`console/_task_filters.html`)."""

import datetime
from typing import Any, TypedDict
from urllib.parse import urlencode

from django.db.models import Exists, OuterRef, Q, QuerySet
from django.http import QueryDict

from agents.models import AgentRun, Model
from console.shared import positive_int
from tasks.models import Goal, Task
from tasks.selectors import tagged
from tasks.states import TaskStatus

TEXT_CHARS = 200
TAG_CHARS = 100


class TaskFilters(TypedDict):
    q: str
    tag: str
    goal: int | None
    model: int | None
    since: datetime.date | None
    until: datetime.date | None
    status: str


def _date(value: str) -> datetime.date | None:
    try:
        return datetime.date.fromisoformat(value.strip()) if value else None
    except ValueError:
        return None


def task_filters(params: QueryDict) -> TaskFilters:
    """The filters from a query string; what is not understood is dropped."""
    status = params.get("status", "")
    return {
        "q": params.get("q", "").strip()[:TEXT_CHARS],
        "tag": params.get("tag", "").strip()[:TAG_CHARS],
        "goal": positive_int(params.get("goal")),
        "model": positive_int(params.get("model")),
        "since": _date(params.get("since", "")),
        "until": _date(params.get("until", "")),
        "status": status if status in TaskStatus.values else "",
    }


def filter_problems(params: QueryDict) -> list[str]:
    """What a person gave in the query string that the filters did not understand (and so left
    out), in words for the page: a date that is not YYYY-MM-DD, a state that does not exist, a
    goal or a model that is not a number."""
    problems = []
    for name, label in (("since", "since"), ("until", "until")):
        value = params.get(name, "").strip()
        if value and _date(value) is None:
            problems.append(f'{label} "{value}" is not a date (YYYY-MM-DD): not applied')
    status = params.get("status", "")
    if status and status not in TaskStatus.values:
        states = ", ".join(TaskStatus.values)
        problems.append(f'status "{status}" is not a task state ({states}): not applied')
    for name in ("goal", "model"):
        value = params.get(name, "").strip()
        if value and positive_int(value) is None:
            problems.append(f'{name} "{value}" is not an id: not applied')
    return [p[:300] for p in problems]


def filter_tasks[Rows: QuerySet[Any]](tasks: Rows, filters: TaskFilters) -> Rows:
    """Tasks that match every filter given. Text is found in the title, the instruction or a
    run's answer; the dates bound the day the task last changed (`updated_at`)."""
    if filters["q"]:
        text = filters["q"]
        answered = AgentRun.objects.filter(task=OuterRef("pk"), answer__icontains=text)
        tasks = tasks.filter(
            Q(title__icontains=text) | Q(instruction__icontains=text) | Exists(answered)
        )
    if filters["tag"]:
        tasks = tagged(tasks, filters["tag"])
    if filters["goal"]:
        tasks = tasks.filter(goal_id=filters["goal"])
    if filters["model"]:
        tasks = tasks.filter(model_id=filters["model"])
    if filters["since"]:
        tasks = tasks.filter(updated_at__date__gte=filters["since"])
    if filters["until"]:
        tasks = tasks.filter(updated_at__date__lte=filters["until"])
    if filters["status"]:
        tasks = tasks.filter(status=filters["status"])
    return tasks


def filter_query(filters: TaskFilters, **extra: str) -> str:
    """The filters given, as a query string (without "?"), with `extra` parameters after them."""
    pairs = [(name, str(value)) for name, value in filters.items() if value]
    pairs += [(name, value) for name, value in extra.items() if value]
    return urlencode(pairs)


def filter_options(
    tasks: QuerySet[Task] | None = None,
) -> dict[str, QuerySet[Goal] | QuerySet[Model]]:
    """The goals and the models the form offers: those that some of `tasks` have, or every goal
    and model (a list over the whole table reads no task for its form)."""
    goals = Goal.objects.order_by("title")
    models = Model.objects.select_related("connection").order_by("connection__name", "name")
    if tasks is not None:
        goals = goals.filter(Exists(tasks.filter(goal=OuterRef("pk"))))
        models = models.filter(Exists(tasks.filter(model=OuterRef("pk"))))
    return {"goals": goals, "models": models}
