"""The console's task pages: the list, the new-task form, the live task page and its actions.

Views parse input and call tasks.services; every state change happens there. Each page makes a
fixed number of queries, whatever the number of tasks, turns, tool calls or events.
"""

import logging
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any, NotRequired, TypedDict, cast

from django.contrib import messages
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.http import FileResponse, Http404, HttpResponse, QueryDict
from django.http.response import HttpResponseBase
from django.shortcuts import get_object_or_404, redirect, render
from django.template.loader import render_to_string
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST
from django_htmx.http import HttpResponseClientRedirect

from agents.actions import task as person_task
from agents.actions import task_change
from agents.catalogue.connections import model_check_for_task
from agents.catalogue.tools import all_tools
from agents.engine.run.usage import Usage
from agents.engine.verdict.acceptance import check_text
from agents.models import AgentRun, Artifact, Model, ToolCall
from agents.selectors import (
    Rejection,
    TaskRead,
    last_rejection,
    task_cost_subquery,
    task_read,
)
from console.actions import (
    REGISTRY,
    ConsoleAction,
    decision_buttons,
    task_actions,
)
from console.filters import (
    TaskFilters,
    filter_options,
    filter_problems,
    filter_query,
    filter_tasks,
    task_filters,
)
from console.forms import TaskCreateForm, TaskEditForm, model_queryset
from console.http import AuthenticatedHttpRequest
from console.preview import artifact_previews
from console.shared import (
    OUTCOME_UNKNOWN,
    console_view,
    positive_int,
    pretty_json,
    show,
    show_approval,
)
from console.timeline import timeline_rows
from core.actors import Actor
from core.exceptions import ActhelmError, InvalidInput, NotPermitted
from memory.models import MemorySelection
from tasks import services
from tasks.limits import BY_FIELD, CUMULATIVE, PER_ITEM, limit_for_failure
from tasks.livestream import stream_response
from tasks.models import Task, TaskEvent
from tasks.notify.selectors import task_notifications
from tasks.permissions import ADD_TASK, OPERATE_TASK
from tasks.selectors import (
    attempts_text,
    max_attempts,
    status_counts,
    task_keyset_page,
)
from tasks.states import OPEN, Action, EventKind, TaskKind, TaskStatus, allowed_actions
from tasks.uploads import upload_refusal
from tasks.workspace import artifacts_dir, safe_file_name

if TYPE_CHECKING:
    from django_stubs_ext import WithAnnotations

log = logging.getLogger("acthelm.console")

# While a task is in one of these states something moves it without a person: the page polls.
POLLING = frozenset(
    {TaskStatus.READY, TaskStatus.IN_PROGRESS, TaskStatus.PAUSE_REQUESTED, TaskStatus.BLOCKED}
)
PAGE_SIZE = 50
EVENT_DATA_CHARS = 300
POLL_SECONDS = 2
FOLLOW_UPS_SHOWN = 50

# Artifact types that a browser could run as a page; they are served as plain text.
_ACTIVE_TYPES = ("html", "xml", "javascript", "ecmascript", "svg")


# --- The task list --------------------------------------------------------------------------


class _CostAnnotation(TypedDict):
    cost_total: Decimal | None  # `task_cost_subquery`: None when no turn has a known cost


