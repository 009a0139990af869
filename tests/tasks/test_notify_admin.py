"""Targets in the admin: the same validation as the command, and the test action."""

import pytest
from django.contrib.auth import get_user_model

from tasks.notify.models import NotificationTarget
from tests.fakes.webhook_receiver import WebhookReceiver

pytestmark = pytest.mark.django_db(transaction=True)

ADD = "/admin/tasks/notificationtarget/add/"


@pytest.fixture
def admin_client(client, settings):
    settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]  # the receiver runs on loopback
    user = get_user_model().objects.create_superuser("root", "root@example.org", "pw")
    client.force_login(user)
    return client


def form(**values):
    data = {"name": "hook", "kind": "webhook", "address": "", "secret_env": "", "enabled": "on"}
    data["events"] = "awaiting_approval,review"
    data.update(values)
    return data


def test_the_admin_refuses_what_the_command_refuses(admin_client):
    bad = admin_client.post(ADD, form(address="https://x.example.org/h", secret_env="s3cr3t!"))
    assert bad.status_code == 200 and "NAME of an environment variable" in bad.content.decode()
    bad = admin_client.post(ADD, form(kind="email", address="nobody"))
    assert "an email target needs an email address" in bad.content.decode()
    assert not NotificationTarget.objects.exists()
    ok = admin_client.post(
        ADD, form(address="https://x.example.org/h", secret_env="ACTHELM_KEY_HOOK")
    )
    assert ok.status_code == 302
    target = NotificationTarget.objects.get()
    assert (
        target.events == ["awaiting_approval", "review"] and target.secret_env == "ACTHELM_KEY_HOOK"
    )


def test_the_admin_test_action_sends_a_sample(admin_client):
    with WebhookReceiver() as receiver:
        target = NotificationTarget.objects.create(
            name="hook", kind="webhook", address=receiver.url
        )
        response = admin_client.post(
            "/admin/tasks/notificationtarget/",
            {"action": "send_test", "_selected_action": [target.pk]},
            follow=True,
        )
    assert '<li class="success">Hook: HTTP 204</li>' in response.content.decode()
    assert receiver.received[0].json["event"] == "test"
