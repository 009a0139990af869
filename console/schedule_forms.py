"""The console's new-schedule form: text as a person types it, turned into the service's
arguments. The service checks every value (the cron expression, the time zone, the tools) and
its refusals are shown on their fields."""

from datetime import datetime
from typing import Any

from django import forms
from django.conf import settings

from schedules.states import CatchUpPolicy, OverlapPolicy, ScheduleTarget


def _words(text: str) -> list[str]:
    return [w.strip() for w in text.replace("\n", ",").split(",") if w.strip()]


class ScheduleCreateForm(forms.Form):
    name = forms.CharField(max_length=100)
    cron = forms.CharField(
        max_length=100,
        label="Cron expression",
        help_text="minute hour day-of-month month day-of-week, e.g. 0 8 * * 1-5",
    )
    timezone = forms.CharField(
        max_length=64, initial=settings.TIME_ZONE, help_text="an IANA name, e.g. Europe/Berlin"
    )
    target = forms.ChoiceField(choices=ScheduleTarget.choices, initial=ScheduleTarget.TASK)
    title = forms.CharField(max_length=160, help_text="each task is called this, with its time")
    instruction = forms.CharField(widget=forms.Textarea(attrs={"rows": 4}))
    connection = forms.CharField(required=False, help_text="blank: the default connection")
    model = forms.CharField(required=False, help_text="blank: the connection's first model")
    tools = forms.CharField(required=False, help_text="comma-separated; blank: the default tools")
    tags = forms.CharField(required=False, help_text="comma-separated")
    overlap = forms.ChoiceField(choices=OverlapPolicy.choices, initial=OverlapPolicy.SKIP)
    catch_up = forms.ChoiceField(choices=CatchUpPolicy.choices, initial=CatchUpPolicy.LATEST)
    ends_at = forms.CharField(
        required=False,
        label="Ends at",
        help_text="YYYY-MM-DD HH:MM in the schedule's time zone; blank: never",
    )

    def service_kwargs(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "name": data["name"],
            "cron": data["cron"],
            "timezone": data["timezone"],
            "target": data["target"],
            "title": data["title"],
            "instruction": data["instruction"],
            "connection": data["connection"] or None,
            "model": data["model"] or None,
            "tools": _words(data["tools"]) or None,
            "tags": _words(data["tags"]),
            "overlap": data["overlap"],
            "catch_up": data["catch_up"],
        }

    def ends_at_naive(self) -> datetime | None:
        """The end as typed (a wall-clock time of the schedule's zone), or None."""
        text = (self.cleaned_data.get("ends_at") or "").strip()
        if not text:
            return None
        try:
            return datetime.strptime(text, "%Y-%m-%d %H:%M")
        except ValueError:
            self.add_error("ends_at", "write the end as YYYY-MM-DD HH:MM")
            raise
