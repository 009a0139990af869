"""Connections and models: adding them, testing them, and checking a model for a task."""

import logging
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from typing import Any, NotRequired, TypedDict

from django.conf import settings
from django.db import transaction
from django.db.models import QuerySet

from agents.catalogue.connection_rules import validate_connection
from agents.catalogue.eligibility import eligible_models, has_tools, model_refusals
from agents.catalogue.providers import Provider, ProviderError, build_provider, get_provider_class
from agents.models import Connection, Model, Turn
from agents.permissions import MANAGE_CONNECTIONS
from agents.states import CostTier, ModelTestStatus
from core.actors import Actor
from core.credentials import CredentialRefused, credential_for
from core.exceptions import InvalidInput, ModelCheckFailed
from core.numbers import INT32_MAX, whole_number
from tasks.models import Task

log = logging.getLogger("acthelm.agents")

# A rough, provider-independent estimate: about four characters per token.
CHARS_PER_TOKEN = 4


def estimate_tokens(text: str) -> int:
    return len(text) // CHARS_PER_TOKEN + 1


@dataclass
class ModelCheck:
    ok: bool = True
    problems: list[str] = field(default_factory=list)
    window_checked: bool = True
    estimated_tokens: int = 0
    context_window: int | None = None
    notes: list[str] = field(default_factory=list)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    def raise_if_failed(self) -> None:
        if not self.ok:
            raise ModelCheckFailed("; ".join(self.problems))


def conversation_tokens(task: Task) -> int:
    """Estimate what the saved conversation costs in tokens if sent to a model now."""
    total = estimate_tokens(task.instruction)
    conversation = getattr(task, "conversation", None) if task.pk else None
    first = 0  # the turns of a conversation a person started over are not sent again
    if conversation is not None:
        total += estimate_tokens(conversation.system_prompt)
        first = conversation.first_turn
    for content in Turn.objects.filter(task=task, discarded=False, index__gte=first).values_list(
        "content", flat=True
    ):
        total += estimate_tokens(content)
    for call in task.tool_calls.filter(turn__discarded=False, turn__index__gte=first).values_list(
        "result_for_model", "arguments_raw"
    ):
        total += estimate_tokens(call[0]) + estimate_tokens(call[1])
    return total


def model_check_for_task(*, task: Task, model: Model) -> ModelCheck:
    """The checks before a task is queued on another model (resume, retry): every reason of the
    one rule (`agents.catalogue.eligibility`; a cooldown is waited out), and whether the saved
    conversation fits the model's context window."""
    check = ModelCheck(context_window=model.context_window)
    check.problems += [
        refusal.message for refusal in model_refusals(model, with_tools=has_tools(task.tools))
    ]
    check.estimated_tokens = conversation_tokens(task)
    if model.context_window is None:
        check.window_checked = False
        check.notes.append("context window unknown: the check could not be made")
    elif check.estimated_tokens > model.context_window:
        check.problems.append(
            f"the saved conversation (~{check.estimated_tokens} tokens) exceeds the context "
            f"window of {model} ({model.context_window} tokens)"
        )
    check.ok = not check.problems
    return check


def usable_models() -> QuerySet[Model]:
    """Models a task with tools can run on (`eligible_models`: passed their test, tool-capable,
    on an enabled connection): the reconciler's choice and a new task's default."""
    return eligible_models(with_tools=True)


def best_zero_cost_model() -> Model | None:
    """The highest-priority zero-cost connection's tested, tool-capable model, or None."""
    return (
        usable_models()
        .filter(connection__cost_tier=CostTier.ZERO_COST)
        .order_by("-connection__priority", "connection__name", "id")
        .first()
    )


MAX_CONTEXT_WINDOW = INT32_MAX


class ModelSpec(TypedDict):
    """A model to add with a new connection (`connection_add`)."""

    name: str
    context_window: NotRequired[int | None]
    #: Absent: what the connection's kind supports.
    supports_tools: NotRequired[bool]


class ModelTestResult(TypedDict):
    """What `connection_test` found for one model."""

    model: str
    ok: bool
    message: str
    context_window: int | None
    supports_tools: bool
    tools_override_by: str | None
    #: Whether the server streamed its answer (None: the test could not tell).
    streams: bool | None


