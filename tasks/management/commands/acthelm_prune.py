"""acthelm_prune --older-than DAYS [--yes] — remove the history of long-closed tasks.

A dry run by default: it prints what it would remove. See tasks/prune.py and
docs/operations-retention.md for what is removed and what is kept.
"""

from argparse import ArgumentTypeError

from django.core.management.base import BaseCommand, CommandError

from tasks.cli import emit
from tasks.prune import DEFAULT_BATCH_SIZE, prune


def _days(value: str) -> float:
    try:
        days = float(value)
    except ValueError:
        raise ArgumentTypeError(f"a number of days, not {value!r}") from None
    if days < 0:
        raise ArgumentTypeError("must not be negative")
    return days


class Command(BaseCommand):
    help = (
        "Remove transcripts, events, artifacts and memory selections of done/cancelled tasks "
        "last updated more than DAYS ago (dry run unless --yes)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--older-than", type=_days, required=True, metavar="DAYS")
        parser.add_argument("--yes", action="store_true", help="remove (default: dry run)")
        parser.add_argument("--batch-size", type=int, default=DEFAULT_BATCH_SIZE)
        parser.add_argument("--json", action="store_true", help="print JSON")

    def handle(self, *args, **opts):
        if opts["batch_size"] < 1:
            raise CommandError("--batch-size must be positive")
        report = prune(
            older_than_days=opts["older_than"],
            dry_run=not opts["yes"],
            batch_size=opts["batch_size"],
        )
        emit(self, report.as_dict(), as_json=opts["json"], text=report.summary())
