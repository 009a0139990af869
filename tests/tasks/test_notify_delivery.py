# ruff: noqa: F811 - the worker fixtures of tests/agents/conftest.py are imported below
"""Delivering the outbox to real peers on loopback: an SMTP server (aiosmtpd) and an HTTP
receiver that checks the signature; receivers that are down, slow or answer 500 are retried with
back-off, then reported, and the task is never touched."""

import threading
from datetime import timedelta

import pytest
from django.db import connection
from django.utils import timezone

from tasks.models import Task, TaskEvent
from tasks.notify.delivery import deliver_due, deliver_in_maintenance
from tasks.notify.models import Notification, NotificationTarget
from tasks.notify.states import NotificationStatus, TargetKind
from tasks.notify.targets import target_add
from tasks.states import TaskStatus
from tests.agents.conftest import (  # noqa: F401 - fixtures
    cli_model,
    cli_task,
    spawn_worker,
    wait_for,
)
from tests.factories import TaskFactory
from tests.fakes.smtp_server import SmtpServer, free_port
from tests.fakes.webhook_receiver import WebhookReceiver
from tests.tasks.notify_helpers import failed_task

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "s3cret-for-tests"


@pytest.fixture
def notify_settings(settings, monkeypatch):
    settings.ACTHELM_BASE_URL = "https://acthelm.example.org"
    settings.ACTHELM_NOTIFY_TIMEOUT_SECONDS = 0.5
    settings.ACTHELM_NOTIFY_MAX_ATTEMPTS = 3
    settings.ACTHELM_NOTIFY_RETRY_DELAYS = [60, 300]
    settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]  # the receivers run on loopback
    monkeypatch.setenv("ACTHELM_KEY_TEST_HOOK", SECRET)
    return settings


def smtp_mailer(host: str, port: int) -> dict:
    options = {"host": host, "port": port, "timeout": 0.5}
    return {
        "default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend", "OPTIONS": options}
    }


def make_due() -> None:
    """Let the back-off pass, as time would."""
    Notification.objects.filter(status=NotificationStatus.PENDING).update(
        next_attempt_at=timezone.now() - timedelta(seconds=1)
    )


def webhook(url: str, name: str = "hook") -> NotificationTarget:
    return target_add(
        name=name, kind=TargetKind.WEBHOOK, address=url, secret_env="ACTHELM_KEY_TEST_HOOK"
    )


def test_email_reaches_a_real_smtp_server_with_the_link_and_a_stable_message_id(notify_settings):
    with SmtpServer() as smtp:
        notify_settings.MAILERS = smtp_mailer(smtp.host, smtp.port)
        notify_settings.DEFAULT_FROM_EMAIL = "acthelm@example.org"
        target_add(name="founder", kind=TargetKind.EMAIL, address="founder@example.org")
        task = failed_task()
        [row] = Notification.objects.all()
        report = deliver_due()
        assert (report.delivered, report.retrying, report.failed) == (1, 0, 0)
        [mail] = smtp.messages
    assert smtp.envelopes == [("acthelm@example.org", ["founder@example.org"])]
    assert mail["Subject"] == f"Failed (limit_steps): task #{task.pk} “Quarterly report”"
    assert mail["Message-ID"] == f"<{row.idempotency_key}@acthelm>"
    assert mail["X-Acthelm-Idempotency-Key"] == str(row.idempotency_key)
    body = mail.get_content()
    assert f"https://acthelm.example.org/tasks/{task.pk}/" in body
    assert "limit_steps" in body and "retry from the last checkpoint" in body
    row.refresh_from_db()
    assert (row.status, row.attempts, row.last_error_code) == ("delivered", 1, "")
    assert row.delivered_at is not None
    target = NotificationTarget.objects.get()
    assert target.state == "ok" and target.last_delivered_at is not None


def test_webhook_is_signed_over_the_exact_body_and_carries_the_idempotency_key(
    notify_settings, caplog
):
    caplog.set_level("DEBUG")
    with WebhookReceiver(secret=SECRET) as receiver:
        webhook(receiver.url)
        task = failed_task()
        assert deliver_due().delivered == 1
    [request] = receiver.received
    row = Notification.objects.get()
    assert request.signature_ok
    assert request.headers["idempotency-key"] == str(row.idempotency_key)
    assert request.headers["content-type"] == "application/json"
    body = request.json
    assert body["idempotency_key"] == str(row.idempotency_key) and body["event"] == "failed"
    assert body["task"]["id"] == task.pk and body["failure"]["code"] == "limit_steps"
    # Slack and Mattermost incoming webhooks show `text`.
    assert body["text"].startswith(f"Task #{task.pk} “Quarterly report” failed with limit_steps")
    assert body["url"] == f"https://acthelm.example.org/tasks/{task.pk}/"
    # The receiver's URL (a secret for chat webhooks) is in no log line.
    assert not [r for r in caplog.records if receiver.url in r.getMessage()]