def connection_add(
    *,
    actor: Actor,
    name: str,
    kind: str,
    base_url: str = "",
    command: list[str] | None = None,
    answer_field: str = "",
    credential_env: str = "",
    cost_tier: str = CostTier.PAID,
    priority: int = 0,
    timeout_seconds: float = 120,
    models: list[ModelSpec] | None = None,
    exist_ok: bool = False,
) -> Connection:
    """Add a connection and its models. The credential is an environment variable's name.
    `exist_ok`: a connection of that name that already has exactly these settings and models
    is returned as it is (a script may run twice); one that differs is refused, naming what
    differs — a person's connection is never changed by a second `add`."""
    actor.require(MANAGE_CONNECTIONS)
    numbers = validate_connection(
        actor=actor,
        kind=kind,
        base_url=base_url,
        command=command,
        credential_env=credential_env,
        cost_tier=cost_tier,
        priority=priority,
        timeout_seconds=timeout_seconds,
    )
    priority, timeout_seconds = numbers["priority"], numbers["timeout_seconds"]
    for spec in models or []:
        if spec.get("context_window") is not None:
            whole_number(
                spec["context_window"],
                name="context window",
                minimum=1,
                maximum=MAX_CONTEXT_WINDOW,
            )
    existing = Connection.objects.filter(name=name).first()
    if existing is not None and not exist_ok:
        raise InvalidInput(f"a connection named {name!r} exists already")
    if existing is not None:
        given = {
            "kind": kind,
            "base_url": base_url,
            "command": list(command or []),
            "answer_field": answer_field,
            "credential_env": credential_env,
            "cost_tier": cost_tier,
            "priority": priority,
            "timeout_seconds": timeout_seconds,
        }
        differs = _differences(existing, given, models or [])
        if differs:
            raise InvalidInput(
                f"a connection named {name!r} exists already with other settings "
                f"({'; '.join(differs)}): change it in the admin, or choose another name"
            )
        return existing
    with transaction.atomic():
        conn = Connection.objects.create(
            name=name,
            kind=kind,
            base_url=base_url,
            command=list(command or []),
            answer_field=answer_field,
            credential_env=credential_env,
            cost_tier=cost_tier,
            priority=priority,
            timeout_seconds=timeout_seconds,
        )
        for spec in models or []:
            Model.objects.create(
                connection=conn,
                name=spec["name"],
                context_window=spec.get("context_window"),
                supports_tools=spec.get("supports_tools", get_provider_class(kind).supports_tools),
            )
    return conn


def _differences(conn: Connection, given: dict[str, Any], models: list[ModelSpec]) -> list[str]:
    """How `given` (a connection's settings) and `models` differ from the stored connection."""
    out = [
        f"{f}: {getattr(conn, f)!r}, not {v!r}" for f, v in given.items() if getattr(conn, f) != v
    ]
    stored = {m.name: m for m in conn.models.all()}
    for spec in models:
        model = stored.get(spec["name"])
        if model is None:
            out.append(f"no model {spec['name']!r}")
            continue
        window = spec.get("context_window")
        if window is not None and model.context_window != window:
            out.append(f"{model.name} context window: {model.context_window}, not {window}")
        if "supports_tools" in spec and model.supports_tools != spec["supports_tools"]:
            out.append(f"{model.name} tools: {model.supports_tools}, not {spec['supports_tools']}")
    return out


#: What a model's test was made against: changing any of these makes the test say nothing.
TESTED_AGAINST = ("kind", "base_url", "command", "answer_field", "credential_env")
CONNECTION_EDITABLE = (
    "name",
    *TESTED_AGAINST,
    "cost_tier",
    "priority",
    "timeout_seconds",
    "enabled",
)
MODEL_EDITABLE = (
    "name",
    "context_window",
    "supports_tools",
    "price_input_per_mtok",
    "price_output_per_mtok",
    "price_cached_input_per_mtok",
    "price_cache_write_per_mtok",
    "prices_source",
)


def _untest(models: QuerySet[Model], *, reason: str, actor: Actor) -> int:
    """Reset models to untested: what they passed against is gone. A tool override goes too."""
    return models.exclude(test_status=ModelTestStatus.UNTESTED, tools_override_at=None).update(
        test_status=ModelTestStatus.UNTESTED,
        tested_at=None,
        test_message=f"{reason} (by {actor.label}): test again"[:2000],
        streams=None,
        tools_override_by=None,
        tools_override_at=None,
    )


