"""Can this model run this task, and if not, why: the one rule, one code per reason, one order.

A task runs on a model when, in this order (`REASONS`, each with its `FailureCode`):

1. ``connection_missing``: it has a connection and a model at all;
2. ``connection_disabled``: the connection is enabled;
3. ``model_untested``: the model passed its test;
4. ``model_not_tool_capable``: a task with tools has a model that calls tools — recorded as
   tool-capable, on a connection whose kind can call tools (a model CLI cannot);
5. ``provider_cooling_down``: the connection is not cooling down — asked only *now* (``now``
   given): a new task or a person's resume may wait out a cooldown, a run and the fallback not.

The first four cannot be cured by waiting: a person chooses another model, tests it, or enables
the connection. `model_refusal` gives the first reason that holds, `model_refusals` every one (the
console's and the API's model check lists them all), `eligible_models` is the same rule as a query
(the defaults of a new task, the fallback after a provider error, the reconciler's choice). The
intake (`agents.engine.run.intake`), the loop's validation (`agents.engine.run.loop`), the fallback
(`agents.engine.verdict.outcomes.fallback_model`), `usable_models` and `model_check_for_task`
(`agents.catalogue.connections`) all ask here; each adds its own advice to the message.
"""

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime

from django.db.models import Q, QuerySet

from agents.catalogue.providers import UnknownProviderKind, get_provider_class, registered_kinds
from agents.models import Connection, Model
from agents.states import FailureCode, ModelTestStatus

#: The reasons in the order they are given.
REASONS = (
    FailureCode.CONNECTION_MISSING,
    FailureCode.CONNECTION_DISABLED,
    FailureCode.MODEL_UNTESTED,
    FailureCode.MODEL_NOT_TOOL_CAPABLE,
    FailureCode.PROVIDER_COOLING_DOWN,
)


@dataclass(frozen=True)
class Refusal:
    """Why a model cannot run a task: a failure code (one of `REASONS`) and what to tell."""

    code: FailureCode
    message: str


def has_tools(tools: Iterable[str]) -> bool:
    """Whether a task's tool list names a tool (an empty name is none)."""
    return any(t for t in tools)


def _kind_calls_tools(kind: str) -> bool:
    """Whether a connection of this kind can call tools. A kind no provider registers is not
    refused here: building its provider reports it."""
    try:
        return get_provider_class(kind).supports_tools
    except UnknownProviderKind:
        return True


def _kinds_without_tools() -> list[str]:
    return [kind for kind in registered_kinds() if not get_provider_class(kind).supports_tools]


def model_refusals(
    model: Model | None,
    *,
    with_tools: bool,
    connection: Connection | None = None,
    now: datetime | None = None,
) -> Iterator[Refusal]:
    """Every reason `model` cannot run a task (with tools or not), in the order of `REASONS`.

    ``connection``: the connection the task names (default: the model's). ``now``: also refuse a
    connection cooling down at that moment."""
    if model is None:
        yield Refusal(
            FailureCode.CONNECTION_MISSING, "the task has no connection and model to run on"
        )
        return
    connection = connection or model.connection
    if not connection.enabled:
        yield Refusal(FailureCode.CONNECTION_DISABLED, f"connection {connection} is disabled")
    if model.test_status != ModelTestStatus.PASSED:
        yield Refusal(
            FailureCode.MODEL_UNTESTED,
            f"model {model} has not passed its test ({model.test_status})",
        )
    if with_tools and not model.supports_tools:
        yield Refusal(
            FailureCode.MODEL_NOT_TOOL_CAPABLE,
            f"model {model} does not support tool calling (it is recorded as not "
            "tool-capable) and the task has tools",
        )
    elif with_tools and not _kind_calls_tools(connection.kind):
        yield Refusal(
            FailureCode.MODEL_NOT_TOOL_CAPABLE,
            f"model {model} does not support tool calling (a {connection.kind} connection "
            "calls no tools) and the task has tools",
        )
    cooldown = connection.cooldown_until
    if now is not None and cooldown is not None and cooldown > now:
        yield Refusal(
            FailureCode.PROVIDER_COOLING_DOWN,
            f"connection {connection} cools down until {cooldown.isoformat()}",
        )


def model_refusal(
    model: Model | None,
    *,
    with_tools: bool,
    connection: Connection | None = None,
    now: datetime | None = None,
) -> Refusal | None:
    """The first reason `model` cannot run a task (see `model_refusals`), or None: it can."""
    return next(model_refusals(model, with_tools=with_tools, connection=connection, now=now), None)


def eligible_models(*, with_tools: bool, now: datetime | None = None) -> QuerySet[Model]:
    """The models `model_refusal` accepts, as a query (with their connections)."""
    models = Model.objects.select_related("connection").filter(
        connection__enabled=True, test_status=ModelTestStatus.PASSED
    )
    if with_tools:
        models = models.filter(supports_tools=True).exclude(
            connection__kind__in=_kinds_without_tools()
        )
    if now is not None:
        models = models.filter(
            Q(connection__cooldown_until__isnull=True) | Q(connection__cooldown_until__lte=now)
        )
    return models
