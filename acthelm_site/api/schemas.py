"""The API's request and response bodies (pydantic models; the OpenAPI schema derives from them)."""

from datetime import datetime
from decimal import Decimal
from keyword import iskeyword
from typing import TYPE_CHECKING, Annotated, Any, Literal, get_type_hints

from ninja import Schema
from ninja.schema import DjangoGetter
from pydantic import ConfigDict, Field, PositiveInt, create_model, field_validator, model_validator

from acthelm_site.api.selectors import (
    ApprovalDict,
    ConnectionDict,
    ModelDict,
    PendingOperations,
    ReviewDict,
    ToolCallDict,
)
from agents.selectors import RunDict
from tasks.limits import LIMITS
from tasks.selectors import EventJSON
from tasks.states import TaskKind, TaskStatus

PositiveDecimal = Annotated[Decimal, Field(gt=0)]
if TYPE_CHECKING:
    # A Literal built from the choices at run time is no type to a checker: it reads a str.
    StatusName = str
    KindName = str
else:
    StatusName = Literal[tuple(TaskStatus.values)]
    KindName = Literal[tuple(TaskKind.values)]


def _refuse_nul(value: Any) -> Any:
    """PostgreSQL's text cannot hold U+0000: refused as the console's forms refuse it."""
    if isinstance(value, str) and "\x00" in value:
        raise ValueError("null characters are not allowed")
    if isinstance(value, list | tuple):
        for item in value:
            _refuse_nul(item)
    if isinstance(value, dict):
        for key, item in value.items():
            _refuse_nul(key)
            _refuse_nul(item)
    return value


def from_typed_dict(name: str, typed: type, **fields: Any) -> type[Schema]:
    """The output model `name` of a typed dict, which stays the shape's one definition: its
    keys in its order, with its types, except the `fields` given as a type or a (type, Field)
    pair, e.g. a datetime the dict carries as ISO text, or a description for the OpenAPI schema.
    A key that is a Python keyword (`from`) is the field `from_`, given with its alias."""
    made: dict[str, Any] = {}
    for key, hint in get_type_hints(typed).items():
        given = fields.pop(key, hint)
        made[f"{key}_" if iskeyword(key) else key] = (
            given if isinstance(given, tuple) else (given, ...)
        )
    if fields:
        raise TypeError(f"{typed.__name__} has no key {sorted(fields)}")
    return create_model(name, __base__=Schema, **made)


class TextIn(Schema):
    """Input (a body or a query) whose text is stored or searched: no NUL anywhere."""

    @field_validator("*", mode="before")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        return _refuse_nul(value)