def connection_update(*, actor: Actor, connection_id: int, changes: dict[str, Any]) -> Connection:
    """A person's edit of a connection (the admin): validated like a new one, a new kind or command
    against who edits it; when what its models were tested against changes (kind, URL, command,
    answer field, credential), they are untested again and tasks will not run on them until a new
    test passes."""
    actor.require(MANAGE_CONNECTIONS)
    unknown = sorted(set(changes) - set(CONNECTION_EDITABLE))
    if unknown:
        raise InvalidInput(f"these fields cannot be edited: {', '.join(unknown)}")
    with transaction.atomic():
        conn = Connection.objects.select_for_update().filter(pk=connection_id).first()
        if conn is None:
            raise InvalidInput(f"connection {connection_id} does not exist")
        changed = [k for k, v in changes.items() if getattr(conn, k) != v]
        for field in changed:
            setattr(conn, field, changes[field])
        numbers = validate_connection(
            # What runs is checked against who changes it; a superuser's command stays usable
            # by those who edit only the rest.
            actor=actor,
            check_command=bool({"kind", "command"} & set(changed)),
            kind=conn.kind,
            base_url=conn.base_url,
            command=conn.command,
            credential_env=conn.credential_env,
            cost_tier=conn.cost_tier,
            priority=conn.priority,
            timeout_seconds=conn.timeout_seconds,
        )
        conn.priority, conn.timeout_seconds = numbers["priority"], numbers["timeout_seconds"]
        if (
            "name" in changed
            and Connection.objects.filter(name=conn.name).exclude(pk=conn.pk).exists()
        ):
            raise InvalidInput(f"a connection named {conn.name!r} exists already")
        if not changed:
            return conn
        conn.save(update_fields=changed)
        retest = [f for f in changed if f in TESTED_AGAINST]
        untested = 0
        if retest:
            untested = _untest(
                conn.models.all(),
                reason=f"the connection's {', '.join(retest)} changed",
                actor=actor,
            )
    # Field names only: a base URL or command could carry a secret by mistake.
    log.info(
        "connection.changed",
        extra={
            "connection": conn.name,
            "fields": changed,
            "models_untested": untested,
            "actor": actor.label,
        },
    )
    return conn


def model_update(*, actor: Actor, model_id: int, changes: dict[str, Any]) -> Model:
    """A person's edit of a model (the admin). A new name or a change of tool support makes the
    old test say nothing: the model is untested again (and a tool override is dropped)."""
    actor.require(MANAGE_CONNECTIONS)
    unknown = sorted(set(changes) - set(MODEL_EDITABLE))
    if unknown:
        raise InvalidInput(f"these fields cannot be edited: {', '.join(unknown)}")
    if changes.get("context_window") is not None:
        whole_number(
            changes["context_window"], name="context window", minimum=1, maximum=MAX_CONTEXT_WINDOW
        )
    with transaction.atomic():
        model = Model.objects.select_for_update().filter(pk=model_id).first()
        if model is None:
            raise InvalidInput(f"model {model_id} does not exist")
        changed = [k for k, v in changes.items() if getattr(model, k) != v]
        if not changed:
            return model
        for field in changed:
            setattr(model, field, changes[field])
        model.save(update_fields=changed)
        retest = [f for f in changed if f in ("name", "supports_tools")]
        if retest:
            _untest(
                Model.objects.filter(pk=model.pk),
                reason=f"the model's {', '.join(retest)} changed",
                actor=actor,
            )
            model.refresh_from_db()
    log.info(
        "model.changed",
        extra={"model": str(model), "fields": changed, "actor": actor.label},
    )
    return model


PRICE_FIELDS = (
    "price_input_per_mtok",
    "price_output_per_mtok",
    "price_cached_input_per_mtok",
    "price_cache_write_per_mtok",
)
MAX_PRICE = Decimal("999999.9999")  # the columns' 10 digits, 4 after the point


def _price(field: str, value: object) -> Decimal | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
        return None
    try:
        price = Decimal(str(value).strip())
    except ArithmeticError:
        raise InvalidInput(f"{field}: a price such as 2.50, not {value!r}", field=field) from None
    if not price.is_finite() or price < 0 or price > MAX_PRICE:
        raise InvalidInput(f"{field}: a price from 0 to {MAX_PRICE}", field=field)
    return price.quantize(Decimal("0.0001"))


def model_set_prices(*, actor: Actor, model_id: int, prices: dict[str, object]) -> Model:
    """A person sets a model's prices in US dollars per million tokens (empty or "none" clears
    one; the cached prices fall back to the input price). Recorded as set by that person, so
    filling from the price table never overwrites them."""
    unknown = sorted(set(prices) - set(PRICE_FIELDS))
    if unknown:
        raise InvalidInput(f"not a price: {', '.join(unknown)}")
    changes: dict[str, Decimal | str | None] = {
        field: _price(field, value) for field, value in prices.items()
    }
    changes["prices_source"] = f"set by {actor.label}"[:100]
    return model_update(actor=actor, model_id=model_id, changes=changes)