@require_GET
@console_view()
def task_list(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Newest first, keyset-paginated on the primary key (no COUNT, no OFFSET), filtered as the
    review page is (`console.filters`), every filter in the URL."""
    filters = task_filters(request.GET)
    # Evaluation tasks (acthelm_eval) are listed only when asked for: ?evaluation=1.
    evaluation = request.GET.get("evaluation") == "1"
    listed = Task.objects.filter(is_evaluation=evaluation)
    tasks = (
        filter_tasks(listed, filters)
        .select_related("model", "connection")
        .only(
            "id",
            "title",
            "status",
            "priority",
            "failure_code",
            "updated_at",
            "created_at",
            "model__name",
            "connection__name",
        )
        .annotate(cost_total=task_cost_subquery())
    )
    before, after = positive_int(request.GET.get("before")), positive_int(request.GET.get("after"))
    page = task_keyset_page(tasks, before=before, after=after, size=PAGE_SIZE)
    for row in page.tasks:
        cost = cast("WithAnnotations[Task, _CostAnnotation]", row).cost_total
        show(row, cost_text=money(cost) if cost is not None else "")
    counts = status_counts(evaluation=evaluation)
    flag = "1" if evaluation else ""
    unfiltered_status = {**filters, "status": ""}
    context = {
        "tasks": page.tasks,
        "status": filters["status"],
        "filters": filters,
        "filtered": any(v for k, v in filters.items() if k != "status"),
        "filter_problems": filter_problems(request.GET),
        "evaluation": evaluation,
        "statuses": [(value, label, counts.get(value)) for value, label in TaskStatus.choices],
        # The state links keep the other filters; the pager keeps them all.
        "status_query": filter_query(cast(TaskFilters, unfiltered_status), evaluation=flag),
        "page_query": filter_query(filters, evaluation=flag),
        "older": page.older,
        "newer": page.newer,
        "can_add": request.user.has_perm(ADD_TASK),
        **filter_options(),
    }
    # The list refreshes itself: a poll, or the filter form, asks for its rows only.
    template = "console/task_list.html#rows" if request.htmx else "console/task_list.html"
    return render(request, template, context)


# --- Creating a task ------------------------------------------------------------------------


@require_http_methods(["GET", "POST"])
@console_view(ADD_TASK)
def task_create(request: AuthenticatedHttpRequest) -> HttpResponse:
    form = TaskCreateForm(request.POST or None, request.FILES or None)
    status = 200
    if request.method == "POST":
        status = 400
        if refused := upload_refusal(request):  # a file over a cap, dropped while it streamed
            form.is_valid()  # cleans the form first: add_error reads what it cleaned
            form.add_error("files", refused)
        if form.is_valid():
            try:
                task = person_task.task_create_by_name(
                    actor=Actor.person(request.user),
                    files=[(upload.name, upload) for upload in form.cleaned_data["files"]],
                    field_names={"tool_policies": "ask_tools"},  # the form's field
                    **form.service_kwargs(),
                )
            except ActhelmError as exc:
                field = exc.field if exc.field in form.fields else None
                form.add_error(field, f"{exc.message} [{exc.code}]")
            else:
                log.info(
                    "console.task_created",
                    extra={"task_id": task.pk, "actor": request.user.get_username()},
                )
                messages.success(request, f"Task #{task.pk} created ({task.status}).")
                return redirect("tasks:detail", pk=task.pk)
    tools = _tool_rows(form)
    return render(
        request, "console/task_new.html", {"form": form, "tool_rows": tools}, status=status
    )


def _tool_rows(form: TaskCreateForm | TaskEditForm) -> list[dict[str, object]]:
    if form.is_bound:
        data = cast(QueryDict, form.data)  # bound by `task_create` to request.POST
        chosen = set(data.getlist("tools"))
        ask = set(data.getlist("ask_tools"))
    elif isinstance(form, TaskEditForm):
        chosen, ask = set(form.initial["tools"]), set(form.initial["ask_tools"])
    else:
        chosen = set(form.fields["tools"].initial or [])
        ask = set()
    registry = all_tools()
    rows: list[dict[str, object]] = [
        {
            "name": name,
            "description": registry[name].description,
            "recovery": str(registry[name].recovery_class.value),
            "chosen": name in chosen,
            "ask": name in ask,
        }
        for name in sorted(registry)
    ]
    if isinstance(form, TaskEditForm):  # a task's tools from a tool server stay on its form
        rows += [
            {"name": name, "description": "", "recovery": "", "chosen": True, "ask": name in ask}
            for name in sorted(set(form.task.tools) - set(registry))
        ]
    return rows


# --- The task page --------------------------------------------------------------------------


def _plan_steps(plan: object) -> tuple[list[dict[str, Any]], str]:
    """A plan recorded by update_plan: {"steps": [{"step", "status"}], "note"}."""
    if isinstance(plan, dict) and isinstance(plan.get("steps"), list):
        steps = [s for s in plan["steps"] if isinstance(s, dict)]
        return steps, str(plan.get("note") or "")
    return [], ""


def _number(value: int | float | Decimal) -> str:
    return f"{value:,}" if isinstance(value, int) else f"{value:,.1f}"


def money(value: Decimal | int | float | None) -> str:
    """US dollars for people: at least two decimals, more for sub-cent amounts."""
    if value is None:
        return "—"
    value = Decimal(value)
    if value and abs(value) < Decimal("0.01"):
        return f"${value:,.4f}"
    return f"${value:,.2f}"


class LimitRow(TypedDict):
    """A row of the task page's limits: used vs granted (the per-item limits only granted)."""

    field: str
    label: str
    used: int | float | Decimal | None
    granted: int | Decimal | None
    text: str
    percent: NotRequired[int]


def _limit_rows(task: Task, usage: Usage, *, unknown_cost_turns: int = 0) -> list[LimitRow]:
    """Used vs granted for the limits counted across runs; the per-item limits as granted.
    Money is in US dollars; a spend over known costs only (`unknown_cost_turns` model turns had
    no price) is marked partial."""
    rows: list[LimitRow] = []
    for limit in CUMULATIVE:
        granted = getattr(task, limit.field)
        used = getattr(usage, limit.counter)
        show = money if limit.money else _number
        currency = " USD" if limit.money else ""
        if granted is None:  # no money budget: show what was spent
            text, percent = f"{show(used)}{currency} (no budget)", 0
        else:
            text = f"{show(used)} / {show(granted)}{currency}"
            percent = min(100, round(100 * used / granted)) if granted else 100
        if limit.money and unknown_cost_turns:
            turns = "turn" if unknown_cost_turns == 1 else "turns"
            text += f" — partial: {unknown_cost_turns} model {turns} of unknown cost"
        rows.append(
            {
                "field": limit.field,
                "label": limit.usage_label,
                "used": used,
                "granted": granted,
                "text": text,
                "percent": percent,
            }
        )
    for limit in PER_ITEM:
        granted = getattr(task, limit.field)
        rows.append(
            {
                "field": limit.field,
                "label": limit.label,
                "used": None,
                "granted": granted,
                "text": _number(granted),
            }
        )
    return rows


def _shown_runs(read: TaskRead) -> list[AgentRun]:
    """The task's runs, each with what the Runs table reads (`agents.selectors.RunFacts`)."""
    for facts in read.runs:
        run = facts.run
        # Recorded by the loop in every checkpoint; older runs did not record it.
        offered = run.checkpoint.get("tools_offered") if isinstance(run.checkpoint, dict) else None
        show(run, without_tools=offered == [], facts=facts)
    return [facts.run for facts in read.runs]


def _show_transcript(read: TaskRead, run_numbers: dict[int, int]) -> None:
    """The page's turns and their calls, with what the transcript shows of each."""
    for turn in read.turns:
        show(
            turn,
            run_number=run_numbers.get(turn.run_id),
            cost_text=money(turn.cost) if turn.cost is not None else "",
        )
        for call in turn.tool_calls.all():
            pretty = (
                pretty_json(call.arguments) if call.arguments is not None else call.arguments_raw
            )
            show(call, arguments_pretty=pretty, arguments_lines=pretty.count("\n") + 1)
    for approval in read.pending_approvals:
        show_approval(approval)
    for decision in read.pending_reviews:
        show(decision, call=decision.tool_call)


def _shown_rejection(read: TaskRead) -> tuple[Rejection | None, list[Any]]:
    """The supervisor rejected the newest run: shown to be overruled (accepted into review) or
    changed and retried; once accepted, the failed checks stay on the page."""
    if read.rejection is None or read.task.is_held:
        return None, []
    return read.rejection, artifact_previews(read.task.pk, read.artifacts)


def _page_actions(
    request: AuthenticatedHttpRequest, task: Task, rejection: Rejection | None
) -> list[dict[str, Any]]:
    """The task's actions the person may take; accept only over a rejected run, once, over no
    person's later decision."""
    acceptable = rejection is not None and rejection.acceptable
    return [
        {"entry": entry, "url": reverse(entry.url_name, args=[task.pk])} | entry.page_texts(task.pk)
        for entry in offered_actions(request.user, task.status)
        if entry.name != Action.ACCEPT or acceptable
    ]


def _retry_limit(task: Task, limits: list[LimitRow]) -> dict[str, object] | None:
    """The limit a retry of a task failed at it offers to raise, with what was used of it."""
    field = limit_for_failure(task.failure_code)
    if not field:
        return None
    row = next((r for r in limits if r["field"] == field), None)
    retry_limit: dict[str, object] = {
        "field": field,
        "label": BY_FIELD[field].label,
        "current": getattr(task, field),
        "used": row["used"] if row else None,
    }
    if BY_FIELD[field].money:  # an amount of money, not a count
        retry_limit |= {"min": "0.0001", "step": "0.0001"}
    return retry_limit


def task_page_context(request: AuthenticatedHttpRequest, pk: int) -> dict[str, Any]:
    """Everything the task page shows (`agents.selectors.task_read`), in a fixed number of
    queries. "?turns=all" is bounded too (TRANSCRIPT_ALL_MAX)."""
    all_turns = request.GET.get("turns") == "all"
    turns_before = positive_int(request.GET.get("turns_before"))
    events_before = positive_int(request.GET.get("events_before"))
    read = task_read(
        pk, all_turns=all_turns, turns_before=turns_before, events_before=events_before
    )
    if read is None:
        raise Http404("No task matches the given query.")
    task = read.task
    runs = _shown_runs(read)
    run_numbers = {run.pk: run.number for run in runs}
    _show_transcript(read, run_numbers)
    memory = list(
        MemorySelection.objects.filter(run__task_id=task.pk).order_by("run_id", "position")
    )
    for selection in memory:
        show(selection, run_number=run_numbers.get(selection.run_id))
    events = timeline_rows(read.events)
    plan_steps, plan_note = _plan_steps(read.plan)
    rejection, rejection_previews = _shown_rejection(read)
    actions = _page_actions(request, task, rejection)
    action_names = {action["entry"].name for action in actions}
    now = timezone.now()
    unknown_cost_turns = getattr(task, "unknown_cost_turns", 0) or 0  # the read annotates it
    limits = _limit_rows(task, read.usage, unknown_cost_turns=unknown_cost_turns)
    verdict = read.verdict_run
    context: dict[str, Any] = {
        "now": now,  # a cooling connection the task waits for
        "why": state_why(task, events, now),
        "can_retry_now": request.user.has_perm(OPERATE_TASK),
        "task": task,
        "polling": task.status in POLLING,
        "poll_seconds": POLL_SECONDS,
        "actions": actions,
        "can_decide": request.user.has_perm(REGISTRY[Action.APPROVE].perm),
        "decision_buttons": decision_buttons(),
        "runs": runs,
        "turns": read.turns,
        "earlier_turns": read.older_turns is not None,
        "older_turns": read.older_turns,
        "turns_paged": all_turns or turns_before is not None,
        "pending_approvals": read.pending_approvals,
        "pending_reviews": read.pending_reviews,
        "memory": memory,
        "artifacts": read.artifacts,
        "input_files": read.input_files,
        "events": events,
        "more_events": read.older_events is not None,
        "older_events": read.older_events,
        "notifications": task_notifications(task.pk),
        "limits": limits,
        "usage": read.usage,
        "plan": read.plan,
        "plan_steps": plan_steps,
        "plan_note": plan_note,
        "plan_raw": pretty_json(read.plan) if read.plan is not None and not plan_steps else "",
        "answer_run": read.answer_run,
        "verdict_run": verdict.run if verdict else None,
        "acceptance_checks": [check_text(c) for c in task.acceptance_checks or []],
        "outcome_unknown": OUTCOME_UNKNOWN,
        "rejection": rejection,
        "rejection_previews": rejection_previews,
        "can_accept": Action.ACCEPT in action_names,
        # task_update refuses a task a worker holds and a done or cancelled one.
        "can_edit": request.user.has_perm(OPERATE_TASK)
        and not task.is_held
        and task.status in OPEN,
    }
    if action_names & {Action.RESUME, Action.RETRY}:
        context["models"] = list(model_queryset())
    retry_limit = _retry_limit(task, limits) if Action.RETRY in action_names else None
    if retry_limit:
        context["retry_limit"] = retry_limit
    return context


def state_why(task: Task, events: list[TaskEvent], now: datetime) -> dict[str, object]:
    """What the state card says besides the state: the unfinished dependencies of a blocked
    task, a scheduled retry's reason, the parent and the follow-ups (a few small queries)."""
    why: dict[str, object] = {"blockers": [], "retry": None, "attempts": ""}
    if task.status == TaskStatus.BLOCKED:
        why["blockers"] = list(
            Task.objects.filter(dependant_links__task=task)
            .exclude(status=TaskStatus.DONE)
            .only("id", "title", "status")
            .order_by("id")
        )
    if task.failed_attempts:
        why["attempts"] = attempts_text(task.failed_attempts)
    if task.status == TaskStatus.READY and task.not_before and task.not_before > now:
        scheduled = next((e for e in reversed(events) if e.kind == EventKind.RETRY_SCHEDULED), None)
        data = scheduled.data if scheduled else {}
        why["retry"] = {
            "until": task.not_before,
            "data": data,
            # The attempt that runs next, of how many (the event's count, else the setting's).
            "attempt": task.failed_attempts + 1,
            "of": data.get("of") or max_attempts(),
        }
    why["parent"] = (
        Task.objects.only("id", "title", "status").filter(pk=task.spawned_by_id).first()
        if task.spawned_by_id
        else None
    )
    # Follow-ups come from propose_task (planning tasks): no query for the others.
    may_spawn = task.kind == TaskKind.PLANNING or "propose_task" in task.tools
    why["follow_ups"] = (
        list(task.follow_ups.only("id", "title", "status").order_by("id")[:FOLLOW_UPS_SHOWN])
        if may_spawn
        else []
    )
    return why


def render_task_page(
    request: AuthenticatedHttpRequest,
    pk: int,
    *,
    error: ActhelmError | None = None,
    status: int = 200,
) -> HttpResponse:
    """The whole page, or only its live part for htmx (polls and htmx actions)."""
    context = task_page_context(request, pk)
    context["error"] = error
    template = "console/task.html#live" if request.htmx else "console/task.html"
    return render(request, template, context, status=status)


@require_GET
@console_view()
def task_detail(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    return render_task_page(request, pk)


@require_GET
@console_view()
def task_live(request: AuthenticatedHttpRequest, pk: int) -> HttpResponseBase:
    """The task page's live panel (an EventSource, the session's person): what the running turn
    writes, as `GET /api/tasks/{id}/events` sends it (`tasks.livestream`), from the newest stored
    event on — the page shows the stored ones."""
    if not Task.objects.filter(pk=pk).exists():
        raise Http404("no such task")
    return stream_response(pk, request, from_now=True)


@require_GET
@console_view()
def task_call_result(request: AuthenticatedHttpRequest, pk: int, call_pk: int) -> HttpResponse:
    """A tool call's full result: escaped HTML for htmx, plain text otherwise."""
    # The result column only: django-stubs' get_object_or_404 takes querysets of model
    # instances only, Django's any queryset (it calls .get()).
    result = get_object_or_404(
        ToolCall.objects.filter(task_id=pk).values_list("result", flat=True),  # type: ignore[type-var]
        pk=call_pk,
    )
    if request.htmx:
        return HttpResponse(render_to_string("console/_full_result.html", {"result": result}))
    return HttpResponse(result, content_type="text/plain; charset=utf-8")


@require_GET
@console_view()
def task_artifact(request: AuthenticatedHttpRequest, pk: int, artifact_pk: int) -> FileResponse:
    """Download an artifact from the task's artifacts folder: always an attachment."""

    artifact = get_object_or_404(Artifact, pk=artifact_pk, task_id=pk)
    try:
        name = safe_file_name(artifact.name)
    except InvalidInput:
        raise Http404("no such artifact") from None
    folder = artifacts_dir(pk, create=False).resolve()
    path = folder / name
    if path.is_symlink() or not path.is_file() or path.resolve().parent != folder:
        raise Http404("the artifact's file is missing")
    content_type = (artifact.content_type or "text/plain").split(";")[0].strip().lower()
    if not content_type or any(word in content_type for word in _ACTIVE_TYPES):
        content_type = "text/plain"
    if content_type.startswith("text/"):
        content_type += "; charset=utf-8"
    response = FileResponse(
        path.open("rb"), as_attachment=True, filename=name, content_type=content_type
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"
    return response


# --- Actions ---------------------------------------------------------------------------------


def offered_actions(user: User, status: str) -> list[ConsoleAction]:
    """The task-wide actions this person may take in this state, in the order of their buttons."""
    allowed = allowed_actions(status)
    return [e for e in task_actions() if e.name in allowed and user.has_perm(e.perm)]


def _chosen_model(request: AuthenticatedHttpRequest) -> Model | None:
    model_id = request.POST.get("model") or request.GET.get("model") or ""
    if not model_id:
        return None
    model = model_queryset().filter(pk=positive_int(model_id) or 0).first()
    if model is None:
        raise InvalidInput(f"model {model_id!r} does not exist")
    return model


def _raised_limit(request: AuthenticatedHttpRequest, task_id: int) -> int | Decimal | None:
    """The new value of the limit a failed task stopped at, as typed in the retry form (an
    amount of money for the money budget, a whole number for the others)."""
    raw = request.POST.get("limit_value", "").strip()
    if not raw:
        return None
    code = Task.objects.filter(pk=task_id).values_list("failure_code", flat=True).first()
    field = limit_for_failure(code or "")
    if field and BY_FIELD[field].money:
        return services.money_limit(field, raw)
    value = positive_int(raw)
    if value is None:
        label = BY_FIELD[field].label if field else "the limit"
        raise InvalidInput(f"{label} must be a positive number")
    return value


def _inputs(
    request: AuthenticatedHttpRequest, entry: ConsoleAction, task_id: int
) -> dict[str, Model | int | Decimal | str | None]:
    """The action's inputs from the posted form, by their declared kind."""
    inputs: dict[str, Model | int | Decimal | str | None] = {}
    for item in entry.inputs:
        if item.kind == "model":
            inputs[item.name] = _chosen_model(request)
        elif item.kind == "raised_limit":
            inputs[item.name] = _raised_limit(request, task_id)
        elif item.name in request.POST or item.required:
            inputs[item.name] = request.POST.get(item.name, "").strip()
    return inputs


def _confirm_model(
    request: AuthenticatedHttpRequest,
    task: Task,
    model: Model,
    entry: ConsoleAction,
    extra: Mapping[str, object],
) -> HttpResponse:
    check = model_check_for_task(task=task, model=model)
    context = {
        "task": task,
        "model": model,
        "check": check,
        "action": entry,
        "url": reverse(entry.url_name, args=[task.pk]),
        "extra": extra,
    }
    return render(request, "console/task_confirm_model.html", context)


@require_POST
@console_view()
def task_action(request: AuthenticatedHttpRequest, pk: int, action: str) -> HttpResponse:
    """Every task-wide action (console.actions): check the permission, read its
    inputs, show a new model's checks before queueing on it, call its service."""
    entry = REGISTRY[action]
    if not request.user.has_perm(entry.perm):
        raise PermissionDenied
    try:
        inputs = _inputs(request, entry, pk)
    except InvalidInput as exc:
        return render_task_page(request, pk, error=exc, status=400)
    model = cast(Model | None, inputs.get("model"))  # `_chosen_model`'s, by its kind
    # A model change is queued only after the person has seen its checks.
    if model is not None and request.POST.get("checked") != str(model.pk):
        task = get_object_or_404(Task, pk=pk)
        extra = {k: v for k, v in request.POST.items() if k not in ("model", "csrfmiddlewaretoken")}
        return _confirm_model(request, task, model, entry, extra)
    try:
        task = entry.call(actor=Actor.person(request.user), target_id=pk, **inputs)
    except NotPermitted:
        raise PermissionDenied from None
    except ActhelmError as exc:
        log.info(
            "console.action_refused",
            extra={"task_id": pk, "action": str(action), "code": exc.code},
        )
        return render_task_page(request, pk, error=exc, status=exc.http_status)
    log.info(
        "console.action",
        extra={"task_id": pk, "action": str(action), "actor": request.user.get_username()},
    )
    success = entry.success.format(pk=pk)
    if model is not None:
        success = success.removesuffix(".") + f" on {model}."
    messages.success(request, success)
    if task is None:  # the service deleted the task: its page is gone
        if request.htmx:
            return HttpResponseClientRedirect("/")
        return redirect("tasks:list")
    if request.htmx:
        return render_task_page(request, pk)
    return redirect("tasks:detail", pk=pk)


@require_POST
@console_view(OPERATE_TASK)
def task_retry_now(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    """Drop a ready task's retry back-off (agents.actions.task.task_retry_now)."""
    try:
        person_task.task_retry_now(actor=Actor.person(request.user), task_id=pk)
    except ActhelmError as exc:
        return render_task_page(request, pk, error=exc, status=exc.http_status)
    messages.success(request, f"Task #{pk} may run now: its retry wait was dropped.")
    if request.htmx:
        return render_task_page(request, pk)
    return redirect("tasks:detail", pk=pk)


@require_GET
@console_view(OPERATE_TASK)
def task_model_check(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    """The checks of a model for this task, shown before a resume or retry queues it."""
    task = get_object_or_404(Task, pk=pk)
    try:
        model = _chosen_model(request)
    except InvalidInput:
        model = None
    check = model_check_for_task(task=task, model=model) if model is not None else None
    return render(
        request, "console/_model_check.html", {"task": task, "model": model, "check": check}
    )


@require_http_methods(["GET", "POST"])
@console_view(OPERATE_TASK)
def task_edit(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    """Change a task that is not running, then save, or save and retry now
    (`agents.actions.task_change.task_change_and_retry`)."""
    task = get_object_or_404(Task, pk=pk)
    form = TaskEditForm(request.POST or None, task=task)
    status = 200
    if request.method == "POST":
        status = 400
        if form.is_valid():
            retry = request.POST.get("retry") == "1"
            try:
                task_change.task_change_and_retry(
                    actor=Actor.person(request.user),
                    task_id=pk,
                    changes=form.changes(),
                    retry=retry,
                    start_over=retry and form.start_over(),
                )
            except NotPermitted:
                raise PermissionDenied from None
            except ActhelmError as exc:
                field = exc.field if exc.field in form.fields else None
                form.add_error(field, f"{exc.message} [{exc.code}]")
                status = exc.http_status
            else:
                log.info(
                    "console.task_edited",
                    extra={"task_id": pk, "retry": retry, "actor": request.user.get_username()},
                )
                done = "changed" + (
                    ""
                    if not retry
                    else " and queued to start over now"
                    if form.start_over()
                    else " and queued to run now; the model is told what changed"
                )
                messages.success(request, f"Task #{pk} {done}.")
                return redirect("tasks:detail", pk=pk)
    context = {
        "task": task,
        "form": form,
        "tool_rows": _tool_rows(form),
        "can_retry": task.status == TaskStatus.FAILED
        or (task.status == TaskStatus.READY and task.not_before is not None),
        # The rejection this change answers, when the supervisor rejected the newest run.
        "rejection": last_rejection(task),
    }
    return render(request, "console/task_edit.html", context, status=status)