class BodyIn(TextIn):
    """A request body: a JSON object (a string or a list is refused, not read as attributes)
    whose every field this endpoint knows (an unknown one is refused, 422 unknown_field)."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, value: Any) -> Any:
        # ninja validates a body twice when extra fields are forbidden, the second time wrapped.
        inner = value._obj if isinstance(value, DjangoGetter) else value
        if not isinstance(inner, dict):
            raise ValueError(f"the body must be a JSON object, not {_json_kind(value)}")
        return value


def _json_kind(value: Any) -> str:
    for kind, name in ((str, "a string"), (bool, "a boolean"), (list, "an array")):
        if isinstance(value, kind):
            return name
    if isinstance(value, int | float | Decimal):
        return "a number"
    return "null" if value is None else "something else"


class ErrorOut(Schema):
    code: str = Field(description="A stable code, e.g. transition_not_allowed, stale_decision")
    message: str
    field: str | None = Field(None, description="The input field at fault, for a 400")


# One optional field per row of the limits table (tasks/limits.py).
_LIMIT_FIELDS: dict[str, Any] = {
    limit.field: (
        (PositiveDecimal if limit.money else PositiveInt) | None,
        Field(None, description=f"{limit.label}; default: {limit.setting}"),
    )
    for limit in LIMITS
}
TaskLimitsIn = create_model("TaskLimitsIn", __base__=BodyIn, **_LIMIT_FIELDS)


class TaskCreateIn(TaskLimitsIn):
    """The new-task form of the console, as form fields (multipart, to attach `files`)."""

    @field_validator(*(limit.field for limit in LIMITS), mode="before")
    @classmethod
    def _empty_limit(cls, value: Any) -> Any:
        # An empty limit field is "not given" (its default), and for the money budget "none".
        return None if isinstance(value, str) and not value.strip() else value

    title: str = Field(..., min_length=1, max_length=200)
    instruction: str = Field(..., min_length=1)
    goal_id: int | None = None
    kind: KindName = TaskKind.WORK
    priority: int = 0
    tools: list[str] | None = Field(
        None,
        description="Default: ACTHELM_DEFAULT_TOOLS. Send `tools=` (empty) for a task without "
        "tools, which may run on a model CLI",
    )
    ask_tools: list[str] = Field([], description="Tools that stop for a person's approval")
    allowed_domains: list[str] = []
    connection_id: int | None = None
    model_id: int | None = None
    connection: str | None = Field(None, description="A connection's name (or connection_id)")
    model: str | None = Field(
        None,
        description="A model's name, or CONNECTION/NAME (or model_id). Without a connection and "
        "model: the best tested, zero-cost model (tool-capable when the task has tools), else 400 "
        "no_usable_model",
    )
    depends_on: list[int] = []
    tags: list[str] = []
    expect: list[str] = Field(
        [], description="Acceptance checks, one KIND=VALUE each (e.g. artifact=summary.md)"
    )


class TaskSummaryOut(Schema):
    id: int
    title: str
    status: str
    kind: str
    origin: str
    is_evaluation: bool
    goal_id: int | None
    priority: int
    tags: list[str]
    connection: str | None
    model: str | None
    failure_code: str | None
    actions: list[str]
    created_at: datetime
    updated_at: datetime


class TaskPageOut(Schema):
    items: list[TaskSummaryOut]
    older: int | None = Field(None, description="Pass as `before` for the next (older) page")
    newer: int | None = Field(None, description="Pass as `after` for the previous page")


class TaskOut(Schema):
    id: int
    title: str
    instruction: str
    status: str
    kind: str
    origin: str
    is_evaluation: bool
    goal_id: int | None
    priority: int
    depends_on: list[int]
    tools: list[str]
    tool_policies: dict[str, str]
    allowed_domains: list[str]
    acceptance_checks: list[dict[str, str]] = []
    connection: str | None
    model: str | None
    limits: dict[str, int | str | None] = Field(
        description="Whole numbers; `cost` is an amount in USD as a string, null without a budget"
    )
    claim_count: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    not_before: datetime | None
    failed_attempts: int = Field(description="Attempts that failed so far")
    max_attempts: int = Field(
        description="ACTHELM_MAX_ATTEMPTS: attempts in all, the first run among them; the "
        "failure of the last one fails the task"
    )
    failure_code: str | None
    failure_message: str | None
    feedback: str | None
    actions: list[str]
    created_at: datetime
    updated_at: datetime


if TYPE_CHECKING:  # made at run time from the typed dicts: to a checker, a Schema
    ApprovalOut = Schema
    ReviewOut = Schema
    ToolCallOut = Schema
    RunOut = Schema
    EventOut = Schema
    PendingOut = Schema
    ModelOut = Schema
    ConnectionOut = Schema
else:
    ApprovalOut = from_typed_dict(
        "ApprovalOut",
        ApprovalDict,
        created_at=datetime,
        arguments_hash=(str, Field(description="Post it back with approve/deny")),
    )
    ReviewOut = from_typed_dict(
        "ReviewOut",
        ReviewDict,
        created_at=datetime,
        arguments_hash=(str, Field(description="Post it back with run-again/skip")),
    )
    ToolCallOut = from_typed_dict(
        "ToolCallOut",
        ToolCallDict,
        result=(str, Field(description="The first 4000 characters; see result_truncated")),
    )
    RunOut = from_typed_dict(
        "RunOut",
        RunDict,
        number=(int, Field(description="The run: 1, 2, 3… per task")),
        attempt=(
            int,
            Field(
                description="The attempt the run belongs to: a run that stops for a pause, an "
                "approval or a hand-back is not an attempt, and the next run goes on with it"
            ),
        ),
        failed_attempt=(bool, Field(description="The run failed and counts as a failed attempt")),
        state=(
            str,
            Field(
                description="The run's own state: its status, or why a stopped run stopped "
                "(paused, handed_back, awaiting_approval, needs_review)"
            ),
        ),
        started_at=datetime | None,
        finished_at=datetime | None,
        cost=(
            str | None,
            Field(
                description="An amount in USD as a string; null when a model turn of the run had "
                "no known price"
            ),
        ),
        verdict=(str | None, Field(description="The supervisor's verdict")),
        verdict_shown=(
            str | None,
            Field(
                description="The verdict a person reads: the supervisor's, or 'accepted' once a "
                "person accepted the run over the supervisor's rejection"
            ),
        ),
        verdict_words=(
            str | None,
            Field(
                description="The verdict in words: 'approved by the supervisor: …' or "
                "'accepted by NAME: REASON'"
            ),
        ),
        accepted=(
            dict[str, str | None] | None,
            Field(
                description="by, at, reason: the person who accepted the rejected run into review"
            ),
        ),
        error_words=(str | None, Field(description="The error code in plain words")),
    )
    EventOut = from_typed_dict(
        "EventOut", EventJSON, at=datetime, **{"from": (str | None, Field(None, alias="from"))}
    )
    PendingOut = from_typed_dict(
        "PendingOut", PendingOperations, approvals=list[ApprovalOut], reviews=list[ReviewOut]
    )
    ModelOut = from_typed_dict("ModelOut", ModelDict)
    ConnectionOut = from_typed_dict(
        "ConnectionOut",
        ConnectionDict,
        program=(
            str | None,
            Field(description="A CLI connection's executable (not its arguments)"),
        ),
        credential_env=(str, Field(description="The NAME of the variable holding the key")),
        models=list[ModelOut],
    )


class TurnOut(Schema):
    index: int
    run_number: int | None
    role: str
    content: str
    stop_reason: str | None
    discarded: bool
    input_tokens: int
    output_tokens: int
    tool_calls: list[ToolCallOut]
    at: datetime


class TaskDetailOut(TaskOut):
    tags: list[str]
    blocking_reason: str | None
    runs: list[RunOut]
    transcript: list[TurnOut]
    earlier_turns: bool = Field(description="Older turns exist; see older_turns")
    older_turns: int | None = Field(
        None, description="Pass as `turns_before` for the next older page of turns"
    )
    pending_approvals: list[ApprovalOut]
    pending_reviews: list[ReviewOut]
    plan: Any
    usage: dict[str, int | float] = Field(
        description="model_turns, tokens and network_requests as whole numbers; active_seconds"
    )
    input_files: list[dict[str, Any]]
    artifacts: list[dict[str, Any]]
    rejection: dict[str, Any] | None = Field(
        None,
        description="The supervisor's rejection of the newest run: run, reason, failed_checks "
        "(each with source 'task check' or 'default check'), accepted (by, at, reason) once a "
        "person accepted it into review",
    )
    events: list[EventOut]
    earlier_events: bool
    older_events: int | None = Field(
        None, description="Pass as `events_before` for the next older page of events"
    )


class DecisionIn(BodyIn):
    arguments_hash: str = Field(..., min_length=1, description="The operation's hash, as shown")


class ApproveIn(DecisionIn):
    arguments: dict[str, Any] | None = Field(
        None,
        description="Edited arguments to run instead of the proposed ones (checked as the "
        "model's are: 400 with the reason's code when they are refused); the response's "
        "decision.edited_arguments_hash is the operation that runs",
    )


class DenyIn(DecisionIn):
    message: str = Field(
        "", description="Why, for the model: it receives 'denied by a person: MESSAGE'"
    )


class DecisionOut(Schema):
    approval_id: int
    status: str
    arguments_hash: str = Field(description="The proposal's hash, as it was shown")
    edited_arguments: dict[str, Any] | None
    edited_arguments_hash: str = Field(description="The edit's hash: the operation that runs")
    message: str


class DecidedOut(TaskOut):
    decision: DecisionOut


class ResumeIn(BodyIn):
    model_id: int | None = Field(None, description="Resume on this model (checked first)")


class RetryIn(BodyIn):
    model_id: int | None = None
    limits: dict[str, PositiveDecimal] = Field(
        default={},  # by name: a checker reads a positional default as none (dataclass_transform)
        description="Limits to set first, e.g. {'limit_turns': 40} or {'limit_cost': '5.00'}; "
        "all or nothing",
    )


class CancelIn(BodyIn):
    reason: str = ""


class ReopenIn(BodyIn):
    feedback: str = Field(..., min_length=1)


class AcceptIn(BodyIn):
    reason: str = Field(
        ..., min_length=1, description="Why the rejected run is accepted (on the timeline)"
    )


class _LimitsObject(TextIn):
    """A JSON object of limits by their names in the limits table (tasks/limits.py); any other
    name is refused by name (422 unknown_field, `limits.priority`), never set."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, value: Any) -> Any:
        inner = value._obj if isinstance(value, DjangoGetter) else value
        if not isinstance(inner, dict):
            raise ValueError(
                f'limits must be an object such as {{"limit_turns": 40}}, not {_json_kind(value)}'
            )
        return value


