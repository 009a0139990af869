"""The console shows notifications: a page of recent deliveries and failures behind login and a
permission, linked from the nav, and a section of the task page saying what was sent where."""

import pytest
from django.urls import reverse

from tasks.notify.delivery import deliver_due
from tasks.notify.models import Notification
from tasks.notify.states import TargetKind
from tasks.notify.targets import target_add
from tests.factories import UserFactory
from tests.fakes.smtp_server import free_port
from tests.tasks.notify_helpers import approval_notified, failed_task

pytestmark = pytest.mark.django_db(transaction=True)

URL = "/notifications/"


@pytest.fixture
def history(settings):
    """One delivered email (Django's test mailer) and one webhook that failed for good."""
    settings.ACTHELM_NOTIFY_MAX_ATTEMPTS = 1
    settings.ACTHELM_NOTIFY_TIMEOUT_SECONDS = 0.5
    settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]  # the dead hook is on loopback
    target_add(name="founder-mail", kind=TargetKind.EMAIL, address="founder@example.org")
    target_add(
        name="dead-hook", kind=TargetKind.WEBHOOK, address=f"http://127.0.0.1:{free_port()}/h"
    )
    task = failed_task(title="Monthly numbers")
    deliver_due()
    return task


def test_the_page_needs_login_and_the_permission(client, history):
    assert reverse("notify:deliveries") == URL
    response = client.get(URL)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]
    client.force_login(UserFactory(username="viewer", perms=["tasks.view_task"]))
    assert client.get(URL).status_code == 403


def test_the_page_lists_deliveries_and_failures_and_the_failing_target(client, history):
    client.force_login(UserFactory(username="ops", perms=["tasks.view_notification"]))
    page = client.get(URL).content.decode()
    assert 'data-target="dead-hook"' in page and "failing</strong> (1 failed)" in page
    assert "connection_failed" in page and f"#{history.pk}</a> Monthly numbers" in page
    delivered = Notification.objects.get(target_name="founder-mail")
    failed = Notification.objects.get(target_name="dead-hook")
    assert f'class="notification status-delivered" data-notification="{delivered.pk}"' in page
    assert f'class="notification status-failed" data-notification="{failed.pk}"' in page
    only_failed = client.get(URL, {"status": "failed"}).content.decode()
    assert f'data-notification="{failed.pk}"' in only_failed
    assert f'data-notification="{delivered.pk}"' not in only_failed
    assert f'href="{URL}"' in page  # the nav links the page


def test_the_task_page_shows_what_was_sent_where(client, history):
    client.force_login(UserFactory(username="ops", perms=["tasks.view_task"]))
    page = client.get(reverse("tasks:detail", args=[history.pk])).content.decode()
    section = page[page.index('id="notifications"') :]
    assert "founder-mail" in section and "delivered" in section
    assert "dead-hook" in section and "failed</strong> after 1 attempt" in section
    assert "connection_failed" in section


def test_the_page_lists_each_notifications_links_a_decision_link_only_for_who_may_decide(
    client, settings
):
    """Issue 49, item 4: the operator finds a recent notification's link on the page; a signed
    decision link is not shown to a person who could not take the decision."""
    settings.ACTHELM_BASE_URL = "http://testserver"
    target_add(name="founder-mail", kind=TargetKind.EMAIL, address="founder@example.org")
    approval = approval_notified()
    failed = failed_task(title="Monthly numbers")
    deliver_due()
    asked = Notification.objects.get(task=approval.task)
    told = Notification.objects.get(task=failed)
    assert asked.url.startswith("http://testserver/decide/approval/")

    client.force_login(
        UserFactory(username="ops", perms=["tasks.view_notification", "approvals.decide_approval"])
    )
    page = client.get(URL).content.decode()
    row = page[page.index(f'data-notification="{asked.pk}"') :].split("</tr>")[0]
    assert f'class="notification-link decision-link" href="{asked.url}">{asked.url}</a>' in row
    assert "expired" not in row and "not shown" not in row
    other = page[page.index(f'data-notification="{told.pk}"') :].split("</tr>")[0]
    assert f'href="{told.url}"' in other  # the task page: no decision, shown to all

    # The link the page shows is the one that opens the decision.
    opened = client.get(asked.url.removeprefix("http://testserver"))
    assert opened.status_code == 200 and f'id="approval-{approval.pk}"' in opened.content.decode()

    settings.ACTHELM_DECISION_LINK_SECONDS = -1
    assert "(expired)</span>" in client.get(URL).content.decode()
    settings.ACTHELM_DECISION_LINK_SECONDS = 86400

    client.force_login(UserFactory(username="watcher", perms=["tasks.view_notification"]))
    page = client.get(URL).content.decode()
    token = asked.url.rstrip("/").split("/")[-1]
    assert token not in page
    row = page[page.index(f'data-notification="{asked.pk}"') :].split("</tr>")[0]
    assert "1 decision link not shown" in row
    assert f'href="{told.url}"' in page
