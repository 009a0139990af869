"""Agent Inbox's answers in a real browser: edit an operation's arguments and approve the edit
(a wrong edit first: refused with its reason, nothing decided), and deny with a message the model
will receive; the card shows the edit's new hash."""

import pytest
from playwright.sync_api import expect

from agents.catalogue.tools import get_tool, operation_hash
from agents.models import ToolCall
from approvals.models import Approval
from approvals.states import ApprovalStatus
from tasks.models import Task
from tasks.states import TaskStatus
from tests.console.scenes import pending_approval
from tests.factories import UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

PERMS = ["tasks.view_task", "tasks.operate_task", "approvals.decide_approval"]


@pytest.fixture
def founder():
    return UserFactory(username="founder", perms=PERMS)


def status_of(approval) -> str:
    return Task.objects.values_list("status", flat=True).get(pk=approval.task_id)


def test_edit_the_arguments_and_approve_the_edit_from_the_inbox(
    page, login, founder, settings, screenshot
):
    settings.ACTHELM_FETCH_ALLOW_PRIVATE = False
    approval = pending_approval(url="https://example.org/q3-report.csv")
    login("founder")
    page.goto("/approvals/")
    card = page.locator(f"#approval-{approval.pk}")
    card.get_by_text("Edit arguments").click()
    # The URL, a string argument, is its own text field, prefilled with the proposal's.
    editor = card.locator("textarea[data-argument=url]")
    assert editor.input_value() == approval.arguments["url"]
    assert card.locator("textarea[name=arguments]").count() == 0  # no other argument

    editor.fill("http://169.254.169.254/latest/meta-data")
    card.locator("[data-action=approve-edited]").click()
    card = page.locator(f"#approval-{approval.pk}")
    expect(card).to_contain_text("Nothing was decided.")
    expect(card).to_contain_text("url_address_not_allowed")
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING
    # The card is back with the edit open and the text typed, to correct.
    editor = card.locator("textarea[data-argument=url]")
    expect(editor).to_be_visible()
    assert "169.254.169.254" in editor.input_value()

    edit = {"url": "https://example.org/q4-report.csv"}
    editor.fill(edit["url"])
    screenshot("inbox-edit.png")
    card.locator("[data-action=approve-edited]").click()
    new_hash = operation_hash("fetch_url", get_tool("fetch_url").parse(edit))
    expect(card).to_contain_text("Approved with edited arguments")
    expect(card.locator(".edited-hash")).to_have_text(new_hash)
    expect(card).to_contain_text("q4-report.csv")
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.edited_arguments_hash == new_hash
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert (call.arguments["url"], call.arguments_hash) == (edit["url"], new_hash)
    assert status_of(approval) == TaskStatus.READY


def test_deny_with_a_message_from_the_task_page(page, login, founder):
    approval = pending_approval(url="https://example.org/secret.csv")
    login("founder")
    page.goto(f"/tasks/{approval.task_id}/")
    card = page.locator(f"#approval-{approval.pk}")
    card.get_by_text("Deny with a message").click()
    card.locator("textarea[name=message]").fill("use notes.txt instead")
    card.locator("[data-action=deny-with-message]").click()

    expect(page.locator(".flash-success")).to_contain_text("Denied")
    expect(page.locator("#task-status")).to_have_text("Ready")
    # The transcript and the timeline say what the model is told.
    expect(page.locator(".approval-message")).to_have_text("use notes.txt instead")
    expect(page.get_by_text("Message to the model: use notes.txt instead")).to_be_visible()
    approval.refresh_from_db()
    assert (approval.status, approval.message) == (ApprovalStatus.DENIED, "use notes.txt instead")
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.result_for_model.startswith("denied by a person: use notes.txt instead")
