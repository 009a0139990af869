"""Times as a person reads them: the exact time beside the relative one, everywhere a page
says "N minutes ago", so a screenshot or a printed page still says when."""

from datetime import datetime
from decimal import Decimal

from django import template
from django.utils import timezone
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.timesince import timesince, timeuntil

from console.views.tasks import money

register = template.Library()


def exact(value: datetime) -> str:
    """To the minute, in the console's time zone, named: "2026-12-03 14:05 UTC"."""
    local = timezone.localtime(value) if timezone.is_aware(value) else value
    return f"{local:%Y-%m-%d %H:%M} {local.tzname() or ''}".rstrip()


def relative(value: datetime, now: datetime | None = None) -> str:
    """ "12 seconds ago", "2 minutes ago", "in 5 minutes": never "0 minutes ago"."""
    now = now or timezone.now()
    seconds = (now - value).total_seconds()
    if abs(seconds) < 60:
        whole = int(abs(seconds))
        if whole < 1:
            return "just now"
        text = f"{whole} second" if whole == 1 else f"{whole} seconds"
        return f"{text} ago" if seconds >= 0 else f"in {text}"
    # Django joins the number and the unit with a no-break space; the exact time beside it
    # uses plain spaces, and so does this.
    if seconds > 0:
        return f"{timesince(value, now, depth=1)} ago".replace("\xa0", " ")
    return f"in {timeuntil(value, now, depth=1)}".replace("\xa0", " ")


@register.filter
def when(value: datetime | None) -> SafeString | str:
    """`<time>` with the exact time and the relative one: "2026-12-03 14:05 UTC · 2 minutes
    ago"; the title has the seconds, the datetime attribute the ISO form."""
    if not isinstance(value, datetime):
        return "—"
    return format_html(
        '<time datetime="{}" title="{}">{} · {}</time>',
        value.isoformat(),
        f"{timezone.localtime(value):%Y-%m-%d %H:%M:%S %Z}"
        if timezone.is_aware(value)
        else value.isoformat(),
        exact(value),
        relative(value),
    )


@register.filter
def exact_time(value: datetime | None) -> SafeString | str:
    """`<time>` with the exact time only (a run's start and end, where the age is noise)."""
    if not isinstance(value, datetime):
        return "—"
    return format_html('<time datetime="{}">{}</time>', value.isoformat(), exact(value))


@register.filter
def seconds(value: float | int | Decimal | None) -> str:
    """A duration: "0.4 s", "42 s", "3 min 5 s", "2 h 10 min"."""
    if value is None:
        return "—"
    total = float(value)
    if total < 10:
        return f"{total:.1f} s"
    whole = round(total)
    if whole < 60:
        return f"{whole} s"
    minutes, secs = divmod(whole, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes} min" if minutes else f"{hours} h"


@register.filter
def usd(value: Decimal | None) -> str:
    """An amount in US dollars (`console.views.tasks.money`); "unknown" without a price."""
    return "unknown" if value is None else money(value)


@register.filter
def from_now(value: datetime | None) -> str:
    """How long until `value`: "in 30 seconds", "in 4 minutes" — never "in 0 minutes" (Django's
    `timeuntil` for anything under a minute); "due now" once it has passed."""
    if not isinstance(value, datetime):
        return ""
    if value <= timezone.now():
        return "due now"
    return relative(value)