if TYPE_CHECKING:
    LimitsChangeIn = _LimitsObject  # its fields are the limits table's, made at run time
else:
    LimitsChangeIn = create_model("LimitsChangeIn", __base__=_LimitsObject, **_LIMIT_FIELDS)


class TaskEditIn(BodyIn):
    """What to change on a task that is not running; a field left out stays as it is."""

    instruction: str | None = None
    acceptance_checks: list[str | dict[str, Any]] | None = Field(
        None, description="The new list, replacing the task's: KIND=VALUE texts or objects"
    )
    tools: list[str] | None = Field(None, description="The new tool list ([] for none)")
    tool_policies: dict[str, str] | None = Field(
        None, description="{tool: 'allow' | 'ask'}, each a tool of the task's (new) list"
    )
    limits: LimitsChangeIn = Field(
        default_factory=LimitsChangeIn,
        description="Limits to set, e.g. {'limit_turns': 40} or {'limit_cost': null} (no budget); "
        "only the limits' names (another is refused, 422 unknown_field)",
    )
    retry: bool = Field(
        False,
        description="Then retry now: a failed task, or a ready one waiting for its retry (which "
        "drops the wait). The model continues its conversation and is told, in one message, the "
        "task as changed and the checks now in force",
    )
    start_over: bool = Field(
        False,
        description="With `retry`: a fresh conversation from the new instruction instead, with "
        "a newly built system prompt (the earlier runs and turns stay on record)",
    )

    @field_validator("instruction", "acceptance_checks", "tools", "tool_policies", mode="before")
    @classmethod
    def _not_null(cls, value: Any) -> Any:
        # A null would read as "left out" and change nothing while the caller meant something.
        if value is None:
            raise ValueError("null is not a value here: leave the field out to keep the task's")
        return value


