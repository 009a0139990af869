"""The JSON API at /api/: what the console and `acthelm_task` do, over the same services.

Every request carries `Authorization: Bearer <token>` (acthelm_site.api.tokens) and acts as the
token's person with that person's permissions, checked per action exactly as the console checks
them. Errors are `{"code", "message", "field"}` with the services' stable codes: 401 for a
missing, unknown or revoked token, 403 without the permission, 404 for an unknown object, 400 for
bad input (naming the field), 409 when the task's state does not allow the action or a decision's
hash is stale. The OpenAPI schema and its interactive docs are served to signed-in staff only.
"""

import logging
from collections.abc import Collection, Iterable
from datetime import datetime
from typing import Any, Literal, TypedDict, overload

from django.contrib.admin.views.decorators import staff_member_required
from django.core.exceptions import RequestDataTooBig
from django.http import FileResponse, Http404, HttpRequest, HttpResponse
from django.utils import timezone
from ninja import File, Form, NinjaAPI, P, Query, QueryEx, Status
from ninja.errors import AuthenticationError, HttpError, ValidationError
from ninja.files import UploadedFile
from ninja.security import HttpBearer
from pydantic import BaseModel, Field

from acthelm_site.api import schemas as s
from acthelm_site.api.events import router as events_router
from acthelm_site.api.models import ApiToken
from acthelm_site.api.schedules import router as schedules_router
from acthelm_site.api.selectors import (
    ConnectionDict,
    PendingOperations,
    pending_operations,
    task_detail,
)
from acthelm_site.api.tokens import TokenRefused, token_authenticate
from agents.actions import goal as goal_actions
from agents.actions import task as person_task
from agents.actions import task_change
from agents.catalogue import connections as agent_connections
from agents.catalogue.connections import ModelTestResult, model_check_for_task
from agents.models import Connection, Model, ToolCall
from agents.permissions import MANAGE_CONNECTIONS, VIEW_AGENTRUN, VIEW_CONNECTIONS_PERMS
from agents.scorecard import model_scorecard, scorecard_window
from agents.selectors import task_file
from approvals.models import Approval, ReviewDecision
from approvals.permissions import INBOX_PERMS
from approvals.selectors import decided_as_dict
from console.actions import ACTION_PERMS, REGISTRY
from console.views.connections import display_url
from core.actors import Actor
from core.exceptions import (
    ActhelmError,
    ErrorCode,
    GoalNotFound,
    InvalidInput,
    NotFound,
    NotPermitted,
    TaskNotFound,
)
from tasks.limits import BY_FIELD, LIMIT_FIELDS
from tasks.models import Goal, Task
from tasks.permissions import ADD_GOAL, ADD_TASK, CHANGE_GOAL, OPERATE_TASK, VIEW_GOAL, VIEW_TASK
from tasks.selectors import (
    SUMMARY_FIELDS,
    goal_as_dict,
    tagged,
    task_as_dict,
    task_keyset_page,
)
from tasks.states import Action
from tasks.uploads import upload_refusal

log = logging.getLogger("acthelm.api")

A = Action
# Each action's permission is the console's (console.actions.ACTION_PERMS).
PAGE_SIZE = 50
MAX_PAGE_SIZE = 200
GOAL_TASKS = 100


class ApiRequest(HttpRequest):
    """A request the bearer token let in (BearerToken): `auth` is the token, `user` its person."""

    auth: ApiToken


class BearerToken(HttpBearer):
    """`Authorization: Bearer acthelm_…`; every refusal is a 401 with a code saying why."""

    def __call__(self, request: HttpRequest) -> ApiToken:
        header = request.headers.get("Authorization", "")
        if not header:
            raise TokenRefused("send Authorization: Bearer <token>", code=ErrorCode.TOKEN_MISSING)
        scheme, _, raw = header.partition(" ")
        if scheme.lower() != "bearer" or not raw.strip():
            raise TokenRefused("the Authorization header must be: Bearer <token>")
        return self.authenticate(request, raw.strip())

    def authenticate(self, request: HttpRequest, token: str) -> ApiToken:
        api_token = token_authenticate(token)
        request.user = api_token.user
        return api_token


