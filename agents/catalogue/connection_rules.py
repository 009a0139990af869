"""What a connection's settings must satisfy: one validator behind the console, the CLI, the admin
and `Connection.clean()`. Below the models (it reads no rows), so the model can call it."""

from django.conf import settings

from acthelm_site.credentials import credential_problem
from agents.catalogue.providers.cli import executable_refusal
from agents.states import ConnectionKind, CostTier
from tasks.exceptions import InvalidInput
from tasks.numbers import finite_number, whole_number

MAX_TIMEOUT_SECONDS = 24 * 3600


__all__ = ["credential_problem", "executable_problem", "validate_connection"]


def executable_problem(command: list[str]) -> str | None:
    return executable_refusal(list(command or []), list(settings.ACTHELM_CLI_EXECUTABLES))


def validate_connection(
    *,
    kind: str,
    base_url: str = "",
    command: list[str] | None = None,
    credential_env: str = "",
    cost_tier: str = CostTier.PAID,
    priority: int = 0,
    timeout_seconds: float = 120,
) -> dict:
    """Check a connection's settings; return the bounded numbers. The one validator behind the
    console, the CLI, the admin and Connection.clean()."""
    if kind not in ConnectionKind.values:
        raise InvalidInput(f"kind must be one of {', '.join(ConnectionKind.values)}")
    if cost_tier not in CostTier.values:
        raise InvalidInput(f"cost tier must be one of {', '.join(CostTier.values)}")
    if kind == ConnectionKind.CLI:
        if not command or not isinstance(command, list):
            raise InvalidInput("a cli connection needs a command (an argument list)")
        if not all(isinstance(arg, str) and arg for arg in command):
            raise InvalidInput("a cli command is a list of non-empty strings")
        problem = executable_problem(command)
        if problem:
            raise InvalidInput(problem, code="executable_not_allowed")
    elif not base_url:
        raise InvalidInput(f"a {kind} connection needs a base URL")
    problem = credential_problem(credential_env)
    if problem:
        raise InvalidInput(problem, code="credential_not_allowed")
    return {
        "priority": whole_number(priority, name="priority"),
        "timeout_seconds": finite_number(
            timeout_seconds, name="timeout", minimum=1, maximum=MAX_TIMEOUT_SECONDS
        ),
    }
