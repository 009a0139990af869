"""Notifications in a real browser: from the nav to the deliveries page, then to the task."""

import pytest
from playwright.sync_api import expect

from tasks.notify.delivery import deliver_due
from tasks.notify.models import Notification
from tasks.notify.states import TargetKind
from tasks.notify.targets import target_add
from tests.factories import UserFactory
from tests.fakes.smtp_server import free_port
from tests.tasks.notify_helpers import approval_notified, failed_task

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_a_failing_target_is_seen_from_the_nav_and_on_the_task_page(page, login, settings):
    settings.ACTHELM_NOTIFY_MAX_ATTEMPTS = 1
    settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES = ["127.0.0.1"]  # the dead receiver is on loopback
    UserFactory(username="ops", perms=["tasks.view_task", "tasks.view_notification"])
    target_add(name="founder-mail", kind=TargetKind.EMAIL, address="founder@example.org")
    target_add(name="chat", kind=TargetKind.WEBHOOK, address=f"http://127.0.0.1:{free_port()}/h")
    task = failed_task(title="Monthly numbers")
    deliver_due()

    login("ops")
    page.get_by_role("link", name="Notifications").click()
    expect(page.locator('tr[data-target="chat"]')).to_contain_text("failing")
    failed = page.locator("tr.notification.status-failed")
    expect(failed).to_contain_text("connection_failed")
    expect(page.locator("tr.notification.status-delivered")).to_contain_text("founder-mail")
    failed.get_by_role("link", name=f"#{task.pk}").click()
    section = page.locator("#notifications")
    expect(section).to_contain_text("founder-mail")
    expect(section.locator("tr.status-failed")).to_contain_text("failed after 1 attempt")


def test_the_notifications_page_lists_a_recent_notification_with_its_decision_link(
    page, login, live_server, settings, screenshot
):
    """Issue 49, item 4: the operator finds the link of a recent notification on the page (the
    email's own, whole) and it opens the decision."""
    settings.ACTHELM_BASE_URL = live_server.url
    UserFactory(
        username="ops",
        perms=["tasks.view_task", "tasks.view_notification", "approvals.decide_approval"],
    )
    target_add(name="founder-mail", kind=TargetKind.EMAIL, address="founder@example.org")
    approval = approval_notified(url="https://example.org/q3.txt")
    deliver_due()
    row = Notification.objects.get(task=approval.task)

    login("ops")
    page.get_by_role("link", name="Notifications").click()
    listed = page.locator(f'tr.notification[data-notification="{row.pk}"]')
    expect(listed).to_contain_text("Task awaits an approval")
    expect(listed).to_contain_text("founder-mail")
    link = listed.locator("a.decision-link")
    expect(link).to_have_text(row.url)
    expect(link).to_have_attribute("href", row.url)
    screenshot("notifications.png")
    link.click()
    page.wait_for_url(row.url)
    card = page.locator(f"#approval-{approval.pk}")
    expect(card).to_contain_text("Sends an HTTP GET request to https://example.org/q3.txt")
    expect(card.locator("[data-action=approve]")).to_be_visible()