class ConnectionTestIn(BodyIn):
    model: str | None = Field(None, description="Test only this model (its name)")


class ConnectionTestOut(Schema):
    model: str
    ok: bool
    message: str
    context_window: int | None
    streams: bool | None = Field(
        None,
        description="Whether the server streamed its answer to a streamed request (no: the "
        "worker asks it for whole answers); null when the test could not tell",
    )


class ModelCheckOut(Schema):
    ok: bool
    problems: list[str]
    window_checked: bool
    estimated_tokens: int
    context_window: int | None
    notes: list[str]


class GoalIn(BodyIn):
    title: str = Field(..., min_length=1, max_length=200)
    description: str = ""
    expect: list[str] = Field(
        [],
        description="Acceptance checks of the goal's work, one KIND=VALUE each: the default of "
        "a person's task with this goal, added to a follow-up that inherits its parent's checks",
    )


class GoalOut(Schema):
    id: int
    title: str
    description: str
    active: bool
    acceptance_checks: list[dict[str, str]] = []
    created_by: str | None
    created_at: datetime
    task_counts: dict[str, int] = Field(description="Tasks by state")
    open_tasks: int = Field(description="Tasks neither done nor cancelled")


class GoalTaskOut(Schema):
    id: int
    title: str
    status: str
    kind: str
    origin: str
    failure_code: str | None
    created_at: datetime


class GoalDetailOut(GoalOut):
    tasks: list[GoalTaskOut]


class DeletedOut(Schema):
    deleted: int
