# ruff: noqa: F811 - the worker fixtures of tests/agents/conftest.py are imported below
"""Webhook receivers are hostile peers: internal addresses, answers that leak, answers that
trickle, and a receiver that holds a send must not hold any task's recovery (issue 21, items 2,
6 and the signed timestamp of 11)."""

import time

import pytest
from django.core.management import CommandError, call_command

from agents.models import AgentRun
from core import egress
from tasks.models import Task
from tasks.notify.channels import sign
from tasks.notify.delivery import deliver_due
from tasks.notify.models import Notification, NotificationTarget
from tasks.notify.states import TargetKind
from tasks.notify.targets import target_add, target_test
from tasks.states import TaskStatus
from tests.agents.conftest import (  # noqa: F401 - fixtures
    cli_model,
    cli_task,
    spawn_worker,
    wait_for,
)
from tests.fakes.webhook_receiver import WebhookReceiver
from tests.tasks.notify_helpers import failed_task

pytestmark = pytest.mark.django_db(transaction=True)

SECRET = "hook-secret-for-tests"


@pytest.fixture
def hook_settings(settings, monkeypatch):
    settings.ACTHELM_NOTIFY_TIMEOUT_SECONDS = 0.5
    settings.ACTHELM_NOTIFY_MAX_ATTEMPTS = 3
    settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = []
    monkeypatch.setenv("ACTHELM_KEY_HOOK_SIGNING", SECRET)
    return settings


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/iam/",
        "http://127.0.0.1:5432/",
        "http://127.1/x",
        "http://0x7f.0.0.1/x",
        "http://2130706433/x",
        "http://[::1]/x",
        "http://[::ffff:10.0.0.1]/x",
        "http://10.1.2.3/hook",
        "http://localhost:8000/hook",
    ],
)
def test_an_internal_address_is_refused_when_the_target_is_added(hook_settings, url):
    with pytest.raises(CommandError, match=r"address: .*\[invalid_target\]"):
        call_command("acthelm_notify", "add", "internal", "--webhook", url)
    assert not NotificationTarget.objects.exists()


def test_the_setting_allows_an_internal_receiver_it_names(hook_settings):
    hook_settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["10.0.0.0/8"]
    target_add(name="ok", kind=TargetKind.WEBHOOK, address="http://10.1.2.3/hook")
    with pytest.raises(Exception, match="loopback"):
        target_add(name="no", kind=TargetKind.WEBHOOK, address="http://127.0.0.1/hook")


def test_a_name_that_resolves_inside_is_refused_at_send_and_nothing_is_sent(
    hook_settings, monkeypatch
):
    """The name passes when it is saved; at send time it resolves to loopback (a rebinding
    DNS answer), so nothing is sent and the row says why."""
    with WebhookReceiver(secret=SECRET) as receiver:
        port = receiver.httpd.server_address[1]
        target_add(
            name="hook",
            kind=TargetKind.WEBHOOK,
            address=f"http://hooks.example.org:{port}/hook",
            secret_env="ACTHELM_KEY_HOOK_SIGNING",
        )
        monkeypatch.setattr(egress, "resolve_host", lambda host, port, timeout: ["127.0.0.1"])
        failed_task()
        report = deliver_due()
    assert report.retrying == 1 and receiver.received == []
    row = Notification.objects.get()
    assert row.last_error_code == "address_not_allowed"
    assert "loopback" in row.last_error


def test_an_allowed_name_is_sent_to_exactly_the_address_that_was_checked(
    hook_settings, monkeypatch
):
    """DNS pinning: the connection goes to the checked address, with the URL's own Host."""
    hook_settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]
    answers = iter([["127.0.0.1"]])  # a second resolution would raise StopIteration
    monkeypatch.setattr(egress, "resolve_host", lambda host, port, timeout: next(answers))
    with WebhookReceiver(secret=SECRET) as receiver:
        port = receiver.httpd.server_address[1]
        target_add(
            name="hook",
            kind=TargetKind.WEBHOOK,
            address=f"http://hooks.example.org:{port}/hook",
            secret_env="ACTHELM_KEY_HOOK_SIGNING",
        )
        failed_task()
        assert deliver_due().delivered == 1
    [request] = receiver.received
    assert request.headers["host"] == f"hooks.example.org:{port}" and request.signature_ok