def provider_for(conn: Connection) -> Provider:
    """Build the provider of a connection; the key is read from its environment variable now.

    The credential's name and where it would go are checked again here, at use time, by the
    one door (``credential_for``): a row written before the rules (or around them) gets a
    provider that refuses every request (``provider_config``) and never reads the variable."""
    destination = get_provider_class(conn.kind).credential_destination(
        base_url=conn.base_url, command=list(conn.command or [])
    )
    refusal: str | None = None
    api_key = None
    try:
        api_key = credential_for(conn.credential_env, destination)
    except CredentialRefused as exc:
        refusal = str(exc)
    timeout = conn.timeout_seconds
    if not (isinstance(timeout, int | float) and math.isfinite(timeout) and timeout > 0):
        refusal = refusal or f"the timeout {timeout!r} is not a positive, finite number"
        timeout = 120
    kwargs: dict[str, Any] = {"timeout": timeout, "api_key": api_key, "config_error": refusal}
    kwargs |= get_provider_class(conn.kind).connection_arguments(
        base_url=conn.base_url,
        command=list(conn.command or []),
        answer_field=conn.answer_field,
        credential_env=conn.credential_env,
        allowed_executables=list(settings.ACTHELM_CLI_EXECUTABLES),
    )
    return build_provider(conn.kind, **kwargs)


def model_override_tools(*, actor: Actor, model_id: int) -> Model:
    """A person's explicit override: the model counts as tool-capable although the probe saw no
    tool call. Recorded on the model row (who, when) and in the log."""
    from django.utils import timezone

    actor.require(MANAGE_CONNECTIONS)
    if not actor.is_person:
        raise InvalidInput("only a person can override the tool-calling probe")
    with transaction.atomic():
        model = Model.objects.select_for_update().filter(pk=model_id).first()
        if model is None:
            raise InvalidInput(f"model {model_id} does not exist")
        model.supports_tools = True
        model.tools_override_by = actor.user
        model.tools_override_at = timezone.now()
        model.test_message = (
            f"tool-capable by the explicit override of {actor.label} "
            f"(the probe did not prove it); {model.test_message}"
        )[:2000]
        model.save(
            update_fields=[
                "supports_tools",
                "tools_override_by",
                "tools_override_at",
                "test_message",
            ]
        )
    log.info(
        "model.tools_overridden",
        extra={"model": str(model), "model_id": model.pk, "actor": actor.label},
    )
    return model


def connection_test(
    *,
    actor: Actor,
    name: str,
    model_name: str | None = None,
    override_tools: bool = False,
    before_probe: Callable[[str], None] | None = None,
) -> list[ModelTestResult]:
    """A real request per model (and a tool-calling probe when the model claims tools);
    records pass or fail, the message and the context window when the provider reports it.
    `before_probe(model_name)` is called before each model is asked (a test in the background
    records its progress there and lets go of its database connection while it waits).

    An empty answer fails. A model that accepts the probe tool but never calls it is recorded as
    not tool-capable, unless a person overrode that (``override_tools`` records the override now
    for the models tested; the admin has the same action). Whether the server streamed its
    answer to a streamed request is recorded as the model's ``streams`` (the worker asks one
    that did not for whole answers)."""
    from django.utils import timezone

    actor.require(MANAGE_CONNECTIONS)
    conn = Connection.objects.filter(name=name).first()
    if conn is None:
        raise InvalidInput(f"connection {name!r} does not exist")
    models = list(conn.models.all())
    if model_name:
        models = [m for m in models if m.name == model_name]
    if not models:
        raise InvalidInput(f"connection {name} has no model {model_name or ''}".strip())
    if override_tools:
        models = [model_override_tools(actor=actor, model_id=m.pk) for m in models]
    provider = provider_for(conn)
    results: list[ModelTestResult] = []
    for model in models:
        overridden = model.tools_override_by_id is not None or model.tools_override_at is not None
        if before_probe is not None:
            before_probe(model.name)
        try:
            probe = provider.probe(model=model.name, tools=model.supports_tools)
            ok, message = probe.ok, probe.message
            window, streams = probe.context_window, probe.streams
            if probe.tool_ignored and model.supports_tools:
                if overridden:
                    who = model.tools_override_by or "a person"
                    message += (
                        f"; kept tool-capable by the explicit override of {who} "
                        f"on {model.tools_override_at:%Y-%m-%d %H:%M} UTC"
                    )
                else:
                    model.supports_tools = False
            elif probe.supports_tools is False and model.supports_tools:
                ok, message = False, f"tool-calling probe failed: {probe.message}"
        except ProviderError as exc:
            ok, message, window, streams = False, f"{exc.code}: {exc.message}", None, None
        model.streams = streams
        model.test_status = ModelTestStatus.PASSED if ok else ModelTestStatus.FAILED
        model.test_message = message[:2000]
        model.tested_at = timezone.now()
        if window:
            model.context_window = window
        model.save(
            update_fields=[
                "test_status",
                "test_message",
                "tested_at",
                "context_window",
                "supports_tools",
                "streams",
            ]
        )
        results.append(
            {
                "model": model.name,
                "ok": ok,
                "message": model.test_message,
                "context_window": model.context_window,
                "supports_tools": model.supports_tools,
                "tools_override_by": str(model.tools_override_by) if overridden else None,
                "streams": model.streams,
            }
        )
    return results
