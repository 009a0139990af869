"""What a connection's settings must satisfy: one validator behind the console, the CLI, the admin
and `Connection.clean()`. Below the models (it reads no rows), so the model can call it."""

from typing import TypedDict

from django.conf import settings

from agents.catalogue.providers import (
    UnknownProviderKind,
    get_provider_class,
    registered_kinds,
)
from agents.states import ConnectionKind, CostTier
from core.actors import Actor
from core.credentials import credential_problem, credential_refusal
from core.exceptions import ErrorCode, InvalidInput
from core.numbers import finite_number, whole_number

MAX_TIMEOUT_SECONDS = 24 * 3600


__all__ = [
    "connection_kind_choices",
    "connection_kinds",
    "credential_problem",
    "executable_refusal_for",
    "validate_connection",
]


def connection_kinds() -> list[str]:
    """The registered provider kinds: the shipped ones in `ConnectionKind`'s order, then any
    kind registered beside them."""
    registered = registered_kinds()
    listed = [kind.value for kind in ConnectionKind if kind in registered]
    return listed + [kind for kind in registered if kind not in listed]


def connection_kind_choices() -> list[tuple[str, str]]:
    """The choices of `Connection.kind` and the console's form: each registered kind with its
    class's label. A callable, so the migrations name this function and a new kind changes no
    migration."""
    return [(kind, get_provider_class(kind).label or kind) for kind in connection_kinds()]


class ConnectionNumbers(TypedDict):
    """A connection's numbers as `validate_connection` bounded them."""

    priority: int
    timeout_seconds: float


def executable_refusal_for(actor: Actor | None, command: list[str] | None) -> str | None:
    """Why ``actor`` may not make ``command`` a model CLI connection's command: its Test and every
    worker that uses the connection start it. Superusers and the system (no person: ``actor`` is
    None or not a person) may name any program; other people only an executable listed in
    ACTHELM_CLI_EXECUTABLES (``command[0]`` exactly), so with the list empty, none. Once set, the
    list binds everyone (the kind's ``check_settings``)."""
    if actor is None or not actor.is_person or actor.user.is_superuser:
        return None
    program = command[0] if isinstance(command, list) and command else None
    allowed = [a for a in settings.ACTHELM_CLI_EXECUTABLES if a]
    if not isinstance(program, str) or not program or program in allowed:
        return None  # no program at all: the kind's own check says what the command lacks
    listed = f" (allowed: {', '.join(allowed)})" if allowed else " (it is empty)"
    return (
        f"only a superuser may make {program!r} a model CLI "
        f"connection's command; ACTHELM_CLI_EXECUTABLES lists what others may use{listed}"
    )


def validate_connection(
    *,
    actor: Actor | None,
    check_command: bool = True,
    kind: str,
    base_url: str = "",
    command: list[str] | None = None,
    credential_env: str = "",
    cost_tier: str = CostTier.PAID,
    priority: int = 0,
    timeout_seconds: float = 120,
) -> ConnectionNumbers:
    """Check a connection's settings; return the bounded numbers. The one validator behind the
    console, the CLI, the admin and Connection.clean().

    ``actor`` is who saves (None: no person, as in ``Connection.clean()``, whose admin form checks
    the person itself); a command kind's command is checked against them
    (``executable_refusal_for``) unless ``check_command`` is False: an edit that changes neither
    the kind nor the command."""
    try:
        provider = get_provider_class(kind) if isinstance(kind, str) else None
    except UnknownProviderKind:
        provider = None
    if provider is None:
        raise InvalidInput(f"kind must be one of {', '.join(connection_kinds())}")
    if cost_tier not in CostTier.values:
        raise InvalidInput(f"cost tier must be one of {', '.join(CostTier.values)}")
    if provider.needs_command and check_command:
        problem = executable_refusal_for(actor, command)
        if problem:
            raise InvalidInput(problem, code=ErrorCode.EXECUTABLE_NOT_ALLOWED, field="command")
    refused = provider.check_settings(
        base_url=base_url,
        command=command,
        allowed_executables=list(settings.ACTHELM_CLI_EXECUTABLES),
    )
    if refused:
        raise InvalidInput.passing(refused.message, code=refused.code)
    # The name's rule, then where the credential would go (ACTHELM_CREDENTIAL_DESTINATIONS).
    destination = provider.credential_destination(base_url=base_url, command=command)
    refusal = credential_refusal(credential_env, destination)
    if refusal:
        raise InvalidInput.passing(refusal.message, code=refusal.code)
    return {
        "priority": whole_number(priority, name="priority"),
        "timeout_seconds": finite_number(
            timeout_seconds, name="timeout", minimum=1, maximum=MAX_TIMEOUT_SECONDS
        ),
    }
