"""acthelm_prune --older-than DAYS [--yes] — remove the history of long-closed tasks.

A dry run by default: it prints what it would remove. See agents/engine/runtime/prune.py and
docs/operations-retention.md for what is removed and what is kept.
"""

import math
from argparse import ArgumentTypeError
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from agents.engine.runtime.prune import DEFAULT_BATCH_SIZE, prune
from console.cli import emit
from core.commands import CHECKS

# A hundred years: any older date is a typo, and past ~2.7 million days the cutoff itself
# cannot be computed.
MAX_DAYS = 36_500
MAX_BATCH_SIZE = 100_000


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        raise ArgumentTypeError(f"a number of days, not {value!r}") from None
    if not math.isfinite(days):
        raise ArgumentTypeError(f"a finite number of days, not {value!r}")
    if not 0 <= days <= MAX_DAYS:
        raise ArgumentTypeError(f"must be between 0 and {MAX_DAYS} days")
    return days


def _batch_size(value: str) -> int:
    try:
        size = int(value)
    except ValueError:
        raise ArgumentTypeError(f"a whole number, not {value!r}") from None
    if not 1 <= size <= MAX_BATCH_SIZE:
        raise ArgumentTypeError(f"must be between 1 and {MAX_BATCH_SIZE}")
    return size


class Command(BaseCommand):
    requires_system_checks = CHECKS  # all but the URLconf's: core/commands.py
    help = (
        "Remove transcripts, events, artifacts and memory selections of done/cancelled tasks "
        "last updated more than DAYS ago (dry run unless --yes)."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--older-than", type=_days, required=True, metavar="DAYS")
        parser.add_argument("--yes", action="store_true", help="remove (default: dry run)")
        parser.add_argument("--batch-size", type=_batch_size, default=DEFAULT_BATCH_SIZE)
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args: Any, **opts: Any) -> None:
        if opts["batch_size"] < 1:
            raise CommandError("--batch-size must be positive")
        report = prune(
            older_than_days=opts["older_than"],
            dry_run=not opts["yes"],
            batch_size=opts["batch_size"],
        )
        emit(self, report.as_dict(), as_json=opts["json"], text=report.summary())
