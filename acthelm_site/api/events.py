"""`GET /api/tasks/{id}/events`: a task's events as Server-Sent Events (issue 52), with the
API's token. The stored events first (`id:` each; resume with `Last-Event-ID`), then what the
task's model turn is writing as it writes it (`delta`, no id) and each new stored event as it
commits, until the task settles (`end`). The stream itself is `tasks.livestream`."""

from django.http import HttpRequest
from django.http.response import HttpResponseBase
from ninja import Router

from acthelm_site.api.models import ApiToken
from acthelm_site.api.schemas import ErrorOut
from core.exceptions import NotPermitted, TaskNotFound
from tasks.livestream import stream_response
from tasks.models import Task
from tasks.permissions import VIEW_TASK

router = Router(tags=["tasks"])


@router.get(
    "/{task_id}/events",
    response={200: None, **{code: ErrorOut for code in (401, 403, 404, 503)}},
)
def task_events(request: HttpRequest, task_id: int) -> HttpResponseBase:
    """`text/event-stream`: `task_event` (a stored event, the JSON of the task's timeline, with
    `id:`), `delta` (`{"task", "run", "seq", "reset", "deltas": [[kind, data], …]}`: the turn
    being written — `text`, `tool_call`, `turn`, `end` — never stored, never resumable) and
    `end` (`{"status": …}`, the last). `Last-Event-ID` (or `?last_event_id=`) resumes after
    that stored event. 503 with `Retry-After` when this server process streams to its maximum
    of viewers already (`ACTHELM_LIVE_MAX_VIEWERS`); 503 without it under a server that runs
    one request at a time (gunicorn's sync worker: `make serve` runs threads)."""
    # The API's BearerToken sets `auth`; Django's HttpRequest does not declare it.
    token = request.auth  # type: ignore[attr-defined]
    if not isinstance(token, ApiToken):
        raise NotPermitted("no API token")
    if not token.user.has_perm(VIEW_TASK):
        raise NotPermitted(f"{token.user.get_username()} lacks the permission {VIEW_TASK}")
    if not Task.objects.filter(pk=task_id).exists():
        raise TaskNotFound(f"task {task_id} does not exist")
    return stream_response(task_id, request)
