"""System checks for settings that contradict each other (`manage.py check`; every command that
runs checks, the worker included, refuses to start on an error).

Each would otherwise fail late and quietly: a heartbeat not shorter than the lease lets every
lease expire between two renewals (each task is recovered under its running worker); an empty
retry table crashes the first retry; a pool of no connections blocks every run.
"""

from collections.abc import Sequence
from typing import Any

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import CheckMessage, Error, Tags, Warning, register

from core.commands import PROJECT_TAG
from core.credentials import destinations_problem

TAG = PROJECT_TAG


def _positive(name: str, value: object) -> Error | None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        return Error(f"{name} must be a positive number (it is {value!r}).", id="acthelm.E001")
    return None


def _delays(name: str, value: Any) -> Error | None:
    if not value or any(not isinstance(d, int | float) or d < 0 for d in value):
        return Error(
            f"{name} must list at least one delay in seconds, none negative (it is {value!r}).",
            hint="For example 60,300; the last one repeats.",
            id="acthelm.E002",
        )
    return None


@register(TAG, Tags.compatibility)
def check_worker_settings(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    found = [
        _positive(name, getattr(settings, name))
        for name in (
            "ACTHELM_LEASE_SECONDS",
            "ACTHELM_HEARTBEAT_SECONDS",
            "ACTHELM_POLL_SECONDS",
            "ACTHELM_RECOVER_INTERVAL_SECONDS",
            "ACTHELM_RUN_TIMEOUT_SECONDS",
            "ACTHELM_DB_POOL_SIZE",
            "ACTHELM_DB_POOL_TIMEOUT_SECONDS",
            "ACTHELM_CLAIM_BATCH",
            "ACTHELM_MAX_HANDBACKS",
            "ACTHELM_MAX_ATTEMPTS",
            "ACTHELM_NOTIFY_TIMEOUT_SECONDS",
        )
    ]
    found += [
        _delays(name, getattr(settings, name))
        for name in ("ACTHELM_RETRY_DELAYS", "ACTHELM_NOTIFY_RETRY_DELAYS")
    ]
    problems: list[CheckMessage] = [p for p in found if p is not None]
    if problems:
        return problems  # the comparisons below need numbers
    lease, beat = settings.ACTHELM_LEASE_SECONDS, settings.ACTHELM_HEARTBEAT_SECONDS
    if beat >= lease:
        problems.append(
            Error(
                f"ACTHELM_HEARTBEAT_SECONDS ({beat:g}) must be shorter than ACTHELM_LEASE_SECONDS "
                f"({lease:g}): every lease would expire before it is renewed, and a running task "
                "would be recovered under its worker.",
                hint="Keep the heartbeat at a third of the lease or less (10 and 60 by default).",
                id="acthelm.E003",
            )
        )
    elif beat * 2 > lease:
        problems.append(
            Warning(
                f"ACTHELM_HEARTBEAT_SECONDS ({beat:g}) is more than half of ACTHELM_LEASE_SECONDS "
                f"({lease:g}): one slow renewal loses the lease.",
                hint="Keep the heartbeat at a third of the lease or less.",
                id="acthelm.W001",
            )
        )
    if lease > settings.ACTHELM_RUN_TIMEOUT_SECONDS:
        problems.append(
            Warning(
                f"ACTHELM_RUN_TIMEOUT_SECONDS ({settings.ACTHELM_RUN_TIMEOUT_SECONDS:g}) is "
                f"shorter than the lease ({lease:g}): runs end before their lease could.",
                id="acthelm.W002",
            )
        )
    return problems


@register(TAG, Tags.security)
def check_credential_destinations(
    app_configs: Sequence[AppConfig] | None = None, **kwargs: Any
) -> list[CheckMessage]:
    """ACTHELM_CREDENTIAL_DESTINATIONS read from the environment is refused at start-up
    (ImproperlyConfigured); a value a settings file wrote is checked here."""
    problem = destinations_problem(getattr(settings, "ACTHELM_CREDENTIAL_DESTINATIONS", {}))
    if problem is None:
        return []
    return [
        Error(
            f"ACTHELM_CREDENTIAL_DESTINATIONS: {problem}.",
            hint="For example OPENAI_API_KEY=api.openai.com;ACTHELM_KEY_GITHUB=api.github.com "
            "(docs/security.md#credentials).",
            id="acthelm.E010",
        )
    ]
