"""acthelm_reconcile — one pass of the reconciler: promote unblocked tasks, plan idle goals."""

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from agents.engine.runtime.reconciler import reconcile
from console.cli import emit
from core.commands import CHECKS


class Command(BaseCommand):
    requires_system_checks = CHECKS  # all but the URLconf's: core/commands.py
    help = "Run one reconciler pass (safe to run while workers reconcile too)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **opts: Any) -> None:
        report = reconcile()
        emit(self, report.as_dict(), as_json=opts["json"], text=report.summary())
