"""Values of the notification outbox."""

from enum import StrEnum

from django.db import models


class NotifyEvent(models.TextChoices):
    """What a target can subscribe to: a task entering a state that waits for a person, and a
    connection starting a cooldown."""

    AWAITING_APPROVAL = "awaiting_approval", "Task awaits an approval"
    NEEDS_REVIEW = "needs_review", "Task needs a decision on an operation"
    REVIEW = "review", "Task waits for review"
    FAILED = "failed", "Task failed"
    COOLDOWN = "cooldown", "Connection started a cooldown"


class TargetKind(StrEnum):
    """The shipped channels' kinds, for code that names one. The fields' choices are the
    registered channels (`tasks.notify.channels.channel_choices`), so a new channel adds no
    member here and no migration."""

    EMAIL = "email"
    WEBHOOK = "webhook"
    SLACK = "slack"


class NotificationStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    DELIVERED = "delivered", "Delivered"
    FAILED = "failed", "Failed"


def all_events() -> list[str]:
    return list(NotifyEvent.values)
