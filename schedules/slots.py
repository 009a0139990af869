"""When a schedule's slots fall: pure functions over a cron expression and a time zone, with no
database. The expression is parsed and iterated by cronsim, which handles daylight saving as
Debian's cron does: a job at a fixed time in the hour the clocks skip runs once, at the first
minute after the change (02:30 → 03:00 on the spring-forward day); a fixed time the clocks pass
twice runs once, at its first occurrence; a job of every minute or hour runs in every real one.
Slots are instants (aware datetimes); each is strictly after the one before."""

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cache
from zoneinfo import ZoneInfo, available_timezones

from cronsim import CronSim, CronSimError

from core.exceptions import InvalidInput

#: The longest expression a schedule stores.
MAX_EXPRESSION = 100
#: How many slots a pass looks at, at most, before it jumps to the latest due one.
MAX_DUE = 1000
# Names a person may write for the usual expressions (cronsim reads only the five fields).
ALIASES = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
# Iterations to get past the start when it lies in a repeated hour (a fixed-time job is
# iterated on the wall clock, so its first candidates may lie before the start).
_PAST_START = 4000


@cache
def _zones() -> frozenset[str]:
    return frozenset(available_timezones())


def zone(name: str) -> ZoneInfo:
    """The IANA time zone ``name``, refused with a clear error (field ``timezone``)."""
    name = (name or "").strip()
    if name not in _zones():
        raise InvalidInput(
            f"unknown time zone {name!r}: use an IANA name such as Europe/Berlin, "
            "America/New_York or UTC",
            field="timezone",
        )
    return ZoneInfo(name)


def expression(text: str) -> str:
    """The five-field expression ``text`` stands for (an alias resolved), refused with a clear
    error (field ``cron``) when it cannot be parsed or would never run."""
    text = " ".join((text or "").split())
    if not text:
        raise InvalidInput("a schedule needs a cron expression, e.g. 0 8 * * 1-5", field="cron")
    if len(text) > MAX_EXPRESSION:
        raise InvalidInput(
            f"a cron expression is at most {MAX_EXPRESSION} characters", field="cron"
        )
    expr = ALIASES.get(text.lower(), text)
    if expr.startswith("@"):
        raise InvalidInput(
            f"unknown cron alias {text!r} (known: {', '.join(ALIASES)})", field="cron"
        )
    if len(expr.split()) != 5:
        raise InvalidInput(
            f"a cron expression has five fields (minute hour day-of-month month "
            f"day-of-week), not {len(expr.split())}: {text!r}",
            field="cron",
        )
    try:
        it = CronSim(expr, datetime(2000, 1, 1, tzinfo=UTC))
        next(it)
    except CronSimError as exc:
        raise InvalidInput(f"invalid cron expression {text!r}: {exc}", field="cron") from None
    except StopIteration:
        raise InvalidInput(f"the cron expression {text!r} never runs", field="cron") from None
    return expr


def describe(expr: str) -> str:
    """The expression in words ("At 08:00 on Monday through Friday"), or the expression."""
    try:
        return CronSim(expression(expr), datetime(2000, 1, 1, tzinfo=UTC)).explain()
    except (InvalidInput, CronSimError, ValueError, KeyError, IndexError):
        return expr


def next_after(expr: str, tz: ZoneInfo, after: datetime) -> datetime | None:
    """The first slot strictly after the instant ``after``, in UTC (None: there is none)."""
    # In UTC: two datetimes of one zone compare by their wall clocks, whatever their fold.
    after = after.astimezone(UTC)
    it = CronSim(expr, after.astimezone(tz))
    for _ in range(_PAST_START):
        try:
            slot = next(it).astimezone(UTC)
        except StopIteration:
            return None
        if slot > after:
            return slot
    return None


def first_at_or_after(expr: str, tz: ZoneInfo, start: datetime) -> datetime | None:
    """The first slot at or after ``start``."""
    return next_after(expr, tz, start - timedelta(microseconds=1))


@dataclass(frozen=True)
class Due:
    """The slots of one schedule that are due: from its next slot to now (and its end)."""

    latest: datetime  # the latest due slot
    earlier: int  # how many due slots came before it
    first: datetime  # the first due slot (``latest`` when ``earlier`` is 0)
    following: datetime | None  # the first slot after ``latest`` (None: the schedule ended)


def due(
    expr: str, tz: ZoneInfo, *, first: datetime, now: datetime, ends_at: datetime | None
) -> Due | None:
    """What is due at ``now`` of a schedule whose first undecided slot is ``first``: None when
    nothing is (``first`` is later than now or than the end). Looks at MAX_DUE slots at most;
    past them (a long downtime of a frequent schedule) the latest due one is found by
    iterating back from now, and ``earlier`` counts at least MAX_DUE."""
    horizon = now if ends_at is None else min(now, ends_at)
    if first > horizon:
        return None
    latest, earlier = first, 0
    while True:
        following = next_after(expr, tz, latest)
        if following is None or following > horizon:
            break
        if earlier >= MAX_DUE:
            latest = _latest_at_or_before(expr, tz, horizon, floor=following)
            following = next_after(expr, tz, latest)
            earlier += 1
            break
        latest, earlier = following, earlier + 1
    if following is not None and ends_at is not None and following > ends_at:
        following = None
    return Due(latest=latest, earlier=earlier, first=first, following=following)


def _latest_at_or_before(
    expr: str, tz: ZoneInfo, horizon: datetime, *, floor: datetime
) -> datetime:
    """The latest slot at or before ``horizon`` and not before ``floor`` (which is a slot)."""
    it = CronSim(expr, (horizon + timedelta(seconds=1)).astimezone(tz), reverse=True)
    for _ in range(_PAST_START):
        try:
            slot = next(it).astimezone(UTC)
        except StopIteration:
            break
        if slot < floor:
            break
        # A forward slot (the reverse walk places a skipped hour's slot differently).
        if slot <= horizon and first_at_or_after(expr, tz, slot) == slot:
            return slot
    return floor


def upcoming(
    expr: str, tz: ZoneInfo, *, start: datetime | None, count: int, ends_at: datetime | None
) -> list[datetime]:
    """The next ``count`` slots from ``start`` (itself included), in the schedule's zone."""
    out: list[datetime] = []
    slot = start
    while slot is not None and len(out) < count:
        if ends_at is not None and slot > ends_at:
            break
        out.append(slot.astimezone(tz))
        slot = next_after(expr, tz, slot)
    return out