api = NinjaAPI(
    title="Acthelm API",
    version="1",
    description=__doc__,
    auth=BearerToken(),
    urls_namespace="api",
    docs_decorator=staff_member_required,
)
api.add_router("/schedules", schedules_router)
api.add_router("/tasks", events_router)


# --- Errors ---------------------------------------------------------------------------------


def _error(
    request: HttpRequest,
    code: ErrorCode,
    message: str,
    field: str | None = None,
    *,
    shown: str | None = None,
    status: int | None = None,
) -> HttpResponse:
    """The API's error answer, `{"code", "message", "field"}`, with the status the registry gives
    `code` (`ErrorCode`): the one place a status is chosen. `shown` is a code of another registry
    an error passes on (`ActhelmError.passing`); `status` only keeps a status ninja chose."""
    status = code.http_status if status is None else status
    response = api.create_response(
        request, {"code": shown or code, "message": message, "field": field}, status=status
    )
    if status == 401:
        response["WWW-Authenticate"] = 'Bearer realm="acthelm"'
    return response


@api.exception_handler(ActhelmError)
def _acthelm_error(request: HttpRequest, exc: ActhelmError) -> HttpResponse:
    if exc.http_status != 401:  # a refused token is not logged as a refusal
        log.info(
            "api.refused",
            extra={"path": request.path, "code": exc.code, "status": exc.http_status},
        )
    return _error(request, exc.error, exc.message, exc.field, shown=exc.code)


@api.exception_handler(ValidationError)
def _validation_error(request: HttpRequest, exc: ValidationError) -> HttpResponse:
    errors = exc.errors or [{}]
    # A field the endpoint does not know is named first: a script's typo must not be dropped.
    first = next((e for e in errors if e.get("type") == "extra_forbidden"), errors[0])
    loc = [str(part) for part in first.get("loc", ())]
    # ("body", "payload", "limits", "limit_turns") -> "limits.limit_turns"
    parts = [p for p in loc[1:] if p not in ("payload", "filters")]
    field = ".".join(parts) or None
    if first.get("type") == "extra_forbidden":
        return _error(
            request, ErrorCode.UNKNOWN_FIELD, f"{field}: this endpoint has no such field", field
        )
    message = first.get("msg", "invalid input").removeprefix("Value error, ")
    if loc[:1] == ["form"] and request.content_type == "application/json":
        message = (
            "this endpoint takes form fields (multipart/form-data, or "
            "application/x-www-form-urlencoded), not JSON; " + message
        )
    text = f"{field}: {message}" if field else message
    return _error(request, ErrorCode.INVALID_INPUT, text, field)


@api.exception_handler(AuthenticationError)
def _unauthenticated(request: HttpRequest, exc: AuthenticationError) -> HttpResponse:
    return _error(request, ErrorCode.TOKEN_MISSING, "send Authorization: Bearer <token>")


@api.exception_handler(Http404)
def _not_found(request: HttpRequest, exc: Http404) -> HttpResponse:
    return _error(request, ErrorCode.NOT_FOUND, str(exc) or "not found")


@api.exception_handler(RequestDataTooBig)
def _too_big(request: HttpRequest, exc: RequestDataTooBig) -> HttpResponse:
    return _error(request, ErrorCode.BODY_TOO_LARGE, f"the request body is too large: {exc}")


@api.exception_handler(Exception)
def _server_error(request: HttpRequest, exc: Exception) -> HttpResponse:
    """Whatever the API did not raise itself: logged with its traceback, answered as JSON."""
    log.exception("api.server_error", extra={"path": request.path})
    return _error(
        request, ErrorCode.SERVER_ERROR, "the server failed on this request; it is logged"
    )


# Ninja's own refusals by their status (400 "Cannot parse request body" for a body that is not
# JSON); any other keeps ninja's status with the generic code.
NINJA_CODES = {400: ErrorCode.INVALID_INPUT, 429: ErrorCode.THROTTLED}


@api.exception_handler(HttpError)
def _http_error(request: HttpRequest, exc: HttpError) -> HttpResponse:
    code = NINJA_CODES.get(exc.status_code, ErrorCode.ERROR)
    return _error(request, code, str(exc), status=exc.status_code)


