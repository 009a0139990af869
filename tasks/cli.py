"""Shared pieces of Acthelm's management commands: who acts, and how results and errors print."""

import json
import os

from django.contrib.auth import get_user_model
from django.core.management.base import CommandError

from tasks.actors import Actor
from tasks.exceptions import ActhelmError


def person_actor(username: str | None) -> Actor:
    """The person a command acts as: --user, else $ACTHELM_USER, else the only superuser."""
    User = get_user_model()
    username = username or os.environ.get("ACTHELM_USER")
    if username:
        try:
            return Actor.person(User.objects.get(username=username))
        except User.DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None
    superusers = list(User.objects.filter(is_superuser=True, is_active=True)[:2])
    if len(superusers) == 1:
        return Actor.person(superusers[0])
    raise CommandError("say who acts: --user NAME (or set ACTHELM_USER)")


def emit(command, data, *, as_json: bool, text: str = "") -> None:
    if as_json:
        command.stdout.write(json.dumps(data, indent=2, default=str))
    else:
        command.stdout.write(text or json.dumps(data, indent=2, default=str))


def fail(command, exc: ActhelmError, *, as_json: bool):
    if as_json:
        command.stdout.write(
            json.dumps(
                {"ok": False, "error": exc.code, "message": str(exc), "field": exc.field},
                indent=2,
            )
        )
    raise CommandError(f"{exc} [{exc.code}]")
