"""Reads for the console: a task's notifications and the deliveries page."""

from typing import TypedDict

from django.db.models import Count

from tasks.notify.models import Notification, NotificationTarget
from tasks.notify.states import NotificationStatus

PAGE_SIZE = 100


class DeliveriesPage(TypedDict):
    targets: list[NotificationTarget]
    counts: list[tuple[str, int]]  # every status, with its rows
    rows: list[Notification]  # the newest PAGE_SIZE
    status: str  # the status shown, or "" for all


def task_notifications(task_id: int, limit: int = 50) -> list[Notification]:
    """What was sent where for one task, oldest first (the timeline's order)."""
    rows = list(Notification.objects.filter(task_id=task_id).order_by("-id")[:limit])
    return rows[::-1]


def deliveries_page(*, status: str = "") -> DeliveriesPage:
    """Targets with their state, counts by status, and the newest rows (optionally one status)."""
    rows = Notification.objects.select_related("task").order_by("-id")
    if status in NotificationStatus.values:
        rows = rows.filter(status=status)
    counts = dict(
        Notification.objects.order_by()
        .values("status")
        .annotate(n=Count("id"))
        .values_list("status", "n")
    )
    return {
        "targets": list(NotificationTarget.objects.order_by("name")),
        "counts": [(s, counts.get(s, 0)) for s in NotificationStatus.values],
        "rows": list(rows[:PAGE_SIZE]),
        "status": status if status in NotificationStatus.values else "",
    }
