"""Times as a person reads them (console.templatetags.console_time): the exact time beside the
relative one, never "0 minutes ago"."""

from datetime import UTC, datetime, timedelta

import pytest
from django.template import Context, Template

from console.templatetags.console_time import exact, relative, seconds

NOW = datetime(2026, 12, 3, 14, 7, 30, tzinfo=UTC)


@pytest.mark.parametrize(
    ("ago", "text"),
    [
        (timedelta(0), "just now"),
        (timedelta(seconds=1), "1 second ago"),
        (timedelta(seconds=12), "12 seconds ago"),
        (timedelta(minutes=2, seconds=5), "2 minutes ago"),
        (timedelta(hours=3, minutes=4), "3 hours ago"),
        (-timedelta(minutes=5), "in 5 minutes"),
        (-timedelta(seconds=30), "in 30 seconds"),
    ],
)
def test_relative_never_says_zero_minutes(ago, text):
    assert relative(NOW - ago, NOW) == text


def test_the_filter_shows_the_exact_time_beside_the_relative_one():
    value = datetime(2026, 12, 3, 14, 5, 9, tzinfo=UTC)
    assert exact(value) == "2026-12-03 14:05 UTC"
    html = Template("{% load console_time %}{{ value|when }}").render(Context({"value": value}))
    assert html.startswith('<time datetime="2026-12-03T14:05:09+00:00"')
    assert 'title="2026-12-03 14:05:09 UTC"' in html
    assert ">2026-12-03 14:05 UTC · " in html and " ago</time>" in html
    assert Template("{% load console_time %}{{ v|when }}").render(Context({"v": None})) == "—"


@pytest.mark.parametrize(
    ("value", "text"),
    [(None, "—"), (0.42, "0.4 s"), (42, "42 s"), (185, "3 min 5 s"), (7800, "2 h 10 min")],
)
def test_durations(value, text):
    assert seconds(value) == text