def test_a_wrong_secret_is_refused_by_the_receiver_and_the_row_retries(notify_settings):
    with WebhookReceiver(secret="another-secret") as receiver:
        webhook(receiver.url)
        failed_task()
        report = deliver_due()
    assert report.retrying == 1 and not receiver.received[0].signature_ok
    assert Notification.objects.get().last_error_code == "http_401"


def _assert_retried_then_reported(receiver_count, code: str, task: Task, events_before: int):
    rows = list(Notification.objects.all())
    assert [(r.status, r.attempts, r.last_error_code) for r in rows] == [("failed", 3, code)]
    target = NotificationTarget.objects.get()
    assert target.state == "failing" and target.failed_in_a_row == 1
    assert target.last_error_code == code
    # The task is untouched: same state, no event written by delivery.
    assert Task.objects.get(pk=task.pk).status == TaskStatus.FAILED
    assert TaskEvent.objects.filter(task=task).count() == events_before
    if receiver_count is not None:
        assert receiver_count() == 3


def _three_passes() -> list:
    reports = []
    for _ in range(3):
        reports.append(deliver_due())
        make_due()
    return reports


def test_a_receiver_answering_500_is_retried_with_back_off_then_reported(notify_settings):
    with WebhookReceiver(secret=SECRET, mode="error") as receiver:
        webhook(receiver.url)
        task = failed_task()
        events = TaskEvent.objects.filter(task=task).count()
        report = deliver_due()
        assert report.retrying == 1
        row = Notification.objects.get()
        # Back-off: the first retry waits ACTHELM_NOTIFY_RETRY_DELAYS[0].
        wait = (row.next_attempt_at - row.last_attempt_at).total_seconds()
        assert row.status == "pending" and 59.9 <= wait < 90  # 60 s after the attempt
        assert deliver_due().attempted == 0  # not due yet
        make_due()
        _three_passes()
        keys = {r.headers["idempotency-key"] for r in receiver.received}
    assert keys == {str(row.idempotency_key)}  # every attempt carries the same key
    _assert_retried_then_reported(lambda: len(receiver.received), "http_500", task, events)
    assert deliver_due().attempted == 0  # never retried forever


def test_a_receiver_that_is_down_is_retried_then_reported(notify_settings):
    webhook(f"http://127.0.0.1:{free_port()}/hook")
    task = failed_task()
    events = TaskEvent.objects.filter(task=task).count()
    _three_passes()
    _assert_retried_then_reported(None, "connection_failed", task, events)


def test_a_slow_receiver_times_out_is_retried_then_reported(notify_settings):
    with WebhookReceiver(secret=SECRET, mode="slow", delay=2.0) as receiver:
        webhook(receiver.url)
        task = failed_task()
        events = TaskEvent.objects.filter(task=task).count()
        _three_passes()
        count = len(receiver.received)
    _assert_retried_then_reported(lambda: count, "timeout", task, events)


def test_an_smtp_server_that_is_down_is_retried_then_reported(notify_settings):
    notify_settings.MAILERS = smtp_mailer("127.0.0.1", free_port())
    target_add(name="founder", kind=TargetKind.EMAIL, address="founder@example.org")
    task = failed_task()
    events = TaskEvent.objects.filter(task=task).count()
    _three_passes()
    _assert_retried_then_reported(None, "connection_failed", task, events)


def test_a_failing_target_does_not_hold_up_the_others_in_a_pass(notify_settings):
    with WebhookReceiver(secret=SECRET) as good:
        webhook(f"http://127.0.0.1:{free_port()}/hook", name="down")
        webhook(good.url, name="good")
        for n in range(3):
            failed_task(title=f"T{n}")
        report = deliver_due()
    # The dead target cost one attempt in this pass, not three; the good one got all three.
    assert (report.delivered, report.retrying) == (3, 1)
    assert len(good.received) == 3
    down = Notification.objects.filter(target_name="down")
    assert sorted(down.values_list("attempts", flat=True)) == [0, 0, 1]