ERRORS = {
    400: s.ErrorOut,
    401: s.ErrorOut,
    403: s.ErrorOut,
    404: s.ErrorOut,
    409: s.ErrorOut,
    422: s.ErrorOut,
}


def _require(request: ApiRequest, *perms: str) -> Actor:
    """The person acting, refused (403) unless they hold one of `perms`."""
    user = request.auth.user
    if perms and not any(user.has_perm(perm) for perm in perms):
        raise NotPermitted(f"{user.get_username()} lacks the permission {' or '.join(perms)}")
    return Actor.person(user, api_token=(request.auth.pk, request.auth.prefix))


def _refuse_unknown_fields(
    data: Iterable[str], schema: type[BaseModel], also: Collection[str] = frozenset()
) -> None:
    """Form fields are read by name, so ninja drops a name the schema lacks (`-F model=demo`
    vanished): an unknown field is refused instead, 422 unknown_field naming it."""
    unknown = sorted(set(data) - set(schema.model_fields) - set(also))
    if unknown:
        raise ValidationError(
            [{"type": "extra_forbidden", "loc": ("form", unknown[0]), "msg": "unknown field"}]
        )


def _task_or_404(task_id: int) -> Task:
    task = Task.objects.select_related("connection", "model").filter(pk=task_id).first()
    if task is None:
        raise TaskNotFound(f"task {task_id} does not exist")
    return task


@overload
def _model(model_id: int, field: str = ...) -> Model: ...
@overload
def _model(model_id: int | None, field: str = ...) -> Model | None: ...
def _model(model_id: int | None, field: str = "model_id") -> Model | None:
    """The model of that id (400 on `field` when there is none), or None when none is given."""
    if model_id is None:
        return None
    try:
        return person_task.model_named(model_id, None)
    except InvalidInput as exc:
        raise InvalidInput(exc.message, field=field) from None


def _named(payload: s.TaskCreateIn, name: str) -> int | str | None:
    """A new task's connection or model as given: by id (`<name>_id`) or by name; not both."""
    by_id: int | None = getattr(payload, f"{name}_id")
    by_name: str | None = getattr(payload, name)
    if by_id is not None and by_name:
        raise InvalidInput(f"give {name} or {name}_id, not both", field=name)
    return by_id if by_id is not None else by_name or None


def _done(request: ApiRequest, task_id: int, action: str) -> dict[str, Any]:
    log.info(
        "api.action",
        extra={"task_id": task_id, "action": str(action), "actor": request.user.get_username()},
    )
    return task_as_dict(_task_or_404(task_id))


# --- Tasks ----------------------------------------------------------------------------------


class TaskListPage(TypedDict):
    items: list[dict[str, Any]]
    older: int | None
    newer: int | None


class TaskFilters(s.TextIn):
    status: s.StatusName | None = None
    goal_id: int | None = None
    kind: s.KindName | None = None
    tag: str | None = None
    evaluation: bool = Field(
        False, description="List the evaluation suite's tasks (acthelm_eval) instead of work tasks"
    )
    before: int | None = Field(None, ge=1, description="Tasks older than this id")
    after: int | None = Field(None, ge=1, description="Tasks newer than this id")
    limit: int = Field(PAGE_SIZE, ge=1, le=MAX_PAGE_SIZE)


@api.get("/tasks", response={200: s.TaskPageOut, **ERRORS}, tags=["tasks"])
def list_tasks(request: ApiRequest, filters: Query[TaskFilters]) -> TaskListPage:
    """Newest first, keyset-paginated on the id like the console's list (no COUNT, no OFFSET)."""
    _require(request, VIEW_TASK)
    tasks = Task.objects.select_related("connection", "model").filter(
        is_evaluation=filters.evaluation
    )
    if filters.status:
        tasks = tasks.filter(status=filters.status)
    if filters.goal_id:
        tasks = tasks.filter(goal_id=filters.goal_id)
    if filters.kind:
        tasks = tasks.filter(kind=filters.kind)
    if filters.tag:
        tasks = tagged(tasks, filters.tag)
    page = task_keyset_page(tasks, before=filters.before, after=filters.after, size=filters.limit)
    return {
        "items": [task_as_dict(t, SUMMARY_FIELDS) for t in page.tasks],
        "older": page.older,
        "newer": page.newer,
    }


