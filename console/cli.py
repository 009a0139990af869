"""Shared pieces of Acthelm's management commands: who acts, and how results and errors print."""

import argparse
import json
import os
from collections.abc import Callable
from decimal import Decimal
from typing import Any, NoReturn

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError, CommandParser

from core.actors import Actor
from core.commands import CHECKS
from core.exceptions import ActhelmError
from core.numbers import money_text


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


# A command's parsed options, by dest: argparse gives each whatever its action makes of it.
type Options = dict[str, Any]
# The subparsers of an ActionCommand, one per action.
type Actions = argparse._SubParsersAction[CommandParser]


def _json_default(value: object) -> str:
    """What JSON has no type for: an amount as a fixed-point decimal ("0.00000000", never
    "0E-8"), anything else (a date, a UUID) as its text."""
    if isinstance(value, Decimal):
        return money_text(value) or ""
    return str(value)


def emit(command: BaseCommand, data: object, *, as_json: bool, text: str = "") -> None:
    if as_json:
        command.stdout.write(json.dumps(data, indent=2, default=_json_default))
    else:
        command.stdout.write(text or json.dumps(data, indent=2, default=_json_default))


def fail(command: BaseCommand, exc: ActhelmError, *, as_json: bool) -> NoReturn:
    if as_json:
        command.stdout.write(
            json.dumps(
                {"ok": False, "error": exc.code, "message": str(exc), "field": exc.field},
                indent=2,
            )
        )
    raise CommandError(f"{exc} [{exc.code}]")


class ActionCommand(BaseCommand):
    """A command of actions, `acthelm_x ACTION [options]`, each run by its method `do_ACTION(opts)`.

    `--json` goes before or after the action's name; with `person_option`, `--user` says who acts
    (`person_actor`). An `ActhelmError` prints as JSON under --json and exits as a CommandError.
    """

    requires_system_checks = CHECKS  # all but the URLconf's: core/commands.py
    person_option = False

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON")
        if self.person_option:
            parser.add_argument("--user", help="act as this person (default: $ACTHELM_USER)")
        actions = parser.add_subparsers(dest="action", required=True)
        self.add_actions(actions)
        # `acthelm_x list --json` as well as `acthelm_x --json list`.
        for action in actions.choices.values():
            action.add_argument(
                "--json", action="store_true", default=argparse.SUPPRESS, help="print JSON"
            )

    def add_actions(self, actions: Actions) -> None:
        """Add one parser per action: `actions.add_parser("list", help=...)`."""
        raise NotImplementedError(f"{type(self).__name__} declares no actions")

    def handle(self, *args: Any, **opts: Any) -> str | None:
        try:
            action: Callable[[Options], str | None] = getattr(self, "do_" + opts["action"])
            return action(opts)
        except ActhelmError as exc:
            fail(self, exc, as_json=opts["json"])
