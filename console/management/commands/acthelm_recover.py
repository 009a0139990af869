"""One pass of stale-run recovery (every worker also runs it periodically)."""

import json
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agents.engine.runtime.recovery import recover_stale
from core.commands import CHECKS


class Command(BaseCommand):
    requires_system_checks = CHECKS  # all but the URLconf's: core/commands.py
    help = "Fail runs whose lease expired (or that overran), requeue their task once."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true")

    def handle(self, *args: Any, **opts: Any) -> None:
        recovered = recover_stale()
        if opts["json"]:
            self.stdout.write(json.dumps({"recovered": recovered}))
        else:
            self.stdout.write(f"recovered {len(recovered)} task(s): {recovered}")
