"""Targets: add, list, test, remove. The admin and `acthelm_notify` call these."""

import uuid
from typing import TypedDict

from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from core.exceptions import ActhelmError, ErrorCode, InvalidInput
from tasks.notify.channels import DeliveryCode, DeliveryFailed, Message, send
from tasks.notify.models import Notification, NotificationTarget
from tasks.notify.outbox import console_url
from tasks.notify.states import NotificationStatus, NotifyEvent


class TargetNotFound(ActhelmError, LookupError):
    error = ErrorCode.TARGET_NOT_FOUND


def _invalid(exc: ValidationError) -> InvalidInput:
    fields = getattr(exc, "message_dict", {"__all__": exc.messages})
    text = "; ".join(f"{name}: {' '.join(msgs)}" for name, msgs in fields.items())
    return InvalidInput(text, code=ErrorCode.INVALID_TARGET)


def target_add(
    *,
    name: str,
    kind: str,
    address: str,
    secret_env: str = "",
    token_env: str = "",
    events: list[str] | None = None,
) -> NotificationTarget:
    target = NotificationTarget(
        name=name.strip(),
        kind=kind,
        address=address.strip(),
        secret_env=secret_env.strip(),
        token_env=token_env.strip(),
        events=list(events) if events else list(NotifyEvent.values),
    )
    try:
        target.full_clean()
    except ValidationError as exc:
        raise _invalid(exc) from None
    target.save()
    return target


def target_get(name: str) -> NotificationTarget:
    try:
        return NotificationTarget.objects.get(name=name)
    except NotificationTarget.DoesNotExist:
        raise TargetNotFound(f"no notification target named {name!r}") from None


def target_remove(*, name: str) -> int:
    """Remove a target; its pending notifications are marked failed (target_removed).
    Returns how many were pending."""
    with transaction.atomic():
        target = NotificationTarget.objects.select_for_update().filter(name=name).first()
        if target is None:
            raise TargetNotFound(f"no notification target named {name!r}")
        dropped = Notification.objects.filter(
            target=target, status=NotificationStatus.PENDING
        ).update(
            status=NotificationStatus.FAILED,
            last_error_code=DeliveryCode.TARGET_REMOVED,
            last_error="the target was removed",
        )
        target.delete()
    return dropped


class TargetSummary(TypedDict):
    """A target as the CLI and the API show it (the address as `shown_address` shows it)."""

    name: str
    kind: str
    address: str
    secret_env: str
    token_env: str
    events: list[str]
    enabled: bool
    state: str
    last_delivered_at: str | None
    last_error_at: str | None
    last_error_code: str
    last_error: str
    failed_in_a_row: int


def target_summary(target: NotificationTarget) -> TargetSummary:
    return {
        "name": target.name,
        "kind": target.kind,
        "address": target.shown_address,
        "secret_env": target.secret_env,
        "token_env": target.token_env,
        "events": list(target.events),
        "enabled": target.enabled,
        "state": target.state,
        "last_delivered_at": target.last_delivered_at.isoformat()
        if target.last_delivered_at
        else None,
        "last_error_at": target.last_error_at.isoformat() if target.last_error_at else None,
        "last_error_code": target.last_error_code,
        "last_error": target.last_error,
        "failed_in_a_row": target.failed_in_a_row,
    }


def sample_message() -> Message:
    url = console_url("/")
    text = f"This is a test notification from Acthelm; real ones link to the task: {url}"
    return Message(
        idempotency_key=str(uuid.uuid4()),
        event_kind="test",
        subject="Acthelm test notification",
        text=text,
        url=url,
        payload={
            "event": "test",
            "occurred_at": timezone.now().isoformat(),
            "subject": "Acthelm test notification",
            "text": text,
            "url": url,
        },
    )


def target_test(*, name: str) -> str:
    """Send a sample through the target's real channel now (not through the outbox).
    Returns the receipt; raises DeliveryFailed with the channel's code."""
    target = target_get(name)
    return send(target, sample_message())


__all__ = [
    "DeliveryFailed",
    "TargetNotFound",
    "target_add",
    "target_get",
    "target_remove",
    "target_summary",
    "target_test",
]


def notifications_retry(*, ids: list[int]) -> int:
    """Queue failed notifications again (after the target was fixed): fresh attempts, due now."""
    return Notification.objects.filter(pk__in=ids, status=NotificationStatus.FAILED).update(
        status=NotificationStatus.PENDING, attempts=0, next_attempt_at=timezone.now()
    )
