"""Admin for notification targets (managed here or with `acthelm_notify`) and the outbox
(read-only: the event's transaction and delivery write it)."""

from typing import TYPE_CHECKING

from django.contrib import admin, messages
from django.db.models import QuerySet
from django.http import HttpRequest
from django.urls import reverse
from django.utils.html import format_html
from django.utils.safestring import SafeString

from core.exceptions import ActhelmError
from tasks.notify.models import Notification, NotificationTarget
from tasks.notify.targets import notifications_retry, target_test
from tasks.permissions import CHANGE_NOTIFICATION_TARGET

# ModelAdmin is generic in django-stubs only (django_stubs_ext.monkeypatch is not applied).
if TYPE_CHECKING:
    _TargetAdmin = admin.ModelAdmin[NotificationTarget]
    _NotificationAdmin = admin.ModelAdmin[Notification]
else:
    _TargetAdmin = _NotificationAdmin = admin.ModelAdmin


@admin.register(NotificationTarget)
class NotificationTargetAdmin(_TargetAdmin):
    list_display = [
        "name",
        "kind",
        "address",
        "events",
        "enabled",
        "state",
        "last_delivered_at",
        "last_error_code",
        "failed_in_a_row",
    ]
    list_filter = ["kind", "enabled"]
    readonly_fields = [
        "state",
        "last_delivered_at",
        "last_error_at",
        "last_error_code",
        "last_error",
        "failed_in_a_row",
    ]
    actions = ["send_test"]

    @admin.action(description="Send a test notification now")
    def send_test(self, request: HttpRequest, queryset: QuerySet[NotificationTarget]) -> None:
        for target in queryset:
            try:
                receipt = target_test(name=target.name)
            except ActhelmError as exc:
                self.message_user(request, f"{target.name}: {exc} [{exc.code}]", messages.ERROR)
            else:
                self.message_user(request, f"{target.name}: {receipt}", messages.SUCCESS)


@admin.register(Notification)
class NotificationAdmin(_NotificationAdmin):
    list_display = [
        "id",
        "created_at",
        "event_kind",
        "target_name",
        "task_link",
        "status",
        "attempts",
        "next_attempt_at",
        "last_error_code",
        "delivered_at",
    ]
    list_filter = ["status", "event_kind", "channel"]
    search_fields = ["target_name", "=task__id", "=idempotency_key"]
    list_select_related = ["task"]
    actions = ["retry"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Notification | None = None) -> bool:
        return False

    @admin.display(description="Task")
    def task_link(self, obj: Notification) -> str | SafeString:
        if obj.task_id is None:
            return "—"
        url = reverse("tasks:detail", args=[obj.task_id])
        return format_html('<a href="{}">#{}</a>', url, obj.task_id)

    @admin.action(description="Send failed notifications again", permissions=["retry"])
    def retry(self, request: HttpRequest, queryset: QuerySet[Notification]) -> None:
        count = notifications_retry(ids=list(queryset.values_list("pk", flat=True)))
        self.message_user(request, f"{count} notification(s) queued again.", messages.SUCCESS)

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return request.user.has_perm(CHANGE_NOTIFICATION_TARGET)
