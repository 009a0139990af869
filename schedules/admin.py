"""Schedules in the admin: saved, paused, resumed, run now and removed through the services (a
bad cron expression or time zone is refused with the service's message); slots are records."""

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest

from core.actors import Actor
from core.exceptions import ActhelmError
from schedules import services
from schedules.models import Schedule, ScheduleSlot

if TYPE_CHECKING:
    ScheduleAdminBase = admin.ModelAdmin[Schedule]
    SlotInlineBase = admin.TabularInline[ScheduleSlot, Schedule]
    ScheduleFormBase = forms.ModelForm[Schedule]
else:
    ScheduleAdminBase = admin.ModelAdmin
    SlotInlineBase = admin.TabularInline
    ScheduleFormBase = forms.ModelForm

#: The fields the admin's form saves through the services.
FORM_FIELDS = [
    "name",
    "target",
    "cron",
    "timezone",
    "title",
    "instruction",
    "goal",
    "connection",
    "model",
    "tools",
    "tool_policies",
    "allowed_domains",
    "tags",
    "limits",
    "acceptance_checks",
    "priority",
    "overlap",
    "catch_up",
    "ends_at",
]


class ScheduleForm(ScheduleFormBase):
    class Meta:
        model = Schedule
        fields = FORM_FIELDS

    def clean(self) -> dict[str, Any]:
        data = super().clean() or {}
        try:
            cleaned = services.clean_fields({k: v for k, v in data.items() if k in FORM_FIELDS})
        except ActhelmError as exc:
            field = exc.field if exc.field in self.fields else None
            self.add_error(field, exc.message)
            return data
        data.update(cleaned)
        return data


class SlotInline(SlotInlineBase):
    model = ScheduleSlot
    extra = 0
    can_delete = False
    fields = ["slot_at", "kind", "outcome", "reason", "detail", "count", "task", "goal"]
    readonly_fields = ["slot_at", "kind", "outcome", "reason", "detail", "count", "task", "goal"]
    ordering = ["-slot_at", "-id"]
    show_change_link = False

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False


def _actor(request: HttpRequest) -> Actor:
    return Actor.person(request.user)


@admin.register(Schedule)
class ScheduleAdmin(ScheduleAdminBase):
    form = ScheduleForm
    list_display = ["name", "cron", "timezone", "target", "paused", "next_slot_at", "last_slot_at"]
    list_filter = ["paused", "target", "overlap", "catch_up"]
    search_fields = ["name", "title"]
    raw_id_fields = ["goal", "connection", "model"]
    readonly_fields = ["next_slot_at", "last_slot_at", "paused", "created_by", "created_at"]
    inlines = [SlotInline]
    actions = ["pause", "resume", "run_now"]

    def save_model(self, request: HttpRequest, obj: Schedule, form: Any, change: bool) -> None:
        fields = {
            name: form.cleaned_data[name] for name in FORM_FIELDS if name in form.cleaned_data
        }
        if change:
            saved = services.schedule_update(
                actor=_actor(request), schedule_id=obj.pk, changes=fields
            )
        else:
            saved = services.schedule_create(actor=_actor(request), **fields)
        obj.pk = saved.pk
        obj.refresh_from_db()

    def delete_model(self, request: HttpRequest, obj: Schedule) -> None:
        services.schedule_delete(actor=_actor(request), schedule_id=obj.pk)

    def delete_queryset(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        for pk in queryset.values_list("pk", flat=True):
            services.schedule_delete(actor=_actor(request), schedule_id=pk)

    def _each(self, request: HttpRequest, queryset: QuerySet[Schedule], what: str) -> None:
        done = 0
        for pk in queryset.values_list("pk", flat=True):
            try:
                if what == "pause":
                    services.schedule_pause(actor=_actor(request), schedule_id=pk)
                elif what == "resume":
                    services.schedule_resume(actor=_actor(request), schedule_id=pk)
                else:
                    services.schedule_run_now(actor=_actor(request), schedule_id=pk)
                done += 1
            except ActhelmError as exc:
                self.message_user(request, f"schedule {pk}: {exc}", messages.ERROR)
        if done:
            self.message_user(request, f"{what.replace('_', ' ')}: {done} schedule(s)")

    @admin.action(description="Pause", permissions=["change"])
    def pause(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, "pause")

    @admin.action(description="Resume", permissions=["change"])
    def resume(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, "resume")

    @admin.action(description="Run now", permissions=["change"])
    def run_now(self, request: HttpRequest, queryset: QuerySet[Schedule]) -> None:
        self._each(request, queryset, "run_now")
