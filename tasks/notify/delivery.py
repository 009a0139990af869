"""Delivering the outbox: claim one due row → commit → send → record the result.

A claim is one UPDATE over a `FOR UPDATE SKIP LOCKED` pick: it counts the attempt and pushes
`next_attempt_at` past the send's timeout, so no other worker picks the row while it is being
sent, and a worker that dies mid-send leaves it due again (at-least-once). No transaction is open
during the SMTP or HTTP call. The result is recorded only by the attempt that claimed it.
"""

import logging
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import NotRequired, TypedDict

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone

from core.dbpool import release_connection
from tasks.notify.channels import DeliveryFailed, Message, send
from tasks.notify.models import Notification, NotificationTarget
from tasks.notify.states import NotificationStatus

log = logging.getLogger("acthelm.notify")

_CLAIM_SQL = f"""
WITH due AS (
    SELECT n.id FROM tasks_notification n
    WHERE n.status = '{NotificationStatus.PENDING.value}' AND n.next_attempt_at <= now()
      AND (n.target_id IS NULL OR NOT n.target_id = ANY(%s::bigint[]))
    ORDER BY n.next_attempt_at, n.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
)
UPDATE tasks_notification n
SET attempts = n.attempts + 1,
    last_attempt_at = now(),
    next_attempt_at = now() + make_interval(secs => %s)
FROM due
WHERE n.id = due.id
RETURNING n.id, n.attempts
"""
"""Claim the oldest due row no other worker is sending, skipping targets that already failed in
this pass. Invariant: a row is sent by at most one worker until its claim lease runs out."""


class DeliveryResult(TypedDict):
    """One row's send, for the pass's report and the log (a row deleted meanwhile: "gone",
    with its id only)."""

    id: int
    status: str
    code: str
    error: str
    target: NotRequired[str]
    event: NotRequired[str]
    task_id: NotRequired[int | None]
    attempt: NotRequired[int]
    receipt: NotRequired[str]


@dataclass
class PassReport:
    delivered: int = 0
    retrying: int = 0
    failed: int = 0
    results: list[DeliveryResult] = field(default_factory=list)

    @property
    def attempted(self) -> int:
        return self.delivered + self.retrying + self.failed


def _claim(skip_targets: list[int]) -> tuple[int, int] | None:
    lease = settings.ACTHELM_NOTIFY_TIMEOUT_SECONDS * 2 + 30
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, [skip_targets, lease])
        claimed: tuple[int, int] | None = cursor.fetchone()
        return claimed


def retry_delay(attempts: int) -> float:
    delays = settings.ACTHELM_NOTIFY_RETRY_DELAYS
    return delays[min(attempts - 1, len(delays) - 1)]


def deliver_one(notification_id: int, attempts: int) -> DeliveryResult:
    """Send a claimed row and record what happened. Returns the result for reports."""
    row = Notification.objects.select_related("target").filter(pk=notification_id).first()
    if row is None:  # deleted with its task meanwhile
        return {"id": notification_id, "status": "gone", "code": "", "error": ""}
    target = row.target
    code, error, receipt = "", "", ""
    if target is None:
        code, error = "target_removed", "the target was removed"
    elif not target.enabled:
        code, error = "target_disabled", "the target is disabled"
    else:
        message = Message(
            idempotency_key=str(row.idempotency_key),
            event_kind=row.event_kind,
            subject=row.subject,
            text=row.text,
            url=row.url,
            payload=row.payload,
        )
        release_connection()  # a pooled worker holds no connection while a receiver answers
        try:
            receipt = send(target, message)
        except DeliveryFailed as exc:
            code, error = exc.code, exc.message
        except Exception as exc:  # a bug must not leave the row claimed again and again
            log.exception("notify.send_crashed", extra={"notification_id": row.pk})
            code, error = "internal_error", f"{exc.__class__.__name__}: {exc}"[:500]
    final = bool(code) and (
        attempts >= settings.ACTHELM_NOTIFY_MAX_ATTEMPTS
        or code in ("target_removed", "target_disabled")
    )
    status = _record(row, target, attempts=attempts, code=code, error=error, final=final)
    result: DeliveryResult = {
        "id": row.pk,
        "target": row.target_name,
        "event": row.event_kind,
        "task_id": row.task_id,
        "attempt": attempts,
        "status": status,
        "code": code,
        "error": error,
        "receipt": receipt,
    }
    level = logging.INFO if not code else logging.WARNING
    log.log(level, "notify.%s", status, extra={k: v for k, v in result.items() if k != "error"})
    return result


def _record(
    row: Notification,
    target: NotificationTarget | None,
    *,
    attempts: int,
    code: str,
    error: str,
    final: bool,
) -> str:
    now = timezone.now()
    mine = Notification.objects.filter(
        pk=row.pk, attempts=attempts, status=NotificationStatus.PENDING
    )
    with transaction.atomic():
        if not code:
            status: str = NotificationStatus.DELIVERED
            mine.update(status=status, delivered_at=now, last_error_code="", last_error="")
            if target is not None:
                NotificationTarget.objects.filter(pk=target.pk).update(
                    last_delivered_at=now, failed_in_a_row=0
                )
            return status
        fields = {"last_error_code": code, "last_error": error[:2000]}
        if final:
            status = NotificationStatus.FAILED
            updated = mine.update(status=status, **fields)
        else:
            status = "retrying"
            delay = timedelta(seconds=retry_delay(attempts))
            updated = mine.update(next_attempt_at=now + delay, **fields)
        if target is not None and updated:
            target_fields = {"last_error_at": now, "last_error_code": code, "last_error": error}
            if final:
                target_fields["failed_in_a_row"] = F("failed_in_a_row") + 1
            NotificationTarget.objects.filter(pk=target.pk).update(**target_fields)
        return status


def deliver_due(*, max_seconds: float | None = None, limit: int | None = None) -> PassReport:
    """One delivery pass: send due rows until none is due, `limit` rows were tried, or
    `max_seconds` passed (a claim in flight finishes). A target that fails is not tried again
    in the same pass, so a dead receiver costs one timeout per pass, not one per row."""
    report = PassReport()
    started = time.monotonic()
    failed_targets: list[int] = []
    while True:
        if limit is not None and report.attempted >= limit:
            break
        if max_seconds is not None and time.monotonic() - started >= max_seconds:
            break
        claimed = _claim(failed_targets)
        if claimed is None:
            break
        result = deliver_one(*claimed)
        if result["status"] == "gone":
            continue
        report.results.append(result)
        if result["status"] == NotificationStatus.DELIVERED:
            report.delivered += 1
            continue
        if result["status"] == NotificationStatus.FAILED:
            report.failed += 1
        else:
            report.retrying += 1
        target_id = Notification.objects.filter(pk=result["id"]).values_list("target_id", flat=True)
        failed_targets.extend(t for t in target_id if t)
    return report


def deliver_in_maintenance() -> None:
    """A worker's delivery thread's call: one bounded pass that never raises. Delivery is best
    effort for the worker; the rows stay in the outbox for the next pass whatever happens here.
    It runs in its own thread, never in the one that recovers runs: a receiver may hold a pass
    for up to one send's deadline, and that must not delay any task's recovery."""
    try:
        report = deliver_due(max_seconds=settings.ACTHELM_NOTIFY_PASS_SECONDS)
    except Exception:  # the maintenance thread must outlive any delivery problem
        log.exception("notify.pass_failed")
        connection.close()
        return
    if report.attempted:
        log.info(
            "notify.pass",
            extra={
                "delivered": report.delivered,
                "retrying": report.retrying,
                "failed": report.failed,
            },
        )