def test_two_workers_delivering_at_once_send_each_row_exactly_once(notify_settings):
    with WebhookReceiver(secret=SECRET) as receiver:
        webhook(receiver.url)
        for n in range(30):
            failed_task(title=f"T{n}")
        barrier = threading.Barrier(3)
        reports = []

        def deliver():
            try:
                barrier.wait()
                reports.append(deliver_due())
            finally:
                connection.close()

        threads = [threading.Thread(target=deliver) for _ in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        keys = [r.headers["idempotency-key"] for r in receiver.received]
    assert len(keys) == len(set(keys)) == 30
    assert sum(r.delivered for r in reports) == 30
    assert set(Notification.objects.values_list("status", "attempts")) == {("delivered", 1)}


def test_a_removed_or_disabled_target_fails_its_rows_without_sending(notify_settings):
    with WebhookReceiver(secret=SECRET) as receiver:
        target = webhook(receiver.url)
        failed_task()
        NotificationTarget.objects.filter(pk=target.pk).update(enabled=False)
        report = deliver_due()
    assert report.failed == 1 and receiver.received == []
    assert Notification.objects.get().last_error_code == "target_disabled"


def test_a_target_deleted_in_the_admin_fails_its_rows_and_others_still_deliver(notify_settings):
    with WebhookReceiver(secret=SECRET) as receiver:
        gone = webhook(receiver.url, name="gone")
        webhook(receiver.url, name="kept")
        failed_task()
        gone.delete()  # the admin's delete: the rows keep the target's name, target_id NULL
        report = deliver_due()
    assert (report.delivered, report.failed) == (1, 1) and len(receiver.received) == 1
    row = Notification.objects.get(target_name="gone")
    assert (row.status, row.last_error_code, row.target_id) == ("failed", "target_removed", None)


def test_a_deleted_task_takes_its_notifications_with_it(notify_settings, actor):
    from agents.actions.task import task_delete

    webhook("https://hooks.example.org/x")
    task = failed_task()
    assert Notification.objects.count() == 1
    task_delete(actor=actor, task_id=task.pk)
    assert Notification.objects.count() == 0 and deliver_due().attempted == 0


def test_maintenance_delivery_survives_a_broken_database_connection(notify_settings, caplog):
    TaskFactory()
    connection.ensure_connection()
    connection.connection.close()  # the next query fails with InterfaceError
    deliver_in_maintenance()  # logged, not raised
    assert "notify.pass_failed" in [r.getMessage() for r in caplog.records]
    assert Notification.objects.count() == 0  # the connection works again


def test_a_running_worker_delivers_in_maintenance_and_a_dead_target_never_holds_a_task(
    cli_model, cli_task, spawn_worker, settings
):
    """A real worker process: the live receiver gets its message, the dead target is retried
    then reported, and the tasks move on as if nothing were sent."""
    settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]
    with WebhookReceiver(secret=SECRET) as receiver:
        webhook(receiver.url, name="live")
        webhook(f"http://127.0.0.1:{free_port()}/hook", name="dead")
        model = cli_model("--mode", "echo")
        first = cli_task(model, title="First")
        worker = spawn_worker(
            worker_id="notifier",
            env={
                "ACTHELM_KEY_TEST_HOOK": SECRET,
                "ACTHELM_NOTIFY_TIMEOUT_SECONDS": "0.5",
                "ACTHELM_NOTIFY_RETRY_DELAYS": "1",
                "ACTHELM_NOTIFY_MAX_ATTEMPTS": "2",
                "ACTHELM_NOTIFY_ALLOW_ADDRESSES": "127.0.0.1",
            },
        )
        wait_for(lambda: len(receiver.received) == 1, message="the live receiver's message")
        second = cli_task(model, title="Second")
        wait_for(lambda: len(receiver.received) == 2, message="the second task's message")
        wait_for(
            lambda: Notification.objects.filter(target_name="dead", status="failed").count() == 2,
            message="the dead target's rows to fail",
        )
        worker.stop()
    assert all(r.signature_ok for r in receiver.received)
    assert [r.json["task"]["id"] for r in receiver.received] == [first.pk, second.pk]
    assert set(
        Task.objects.filter(pk__in=[first.pk, second.pk]).values_list("status", flat=True)
    ) == {TaskStatus.REVIEW}
    dead = NotificationTarget.objects.get(name="dead")
    assert dead.state == "failing" and dead.failed_in_a_row == 2
    assert set(
        Notification.objects.filter(target_name="dead").values_list("attempts", flat=True)
    ) == {2}