@api.post("/tasks", response={201: s.TaskOut, **ERRORS}, tags=["tasks"])
def create_task(
    request: ApiRequest,
    payload: Form[s.TaskCreateIn],
    # None when no file is sent; `| None` in the annotation would add null to the OpenAPI schema.
    files: File[list[UploadedFile]] = None,  # type: ignore[assignment]
) -> Status[dict[str, Any]]:
    """Create a task from form fields (multipart/form-data, with `files` as input files, or
    application/x-www-form-urlencoded). Repeat a field for a list: `-F tools=read_file -F
    tools=list_files`."""
    actor = _require(request, ADD_TASK)
    _refuse_unknown_fields(request.POST, s.TaskCreateIn, also={"files"})
    if refused := upload_refusal(request):  # a file over a cap, dropped while it streamed
        raise InvalidInput(refused, field="files")
    limits = {
        field: getattr(payload, field)
        for field in LIMIT_FIELDS
        if getattr(payload, field) is not None
        # An empty money field, sent, is "no budget" (as the field says), not the default.
        or (BY_FIELD[field].money and field in payload.model_fields_set)
    }
    connection, model = _named(payload, "connection"), _named(payload, "model")
    task = person_task.task_create_by_name(
        actor=actor,
        files=[(upload.name or "", upload) for upload in files or []],
        title=payload.title,
        instruction=payload.instruction,
        goal=payload.goal_id,
        kind=payload.kind,
        priority=payload.priority,
        tools=None if payload.tools is None else [t for t in payload.tools if t.strip()],
        tool_policies={tool: "ask" for tool in payload.ask_tools if tool.strip()},
        allowed_domains=payload.allowed_domains,
        connection=connection,
        model=model,
        depends_on=payload.depends_on,
        tags=[t.strip() for t in payload.tags if t.strip()],
        limits=limits,
        acceptance_checks=[c for c in payload.expect if c.strip()],
        # The refusals name this endpoint's fields.
        field_names={
            "goal": "goal_id",
            "tool_policies": "ask_tools",
            "connection": "connection_id" if payload.connection_id is not None else "connection",
            "model": "model_id" if payload.model_id is not None else "model",
        },
    )
    log.info("api.task_created", extra={"task_id": task.pk, "actor": actor.label})
    return Status(201, task_as_dict(_task_or_404(task.pk)))


@api.get("/tasks/{task_id}", response={200: s.TaskDetailOut, **ERRORS}, tags=["tasks"])
def show_task(
    request: ApiRequest,
    task_id: int,
    turns: Literal["recent", "all"] = "recent",
    turns_before: QueryEx[int | None, P(ge=1, description="Turns older than this index")] = None,
    events_before: QueryEx[int | None, P(ge=1, description="Events older than this id")] = None,
) -> dict[str, Any]:
    """The task with its transcript (the newest 100 turns; `?turns=all` for up to 500), runs,
    pending operations with their hashes, plan, usage, files and timeline (the newest 200
    events). Older turns and events page back: pass `older_turns` as `turns_before`,
    `older_events` as `events_before`."""
    _require(request, VIEW_TASK)
    data = task_detail(
        task_id,
        all_turns=turns == "all",
        turns_before=turns_before,
        events_before=events_before,
    )
    if data is None:
        raise TaskNotFound(f"task {task_id} does not exist")
    return data


@api.get("/tasks/{task_id}/calls/{call_id}/result", response={200: str, **ERRORS}, tags=["tasks"])
def tool_call_result(request: ApiRequest, task_id: int, call_id: int) -> str:
    """A tool call's whole result."""
    _require(request, VIEW_TASK)
    result = ToolCall.objects.filter(task_id=task_id, pk=call_id).values_list("result", flat=True)
    for text in result:
        return text
    raise NotFound(f"task {task_id} has no tool call {call_id}")


