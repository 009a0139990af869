"""Notification targets and the outbox. Imported by `tasks.models`, so both belong to `tasks`."""

import uuid

from django.contrib.postgres.fields import ArrayField
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q

from core.credentials import credential_refusal
from tasks.notify import slack  # noqa: F401 - registers the Slack channel
from tasks.notify.channels import channel_choices, find_channel
from tasks.notify.states import NotificationStatus, NotifyEvent, all_events


class NotificationTarget(models.Model):
    """Where notifications go. A webhook's secret is the *name* of an environment variable."""

    name = models.CharField(max_length=100, unique=True)
    kind = models.CharField(max_length=16, choices=channel_choices)
    address = models.CharField(
        max_length=2000, help_text="An email address, or the webhook's http(s) URL."
    )
    secret_env = models.CharField(
        max_length=100,
        blank=True,
        help_text="Webhooks: name of the environment variable holding the signing secret "
        "(never the secret itself). Empty: the body is not signed. Slack: the name of the "
        "Slack app's signing secret, which checks its interactivity requests.",
    )
    token_env = models.CharField(
        max_length=100,
        blank=True,
        help_text="Slack: name of the environment variable holding the bot token (xoxb-…) "
        "that posts the messages (never the token itself).",
    )
    events = ArrayField(
        models.CharField(max_length=32, choices=NotifyEvent.choices), default=all_events
    )
    enabled = models.BooleanField(default=True)
    created_at = models.DateTimeField(auto_now_add=True)

    # The target's state, written by delivery.
    last_delivered_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_error_code = models.CharField(max_length=64, blank=True, editable=False)
    last_error = models.TextField(blank=True, editable=False)
    # Notifications that failed for good since the last delivery.
    failed_in_a_row = models.PositiveIntegerField(default=0, editable=False)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"{self.name} ({self.kind})"

    @property
    def state(self) -> str:
        if not self.enabled:
            return "disabled"
        if self.failed_in_a_row:
            return "failing"
        if self.last_error_at and (
            self.last_delivered_at is None or self.last_error_at > self.last_delivered_at
        ):
            return "retrying"
        return "ok" if self.last_delivered_at else "new"

    @property
    def shown_address(self) -> str:
        """The address for pages and lists, as the target's channel shows it (a webhook only
        its scheme and host); the admin shows the whole address."""
        channel = find_channel(self.kind)
        return channel.shown_address(self.address) if channel else self.address

    def clean(self) -> None:
        errors = {}
        channel = find_channel(self.kind)  # an unknown kind: the field's choices refuse it
        if channel is not None:
            if problem := channel.address_problem(self.address):
                errors["address"] = problem
            if self.secret_env and not channel.signed:
                errors["secret_env"] = "only webhooks and Slack name a signing secret"
            if self.token_env and not channel.needs_token:
                errors["token_env"] = "only Slack targets name a bot token"
            for field, problem in channel.credential_problems(self).items():
                errors.setdefault(field, problem)
        # The one rule of every credential: its name, and where it would go (the webhook's host,
        # Slack's API, among the operator's ACTHELM_CREDENTIAL_DESTINATIONS for it).
        destination = channel.credential_destination(self.address) if channel else self.address
        for field in ("secret_env", "token_env"):
            refusal = credential_refusal(getattr(self, field), destination)
            if refusal and field not in errors:
                errors[field] = str(refusal)
        unknown = [e for e in self.events or [] if e not in NotifyEvent.values]
        if unknown or not self.events:
            errors["events"] = f"choose events among {', '.join(NotifyEvent.values)}"
        if errors:
            raise ValidationError(errors)


class Notification(models.Model):
    """One outbox row: one event for one target, written in the transaction of the event.

    Delivery is at-least-once; `idempotency_key` is sent with every attempt so receivers can drop
    a repeat."""

    idempotency_key = models.UUIDField(default=uuid.uuid4, unique=True, editable=False)
    target = models.ForeignKey(
        NotificationTarget,
        null=True,
        on_delete=models.SET_NULL,
        related_name="notifications",
    )
    target_name = models.CharField(max_length=100)
    channel = models.CharField(max_length=16, choices=channel_choices)
    # Indexed by notification_task_idx (task, id).
    task = models.ForeignKey(
        "tasks.Task",
        null=True,
        on_delete=models.CASCADE,
        related_name="notifications",
        db_index=False,
    )
    # Indexed by notification_event_target_unique (event, target, part).
    event = models.ForeignKey(
        "tasks.TaskEvent",
        null=True,
        on_delete=models.SET_NULL,
        related_name="notifications",
        db_index=False,
    )
    event_kind = models.CharField(max_length=32, choices=NotifyEvent.choices)
    # Which of the event's messages for the target: a channel that posts one message per open
    # decision (Slack) writes one row for each, numbered from 0.
    part = models.PositiveSmallIntegerField(default=0)
    subject = models.CharField(max_length=300)
    text = models.TextField()
    url = models.CharField(max_length=2000)
    payload = models.JSONField()

    status = models.CharField(
        max_length=16, choices=NotificationStatus.choices, default=NotificationStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_index=False)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    last_error_code = models.CharField(max_length=64, blank=True)
    last_error = models.TextField(blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-id"]
        indexes = [
            # deliver_due(): the due pending rows, oldest first.
            models.Index(
                fields=["next_attempt_at", "id"],
                name="notification_due_idx",
                condition=Q(status=NotificationStatus.PENDING),
            ),
            models.Index(fields=["task", "id"], name="notification_task_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=NotificationStatus.values), name="notification_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status=NotificationStatus.DELIVERED) | Q(delivered_at__isnull=False),
                name="notification_delivered_has_time",
            ),
            models.UniqueConstraint(
                fields=["event", "target", "part"], name="notification_event_target_unique"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_kind} → {self.target_name} ({self.status})"