def test_what_a_receiver_answers_is_not_stored_or_shown_only_its_status(hook_settings):
    hook_settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]
    leak = b"INTERNAL-ONLY: db_password=hunter2-" + b"x" * 100_000
    with WebhookReceiver(mode="leak", answer_body=leak) as receiver:
        target_add(name="hook", kind=TargetKind.WEBHOOK, address=receiver.url)
        with pytest.raises(Exception) as raised:
            target_test(name="hook")
        failed_task()
        deliver_due()
    assert "hunter2" not in str(raised.value) and "HTTP 500" in str(raised.value)
    row = Notification.objects.get()
    target = NotificationTarget.objects.get()
    assert row.last_error_code == "http_500"
    assert "hunter2" not in row.last_error and "hunter2" not in target.last_error


def test_a_receiver_that_trickles_its_answer_is_cut_off_at_the_deadline(hook_settings):
    """Each byte arrives well within any per-read timeout; the send's one deadline ends it.
    (With httpx's per-read timeout alone this send was delivered after the whole trickle.)"""
    hook_settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]
    with WebhookReceiver(mode="trickle", delay=6.0) as receiver:
        target_add(name="hook", kind=TargetKind.WEBHOOK, address=receiver.url)
        failed_task()
        report = deliver_due()
    assert report.retrying == 1
    assert Notification.objects.get().last_error_code == "timeout"


def test_the_signature_covers_a_timestamp(hook_settings):
    with WebhookReceiver(secret=SECRET) as receiver:
        hook_settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]
        target_add(
            name="hook",
            kind=TargetKind.WEBHOOK,
            address=receiver.url,
            secret_env="ACTHELM_KEY_HOOK_SIGNING",
        )
        failed_task()
        assert deliver_due().delivered == 1
    [request] = receiver.received
    stamp = request.headers["x-acthelm-timestamp"]
    assert abs(int(stamp) - time.time()) < 60
    assert request.headers["x-acthelm-signature"] == sign(SECRET, request.body, stamp)
    # The same body signed at another time is another signature: a replay shows its age.
    assert sign(SECRET, request.body, str(int(stamp) - 3600)) != sign(SECRET, request.body, stamp)


def test_a_receiver_holding_a_send_does_not_delay_recovery(
    cli_model, cli_task, spawn_worker, settings
):
    """A real worker is killed with a task; the rescuer's delivery is held by a receiver that
    trickles for a minute (30-s deadline). The task is recovered meanwhile, while that send is
    still in flight: recovery does not wait for any receiver."""
    settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]
    model = cli_model("--mode", "sleep", "--seconds", "60")
    task = cli_task(model)
    doomed = spawn_worker(worker_id="doomed")
    wait_for(lambda: Task.objects.get(pk=task.pk).status == TaskStatus.IN_PROGRESS)
    doomed.kill()
    with WebhookReceiver(mode="trickle", delay=60.0) as receiver:
        target_add(name="slow", kind=TargetKind.WEBHOOK, address=receiver.url)
        failed_task(title="Something that notifies")
        rescuer = spawn_worker(
            worker_id="rescuer",
            env={
                "ACTHELM_NOTIFY_ALLOW_ADDRESSES": "127.0.0.1",
                "ACTHELM_NOTIFY_TIMEOUT_SECONDS": "30",
            },
        )
        wait_for(lambda: receiver.received, message="the rescuer's send to begin")
        wait_for(
            lambda: AgentRun.objects.filter(task=task, worker_id="rescuer").exists(),
            timeout=20,
            message="the killed worker's task to be recovered and claimed again",
        )
        row = Notification.objects.get(target_name="slow")
        assert row.attempts == 1 and row.last_error_code == "" and row.status == "pending"
        rescuer.stop()
    lost = AgentRun.objects.get(task=task, worker_id="doomed")
    assert lost.error_code == "worker_lost"