def _file_response(task_id: int, name: str, kind: str) -> FileResponse:
    found = task_file(task_id, name, kind=kind)
    if found is None:
        _task_or_404(task_id)
        what = "artifact" if kind == "artifact" else "input file"
        raise NotFound(f"task {task_id} has no {what} {name!r}")
    response = FileResponse(
        found.path.open("rb"),
        as_attachment=True,
        filename=found.name,
        content_type=found.content_type,
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"
    return response


@api.get("/tasks/{task_id}/artifacts/{name}", response={200: None, **ERRORS}, tags=["tasks"])
def download_artifact(request: ApiRequest, task_id: int, name: str) -> FileResponse:
    """An artifact's file, as an attachment (the names are in GET /tasks/{id} `artifacts`)."""
    _require(request, VIEW_TASK)
    return _file_response(task_id, name, "artifact")


@api.get("/tasks/{task_id}/files/{name}", response={200: None, **ERRORS}, tags=["tasks"])
def download_input_file(request: ApiRequest, task_id: int, name: str) -> FileResponse:
    """An input file of the task's workspace, as an attachment (GET /tasks/{id} `input_files`)."""
    _require(request, VIEW_TASK)
    return _file_response(task_id, name, "input")


@api.post("/tasks/{task_id}/pause", response={200: s.TaskOut, **ERRORS}, tags=["actions"])
def pause_task(request: ApiRequest, task_id: int) -> dict[str, Any]:
    """A ready task pauses at once; a running one stops at its next safe point."""
    actor = _require(request, ACTION_PERMS[A.PAUSE])
    person_task.task_pause(actor=actor, task_id=task_id)
    return _done(request, task_id, A.PAUSE)


@api.post("/tasks/{task_id}/withdraw-pause", response={200: s.TaskOut, **ERRORS}, tags=["actions"])
def withdraw_pause(request: ApiRequest, task_id: int) -> dict[str, Any]:
    actor = _require(request, ACTION_PERMS[A.WITHDRAW_PAUSE])
    person_task.task_withdraw_pause(actor=actor, task_id=task_id)
    return _done(request, task_id, A.WITHDRAW_PAUSE)


@api.post("/tasks/{task_id}/resume", response={200: s.TaskOut, **ERRORS}, tags=["actions"])
def resume_task(
    request: ApiRequest, task_id: int, payload: s.ResumeIn | None = None
) -> dict[str, Any]:
    """Queue a paused task again, optionally on another model (checked first: 409
    model_check_failed when it would not fit; see GET /tasks/{id}/model-check)."""
    actor = _require(request, ACTION_PERMS[A.RESUME])
    model = _model(payload.model_id if payload else None)
    person_task.task_resume(actor=actor, task_id=task_id, model=model)
    return _done(request, task_id, A.RESUME)


@api.get("/tasks/{task_id}/model-check", response={200: s.ModelCheckOut, **ERRORS}, tags=["tasks"])
def model_check(request: ApiRequest, task_id: int, model_id: int) -> dict[str, Any]:
    """The checks a resume or retry on this model makes, without queueing anything."""

    _require(request, OPERATE_TASK)
    task = _task_or_404(task_id)
    return model_check_for_task(task=task, model=_model(model_id)).as_dict()


@api.post("/tasks/{task_id}/cancel", response={200: s.TaskOut, **ERRORS}, tags=["actions"])
def cancel_task(
    request: ApiRequest, task_id: int, payload: s.CancelIn | None = None
) -> dict[str, Any]:
    actor = _require(request, ACTION_PERMS[A.CANCEL])
    reason = (payload.reason if payload else "").strip()
    person_task.task_cancel(actor=actor, task_id=task_id, reason=reason)
    return _done(request, task_id, A.CANCEL)


@api.post("/tasks/{task_id}/close", response={200: s.TaskOut, **ERRORS}, tags=["actions"])
def close_task(request: ApiRequest, task_id: int) -> dict[str, Any]:
    """Close a task in review: done."""
    actor = _require(request, ACTION_PERMS[A.CLOSE])
    person_task.task_close(actor=actor, task_id=task_id)
    return _done(request, task_id, A.CLOSE)


@api.post("/tasks/{task_id}/reopen", response={200: s.TaskOut, **ERRORS}, tags=["actions"])
def reopen_task(request: ApiRequest, task_id: int, payload: s.ReopenIn) -> dict[str, Any]:
    """Send a task in review back to the queue with feedback for the next attempt."""
    actor = _require(request, ACTION_PERMS[A.REOPEN])
    person_task.task_reopen(actor=actor, task_id=task_id, feedback=payload.feedback)
    return _done(request, task_id, A.REOPEN)


@api.post("/tasks/{task_id}/retry", response={200: s.TaskOut, **ERRORS}, tags=["actions"])
def retry_task(
    request: ApiRequest, task_id: int, payload: s.RetryIn | None = None
) -> dict[str, Any]:
    """Queue a failed task again from its checkpoint. After a limit (limit_steps, …) raise it in
    the same call: `{"limits": {"limit_turns": 40}}`; otherwise 409 limit_not_raised."""
    actor = _require(request, ACTION_PERMS[A.RETRY])
    payload = payload or s.RetryIn()
    model = _model(payload.model_id)
    person_task.task_retry(actor=actor, task_id=task_id, model=model, limits=payload.limits)
    return _done(request, task_id, A.RETRY)


@api.post("/tasks/{task_id}/accept", response={200: s.TaskOut, **ERRORS}, tags=["actions"])
def accept_task(request: ApiRequest, task_id: int, payload: s.AcceptIn) -> dict[str, Any]:
    """Accept the run the supervisor rejected into review, with a reason: the task (failed, or
    ready for its retry) moves to review with that run's answer and artifacts; the retry is
    cancelled; no model is asked. 409 when the newest run was not rejected."""
    actor = _require(request, ACTION_PERMS[A.ACCEPT])
    person_task.task_accept(actor=actor, task_id=task_id, reason=payload.reason)
    return _done(request, task_id, A.ACCEPT)


@api.patch("/tasks/{task_id}", response={200: s.TaskOut, **ERRORS}, tags=["actions"])
def edit_task(request: ApiRequest, task_id: int, payload: s.TaskEditIn) -> dict[str, Any]:
    """Change a task that is not running (409 while a worker holds it): its instruction,
    acceptance checks, tools, policies and limits; the `edited` event records each before and
    after. With `retry`, it then runs again now (all or nothing): the model is told what
    changed, or with `start_over` begins a fresh conversation."""
    actor = _require(request, OPERATE_TASK)
    changes: dict[str, Any] = {
        name: value
        for name in ("instruction", "acceptance_checks", "tools", "tool_policies")
        if (value := getattr(payload, name)) is not None
    }
    changes |= payload.limits.model_dump(exclude_unset=True)
    _task_or_404(task_id)
    task_change.task_change_and_retry(
        actor=actor,
        task_id=task_id,
        changes=changes,
        retry=payload.retry,
        start_over=payload.start_over,
    )
    return _done(request, task_id, "edit")


@api.delete("/tasks/{task_id}", response={200: s.DeletedOut, **ERRORS}, tags=["actions"])
def delete_task(request: ApiRequest, task_id: int) -> dict[str, int]:
    """Delete a done, failed or cancelled task with its transcript and files."""
    actor = _require(request, ACTION_PERMS[A.DELETE])
    person_task.task_delete(actor=actor, task_id=task_id)
    log.info("api.action", extra={"task_id": task_id, "action": "delete"})
    return {"deleted": task_id}


# --- Decisions on single operations, bound to their hash -------------------------------------


def _operation_of(model: type[Approval] | type[ReviewDecision], op_id: int, task_id: int) -> None:
    owner = model.objects.filter(pk=op_id).values_list("task_id", flat=True).first()
    if owner != task_id:
        what = "approval" if model is Approval else "needs_review decision"
        raise NotFound(f"task {task_id} has no {what} {op_id}")


def _decide(
    request: ApiRequest, task_id: int, op_id: int, payload: s.DecisionIn, action: str
) -> dict[str, Any]:
    """A decision on one operation of this task, with the console's permission and service."""
    entry = REGISTRY[action]
    actor = _require(request, entry.perm)
    _operation_of(Approval if entry.target == "approval" else ReviewDecision, op_id, task_id)
    entry.call(actor=actor, target_id=op_id, arguments_hash=payload.arguments_hash)
    return _done(request, task_id, action)


def _decide_approval(
    request: ApiRequest, task_id: int, approval_id: int, action: str, **inputs: object
) -> dict[str, Any]:
    """An approval's decision: the task, and the decision (an edit's new hash, a message)."""
    entry = REGISTRY[action]
    actor = _require(request, entry.perm)
    _operation_of(Approval, approval_id, task_id)
    decided: Approval = entry.call(actor=actor, target_id=approval_id, **inputs)
    return _done(request, task_id, action) | {"decision": decided_as_dict(decided)}


@api.post(
    "/tasks/{task_id}/approvals/{approval_id}/approve",
    response={200: s.DecidedOut, **ERRORS},
    tags=["decisions"],
)
def approve(
    request: ApiRequest, task_id: int, approval_id: int, payload: s.ApproveIn
) -> dict[str, Any]:
    """Let the operation run, as proposed or with edited `arguments`. A hash that no longer
    matches changes nothing: 409 stale_decision; a refused edit changes nothing: 400 with the
    refusal's code (invalid_arguments, path_outside_workspace, url_address_not_allowed, …)."""
    return _decide_approval(
        request,
        task_id,
        approval_id,
        A.APPROVE,
        arguments_hash=payload.arguments_hash,
        arguments=payload.arguments,
    )


@api.post(
    "/tasks/{task_id}/approvals/{approval_id}/deny",
    response={200: s.DecidedOut, **ERRORS},
    tags=["decisions"],
)
def deny(request: ApiRequest, task_id: int, approval_id: int, payload: s.DenyIn) -> dict[str, Any]:
    """Refuse the operation; the model receives the `message` (or a fixed text) as the call's
    result."""
    return _decide_approval(
        request,
        task_id,
        approval_id,
        A.DENY,
        arguments_hash=payload.arguments_hash,
        message=payload.message,
    )


@api.post(
    "/tasks/{task_id}/reviews/{decision_id}/run-again",
    response={200: s.TaskOut, **ERRORS},
    tags=["decisions"],
)
def run_again(
    request: ApiRequest, task_id: int, decision_id: int, payload: s.DecisionIn
) -> dict[str, Any]:
    """An operation of unknown outcome runs again (for fetch_url: another GET)."""
    return _decide(request, task_id, decision_id, payload, A.RUN_AGAIN)


@api.post(
    "/tasks/{task_id}/reviews/{decision_id}/skip",
    response={200: s.TaskOut, **ERRORS},
    tags=["decisions"],
)
def skip(
    request: ApiRequest, task_id: int, decision_id: int, payload: s.DecisionIn
) -> dict[str, Any]:
    """The model is told the outcome is unknown; the operation does not run again."""
    return _decide(request, task_id, decision_id, payload, A.SKIP)


@api.get("/approvals", response={200: s.PendingOut, **ERRORS}, tags=["decisions"])
def inbox(
    request: ApiRequest, limit: QueryEx[int, P(ge=1, le=MAX_PAGE_SIZE)] = PAGE_SIZE
) -> PendingOperations:
    """What waits for a person: open approvals and needs_review decisions, oldest first."""
    _require(request, *INBOX_PERMS)
    return pending_operations(limit)


# --- Connections ----------------------------------------------------------------------------


def _connection_as_dict(conn: Connection, now: datetime) -> ConnectionDict:
    return {
        "id": conn.pk,
        "name": conn.name,
        "kind": conn.kind,
        "base_url": display_url(conn.base_url),
        # The executable only: arguments could carry something secret by mistake.
        "program": conn.command[0] if conn.command else None,
        "credential_env": conn.credential_env,
        "cost_tier": conn.cost_tier,
        "priority": conn.priority,
        "enabled": conn.enabled,
        "cooldown_until": conn.cooldown_until,
        "cooling": bool(conn.cooldown_until and conn.cooldown_until > now),
        "last_error_code": conn.last_error_code or None,
        "models": [
            {
                "id": m.pk,
                "name": m.name,
                "context_window": m.context_window,
                "supports_tools": m.supports_tools,
                "test_status": m.test_status,
                "test_message": m.test_message,
                "tested_at": m.tested_at,
                "streams": m.streams,
            }
            for m in conn.models.all()
        ],
    }


@api.get("/connections", response={200: list[s.ConnectionOut], **ERRORS}, tags=["connections"])
def list_connections(request: ApiRequest) -> list[ConnectionDict]:
    """Connections in fallback order, with their health and their models' tests."""
    _require(request, *VIEW_CONNECTIONS_PERMS)
    now = timezone.now()
    conns = Connection.objects.prefetch_related("models").order_by("-priority", "name")
    return [_connection_as_dict(c, now) for c in conns]


@api.post(
    "/connections/{connection_id}/test",
    response={200: list[s.ConnectionTestOut], **ERRORS},
    tags=["connections"],
)
def test_connection(
    request: ApiRequest, connection_id: int, payload: s.ConnectionTestIn | None = None
) -> list[ModelTestResult]:
    """A real request per model (no transaction open meanwhile); records pass or fail."""

    actor = _require(request, MANAGE_CONNECTIONS)
    conn = Connection.objects.filter(pk=connection_id).first()
    if conn is None:
        raise NotFound(
            f"connection {connection_id} does not exist", code=ErrorCode.CONNECTION_NOT_FOUND
        )
    model_name = payload.model if payload else None
    try:
        return agent_connections.connection_test(actor=actor, name=conn.name, model_name=model_name)
    except InvalidInput as exc:
        raise InvalidInput(exc.message, field="model" if model_name else None) from None


# --- Scorecard ------------------------------------------------------------------------------


@api.get("/scorecard", response={200: dict, **ERRORS}, tags=["scorecard"])
def scorecard(
    request: ApiRequest,
    period: QueryEx[str, P(description="day, week or month")] = "week",
    since: QueryEx[str | None, P(description="a date (YYYY-MM-DD); overrides period")] = None,
) -> dict[str, Any]:
    """How each connection/model did over a period (as `acthelm_task stats --json`)."""

    _require(request, VIEW_AGENTRUN)
    try:
        window = scorecard_window(period=period, since=since)
    except InvalidInput as exc:
        raise InvalidInput(exc.message, field="since" if since else "period") from None
    return model_scorecard(window=window).as_dict()


# --- Goals ----------------------------------------------------------------------------------


def _goal_or_404(goal_id: int) -> Goal:
    goal = Goal.objects.select_related("created_by").filter(pk=goal_id).first()
    if goal is None:
        raise GoalNotFound(f"goal {goal_id} does not exist")
    return goal


@api.get("/goals", response={200: list[s.GoalOut], **ERRORS}, tags=["goals"])
def list_goals(request: ApiRequest, active: bool | None = None) -> list[dict[str, Any]]:
    _require(request, VIEW_GOAL)
    goals = Goal.objects.select_related("created_by").order_by("-id")
    if active is not None:
        goals = goals.filter(active=active)
    return [goal_as_dict(g) for g in goals[:MAX_PAGE_SIZE]]


@api.post("/goals", response={201: s.GoalOut, **ERRORS}, tags=["goals"])
def create_goal(request: ApiRequest, payload: s.GoalIn) -> Status[dict[str, Any]]:
    """A new active goal: the reconciler plans it at its next pass."""
    actor = _require(request, ADD_GOAL)
    goal = goal_actions.goal_create(
        actor=actor,
        title=payload.title,
        description=payload.description,
        acceptance_checks=[c for c in payload.expect if c.strip()],
    )
    return Status(201, goal_as_dict(_goal_or_404(goal.pk)))


@api.get("/goals/{goal_id}", response={200: s.GoalDetailOut, **ERRORS}, tags=["goals"])
def show_goal(request: ApiRequest, goal_id: int) -> dict[str, Any]:
    """The goal with its newest 100 tasks (GET /tasks?goal_id= pages through all of them)."""
    _require(request, VIEW_GOAL)
    return goal_as_dict(_goal_or_404(goal_id), with_tasks=GOAL_TASKS)


@api.post("/goals/{goal_id}/deactivate", response={200: s.GoalOut, **ERRORS}, tags=["goals"])
def deactivate_goal(request: ApiRequest, goal_id: int) -> dict[str, Any]:
    """The reconciler stops planning it; its tasks keep their states."""
    actor = _require(request, CHANGE_GOAL)
    goal_actions.goal_deactivate(actor=actor, goal_id=goal_id)
    return goal_as_dict(_goal_or_404(goal_id))
