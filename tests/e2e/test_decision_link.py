"""A notification's decision link in a browser: opened signed out, it goes through the login
page and comes back to the decision's card; Approve decides it, recorded as through the link."""

import pytest
from playwright.sync_api import expect

from approvals.models import Approval
from approvals.states import ApprovalStatus
from tasks.models import TaskEvent
from tasks.notify.links import LinkKind, decision_link
from tasks.states import EventKind
from tests.console.scenes import pending_approval
from tests.e2e.conftest import PASSWORD
from tests.factories import UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_open_a_decision_link_signed_out_log_in_and_approve(page, live_server, settings):
    settings.ACTHELM_BASE_URL = live_server.url
    UserFactory(username="founder", perms=["approvals.decide_approval", "tasks.view_task"])
    approval = pending_approval(url="https://example.org/q3.txt")
    link = decision_link(LinkKind.APPROVAL, approval.pk, approval.arguments_hash)

    page.goto(link)
    page.wait_for_url("**/admin/login/**")
    page.fill("#id_username", "founder")
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(link)

    card = page.locator(f"#approval-{approval.pk}")
    expect(card).to_contain_text("fetch_url")
    expect(card).to_contain_text("Sends an HTTP GET request to https://example.org/q3.txt")
    card.locator("[data-action=approve]").click()
    expect(page.locator(f"#approval-{approval.pk}")).to_contain_text("Approved: fetch_url")

    approval = Approval.objects.get(pk=approval.pk)
    assert approval.status == ApprovalStatus.APPROVED
    event = TaskEvent.objects.get(task_id=approval.task_id, kind=EventKind.APPROVED)
    assert event.data["via"] == "email_link" and event.actor_user.username == "founder"

    # Opened again, the link says the operation was decided, and by whom.
    page.goto(link)
    expect(page.locator("#link-closed")).to_contain_text("already decided: Approved by founder")
    expect(page.locator("[data-action=approve]")).to_have_count(0)
