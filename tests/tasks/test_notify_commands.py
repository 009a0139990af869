"""manage.py acthelm_notify add|list|test|remove|deliver, against real receivers on loopback."""

import json

import pytest
from django.core.management import CommandError, call_command

from tasks.notify.models import Notification, NotificationTarget
from tests.fakes.smtp_server import SmtpServer, free_port
from tests.fakes.webhook_receiver import WebhookReceiver
from tests.tasks.notify_helpers import failed_task

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _loopback_receivers(settings):
    """The receivers here run on loopback, which a deployment must allow explicitly."""
    settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]


def run(*args) -> str:
    from io import StringIO

    out = StringIO()
    call_command("acthelm_notify", *args, stdout=out)
    return out.getvalue()


def test_add_list_and_remove(settings):
    run("add", "mail", "--email", "founder@example.org", "--event", "review", "--event", "failed")
    run(
        "add",
        "hook",
        "--webhook",
        "https://hooks.example.org/acthelm",
        "--secret-env",
        "ACTHELM_KEY_HOOK",
    )
    rows = json.loads(run("--json", "list"))
    assert [(r["name"], r["kind"], r["state"]) for r in rows] == [
        ("hook", "webhook", "new"),
        ("mail", "email", "new"),
    ]
    assert rows[1]["events"] == ["review", "failed"] and rows[0]["secret_env"] == "ACTHELM_KEY_HOOK"
    # A webhook URL's path is often its secret: lists show only scheme and host.
    assert rows[0]["address"] == "https://hooks.example.org/…"
    assert "/acthelm" not in run("list")
    failed_task()
    assert Notification.objects.count() == 2
    out = json.loads(run("--json", "remove", "hook"))
    assert out == {"ok": True, "removed": "hook", "pending_dropped": 1}
    assert list(NotificationTarget.objects.values_list("name", flat=True)) == ["mail"]
    dropped = Notification.objects.get(target_name="hook")
    assert (dropped.status, dropped.last_error_code) == ("failed", "target_removed")


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--email", "not-an-address"], "invalid_target"),
        (["--webhook", "ftp://example.org/x"], "invalid_target"),
        (
            ["--webhook", "https://example.org/x", "--secret-env", "sk-live-abc/123"],
            "invalid_target",
        ),
        (["--email", "a@example.org", "--secret-env", "KEY"], "invalid_target"),
    ],
)
def test_add_refuses_bad_input_with_a_stable_code(args, code):
    with pytest.raises(CommandError, match=rf"\[{code}\]"):
        run("add", "bad", *args)
    assert not NotificationTarget.objects.exists()


def test_a_duplicate_name_is_refused():
    run("add", "mail", "--email", "a@example.org")
    with pytest.raises(CommandError, match=r"\[target_exists\]"):
        run("add", "mail", "--email", "b@example.org")


def test_test_sends_a_sample_through_the_real_channel(settings, monkeypatch):
    monkeypatch.setenv("ACTHELM_KEY_HOOK", "k3y")
    with WebhookReceiver(secret="k3y") as receiver, SmtpServer() as smtp:
        settings.MAILERS = {
            "default": {
                "BACKEND": "django.core.mail.backends.smtp.EmailBackend",
                "OPTIONS": {"host": smtp.host, "port": smtp.port, "timeout": 2},
            }
        }
        run("add", "hook", "--webhook", receiver.url, "--secret-env", "ACTHELM_KEY_HOOK")
        run("add", "mail", "--email", "founder@example.org")
        assert "HTTP 204" in run("test", "hook")
        out = json.loads(run("--json", "test", "mail"))
        assert out["ok"] and out["receipt"] == "accepted by the mail server"
    [request] = receiver.received
    assert request.signature_ok and request.json["event"] == "test" and request.json["text"]
    [mail] = smtp.messages
    assert mail["Subject"] == "Acthelm test notification"


def test_test_reports_a_failing_target(settings, monkeypatch):
    settings.ACTHELM_NOTIFY_TIMEOUT_SECONDS = 0.5
    run("add", "hook", "--webhook", f"http://127.0.0.1:{free_port()}/x")
    with pytest.raises(CommandError, match=r"\[connection_failed\]"):
        run("test", "hook")
    run(
        "add",
        "signed",
        "--webhook",
        "http://127.0.0.1:1/x",
        "--secret-env",
        "ACTHELM_KEY_NOT_SET_ANYWHERE",
    )
    monkeypatch.delenv("ACTHELM_KEY_NOT_SET_ANYWHERE", raising=False)
    with pytest.raises(CommandError, match=r"\[secret_missing\]"):
        run("test", "signed")
    with pytest.raises(CommandError, match=r"\[target_not_found\]"):
        run("test", "nobody")


def test_deliver_runs_one_pass(settings):
    with WebhookReceiver() as receiver:
        run("add", "hook", "--webhook", receiver.url)
        task = failed_task()
        out = json.loads(run("--json", "deliver"))
    assert (out["delivered"], out["retrying"], out["failed"]) == (1, 0, 0)
    assert out["results"][0]["task_id"] == task.pk and out["results"][0]["status"] == "delivered"
    assert receiver.received[0].json["task"]["id"] == task.pk
    assert "delivered 0" in run("deliver")  # nothing left


def test_json_is_taken_after_the_action_too():
    """Issue 21 item 12: the documented `acthelm_notify list --json` failed."""
    run("add", "mail", "--email", "founder@example.org")
    assert [row["name"] for row in json.loads(run("list", "--json"))] == ["mail"]
    assert json.loads(run("--json", "list")) == json.loads(run("list", "--json"))
