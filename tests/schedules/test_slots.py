"""Slot computation with a frozen clock: daylight saving in two zones, the end date, a long
downtime, bad input."""

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from core.exceptions import InvalidInput
from schedules import slots

BERLIN = ZoneInfo("Europe/Berlin")
NEW_YORK = ZoneInfo("America/New_York")


def runs_between(expr, tz, start, end):
    out, slot = [], slots.first_at_or_after(expr, tz, start)
    while slot is not None and slot < end:
        out.append(slot)
        slot = slots.next_after(expr, tz, slot)
    return out


@pytest.mark.parametrize(
    ("tz", "day"),
    [(BERLIN, datetime(2026, 3, 29)), (NEW_YORK, datetime(2026, 3, 8))],
)
def test_a_0230_schedule_runs_once_on_the_day_the_clocks_skip(tz, day):
    start = day.replace(tzinfo=tz)
    runs = runs_between("30 2 * * *", tz, start, start + timedelta(days=1))
    assert len(runs) == 1
    # 02:30 does not exist: it runs at the first minute after the change, 03:00 local.
    assert runs[0].astimezone(tz).strftime("%H:%M") == "03:00"
    before = runs_between("30 2 * * *", tz, start - timedelta(days=1), start)
    after = runs_between("30 2 * * *", tz, start + timedelta(days=1), start + timedelta(days=2))
    assert len(before) == len(after) == 1


@pytest.mark.parametrize(
    ("tz", "day"),
    [(BERLIN, datetime(2026, 10, 25)), (NEW_YORK, datetime(2026, 11, 1))],
)
def test_a_0130_or_0230_schedule_runs_once_on_the_day_the_clocks_fall_back(tz, day):
    start = day.replace(tzinfo=tz)
    # The hour that repeats: 02:xx in Berlin, 01:xx in New York.
    hour = 2 if tz is BERLIN else 1
    runs = runs_between(f"30 {hour} * * *", tz, start, start + timedelta(days=1))
    assert len(runs) == 1
    local = runs[0].astimezone(tz)
    assert local.strftime("%H:%M") == f"{hour:02d}:30"
    # Its first occurrence, still on summer time.
    assert local.utcoffset() == timedelta(hours=2 if tz is BERLIN else -4)


def test_slots_strictly_increase_through_both_changes():
    start = datetime(2026, 3, 28, tzinfo=BERLIN)
    for expr in ("*/15 * * * *", "0 * * * *", "0,30 2,3 * * *"):
        runs = runs_between(expr, BERLIN, start, start + timedelta(days=212))
        utc = [r.astimezone(UTC) for r in runs]
        assert utc == sorted(set(utc)), expr


def test_next_after_a_slot_inside_the_repeated_hour_moves_forward():
    # 02:10 CET, the second time the clock shows 02:10 in Berlin on 2026-10-25.
    second = datetime(2026, 10, 25, 2, 10, tzinfo=BERLIN).replace(fold=1)
    nxt = slots.next_after("30 2 * * *", BERLIN, second)
    assert nxt is not None and nxt > second
    assert nxt.astimezone(BERLIN).date().isoformat() == "2026-10-26"


def test_due_latest_and_the_number_missed():
    first = datetime(2026, 12, 1, 8, tzinfo=UTC)
    now = datetime(2026, 12, 5, 9, tzinfo=UTC)
    due = slots.due("0 8 * * *", UTC, first=first, now=now, ends_at=None)
    assert due is not None
    assert due.latest == datetime(2026, 12, 5, 8, tzinfo=UTC)
    assert due.earlier == 4
    assert due.following == datetime(2026, 12, 6, 8, tzinfo=UTC)


def test_due_stops_at_the_end_date_and_then_there_is_none():
    first = datetime(2026, 12, 1, 8, tzinfo=UTC)
    ends = datetime(2026, 12, 2, 12, tzinfo=UTC)
    due = slots.due(
        "0 8 * * *", UTC, first=first, now=datetime(2026, 12, 9, tzinfo=UTC), ends_at=ends
    )
    assert due is not None
    assert due.latest == datetime(2026, 12, 2, 8, tzinfo=UTC)
    assert due.following is None


def test_nothing_is_due_before_the_first_slot_even_when_the_clock_went_back():
    first = datetime(2026, 12, 5, 8, tzinfo=UTC)
    assert (
        slots.due("0 8 * * *", UTC, first=first, now=first - timedelta(hours=3), ends_at=None)
        is None
    )


def test_a_long_downtime_of_a_frequent_schedule_jumps_to_the_latest_slot():
    first = datetime(2026, 1, 1, tzinfo=UTC)
    now = datetime(2026, 3, 1, 12, 7, 30, tzinfo=UTC)
    due = slots.due("* * * * *", UTC, first=first, now=now, ends_at=None)
    assert due is not None
    assert due.latest == datetime(2026, 3, 1, 12, 7, tzinfo=UTC)
    assert due.earlier > slots.MAX_DUE
    assert due.following == datetime(2026, 3, 1, 12, 8, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "needs a cron expression"),
        ("61 * * * *", "invalid cron expression"),
        ("0 8 * *", "five fields"),
        ("0 0 8 * * *", "five fields"),
        ("0 0 30 2 *", "invalid cron expression"),
        ("@fortnightly", "unknown cron alias"),
        ("x" * 101, "at most 100"),
    ],
)
def test_a_bad_expression_is_refused_with_a_clear_message(text, message):
    with pytest.raises(InvalidInput) as err:
        slots.expression(text)
    assert message in err.value.message
    assert err.value.field == "cron"


def test_aliases_and_spacing_are_accepted():
    assert slots.expression("@daily") == "0 0 * * *"
    assert slots.expression("  0   8 * *  1-5 ") == "0 8 * * 1-5"


@pytest.mark.parametrize("name", ["Mars/Olympus", "", "../../etc/passwd", "europe/berlin"])
def test_a_bad_time_zone_is_refused(name):
    with pytest.raises(InvalidInput) as err:
        slots.zone(name)
    assert err.value.field == "timezone"
    assert "IANA" in err.value.message
