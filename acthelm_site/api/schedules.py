"""The API's schedules: list, create, show, pause, resume, run now and delete, over
`schedules.services` with the person's permissions, as the console and `acthelm_schedule` do.
A bad cron expression or time zone is a 400 naming its field."""

from datetime import datetime
from typing import TYPE_CHECKING, Any

from django.http import HttpRequest
from ninja import Router, Schema, Status
from pydantic import Field

from acthelm_site.api.models import ApiToken
from acthelm_site.api.schemas import BodyIn, DeletedOut, ErrorOut, from_typed_dict
from core.actors import Actor
from core.exceptions import NotPermitted
from schedules import services
from schedules.permissions import ADD_SCHEDULE, CHANGE_SCHEDULE, DELETE_SCHEDULE, VIEW_SCHEDULE
from schedules.selectors import SLOT_PAGE, SlotDict, schedule_as_dict, schedules_with_last
from schedules.states import CatchUpPolicy, OverlapPolicy, ScheduleTarget

router = Router(tags=["schedules"])

ERRORS: dict[int, type[Schema]] = {code: ErrorOut for code in (400, 401, 403, 404, 409, 422)}


class _TokenRequest(HttpRequest):
    auth: ApiToken


def _actor(request: HttpRequest, perm: str) -> Actor:
    token = request.auth  # type: ignore[attr-defined]
    if not isinstance(token, ApiToken):  # the API's BearerToken set it; nothing else does
        raise NotPermitted("no API token")
    user = token.user
    if not user.has_perm(perm):
        raise NotPermitted(f"{user.get_username()} lacks the permission {perm}")
    return Actor.person(user, api_token=(token.pk, token.prefix))


class ScheduleIn(BodyIn):
    name: str = Field(..., min_length=1, max_length=100)
    cron: str = Field(..., description="Five fields, e.g. '0 8 * * 1-5' (or @daily, @hourly…)")
    timezone: str = Field("UTC", description="An IANA name, e.g. Europe/Berlin")
    target: str = Field(ScheduleTarget.TASK, description="task, or goal (for the reconciler)")
    title: str = Field(..., min_length=1, max_length=160)
    instruction: str = Field(..., min_length=1)
    goal_id: int | None = None
    connection: str | None = Field(None, description="The connection's name")
    model: str | None = Field(None, description="The model's name")
    tools: list[str] | None = Field(None, description="None: the default tools")
    tool_policies: dict[str, str] = {}
    allowed_domains: list[str] = []
    tags: list[str] = []
    limits: dict[str, Any] = {}
    expect: list[str] = Field([], description="Acceptance checks, one KIND=VALUE each")
    priority: int = 0
    overlap: str = Field(OverlapPolicy.SKIP, description="skip (while the last is open) or allow")
    catch_up: str = Field(CatchUpPolicy.LATEST, description="latest or none")
    ends_at: datetime | None = Field(None, description="No slot after this time (with offset)")


if TYPE_CHECKING:  # made at run time from the typed dict: to a checker, a Schema
    SlotOut = Schema
else:
    SlotOut = from_typed_dict("SlotOut", SlotDict, slot_at=datetime)


class ScheduleOut(Schema):
    id: int
    name: str
    target: str
    cron: str
    cron_text: str
    timezone: str
    title: str
    instruction: str
    goal_id: int | None
    connection: str | None
    model: str | None
    tools: list[str] | None
    tool_policies: dict[str, str]
    allowed_domains: list[str]
    tags: list[str]
    limits: dict[str, Any]
    acceptance_checks: list[dict[str, str]]
    priority: int
    overlap: str
    catch_up: str
    paused: bool
    ends_at: datetime | None
    ended: bool
    next_runs: list[datetime] = Field(description="The next three slots, in its time zone")
    last_slot_at: datetime | None
    last_result: SlotOut | None
    cost: str = Field(description="What the tasks it created cost, in US dollars")
    created_at: datetime


class ScheduleDetailOut(ScheduleOut):
    slots: list[SlotOut]


class RunNowOut(ScheduleOut):
    created: dict[str, int | None] = Field(description="The task_id (or goal_id) created")


def _out(pk: int, **extra: Any) -> dict[str, Any]:
    found = schedules_with_last().filter(pk=pk).first()
    if found is None:
        raise services.ScheduleNotFound(f"schedule {pk} does not exist")
    return schedule_as_dict(found, **extra)


@router.get("", response={200: list[ScheduleOut], **ERRORS})
def list_schedules(request: _TokenRequest) -> list[dict[str, Any]]:
    _actor(request, VIEW_SCHEDULE)
    return [schedule_as_dict(s) for s in schedules_with_last()]


@router.post("", response={201: ScheduleOut, **ERRORS})
def create_schedule(request: _TokenRequest, payload: ScheduleIn) -> Status[dict[str, Any]]:
    """A new schedule; its first slot is the first after now."""
    actor = _actor(request, ADD_SCHEDULE)
    fields = payload.model_dump()
    fields["goal"] = fields.pop("goal_id")
    fields["acceptance_checks"] = [c for c in fields.pop("expect") if c.strip()]
    schedule = services.schedule_create(actor=actor, **fields)
    return Status(201, _out(schedule.pk))


@router.get("/{schedule_id}", response={200: ScheduleDetailOut, **ERRORS})
def show_schedule(request: _TokenRequest, schedule_id: int) -> dict[str, Any]:
    """The schedule with its newest slots."""
    _actor(request, VIEW_SCHEDULE)
    return _out(schedule_id, with_slots=SLOT_PAGE)


@router.post("/{schedule_id}/pause", response={200: ScheduleOut, **ERRORS})
def pause_schedule(request: _TokenRequest, schedule_id: int) -> dict[str, Any]:
    services.schedule_pause(actor=_actor(request, CHANGE_SCHEDULE), schedule_id=schedule_id)
    return _out(schedule_id)


@router.post("/{schedule_id}/resume", response={200: ScheduleOut, **ERRORS})
def resume_schedule(request: _TokenRequest, schedule_id: int) -> dict[str, Any]:
    """Runs again from the next slot; the slots that fell while paused are recorded, not run."""
    services.schedule_resume(actor=_actor(request, CHANGE_SCHEDULE), schedule_id=schedule_id)
    return _out(schedule_id)


@router.post("/{schedule_id}/run-now", response={200: RunNowOut, **ERRORS})
def run_schedule_now(request: _TokenRequest, schedule_id: int) -> dict[str, Any]:
    """Creates its task (or goal) now, paused or not; its slots are unchanged."""
    slot = services.schedule_run_now(
        actor=_actor(request, CHANGE_SCHEDULE), schedule_id=schedule_id
    )
    return _out(schedule_id) | {"created": {"task_id": slot.task_id, "goal_id": slot.goal_id}}


@router.delete("/{schedule_id}", response={200: DeletedOut, **ERRORS})
def delete_schedule(request: _TokenRequest, schedule_id: int) -> dict[str, int]:
    """Removes the schedule and its slot records; the tasks it created stay."""
    services.schedule_delete(actor=_actor(request, DELETE_SCHEDULE), schedule_id=schedule_id)
    return {"deleted": schedule_id}
