"""The console in a real browser: log in, create a task, decide approvals, watch a task page update,
close from the review queue, and what a person without the permission sees (phase 1: the database
state is built with factories; no worker runs)."""

import re

import pytest
from playwright.sync_api import expect

from agents.states import Role
from approvals.models import Approval
from approvals.states import ApprovalStatus
from core.actors import ActorKind
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tasks.workspace import workspace_dir
from tests.console.scenes import pending_approval, run_for, transcript_task
from tests.factories import ModelFactory, TaskFactory, TurnFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

FOUNDER_PERMS = [
    "tasks.view_task",
    "tasks.add_task",
    "tasks.change_task",
    "tasks.close_task",
    "tasks.operate_task",
    "approvals.decide_approval",
    "agents.manage_connections",
]


@pytest.fixture
def founder():
    return UserFactory(username="founder", perms=FOUNDER_PERMS)


def status_of(task) -> str:
    return Task.objects.values_list("status", flat=True).get(pk=task.pk)


def test_log_in_and_create_a_task(page, login, founder, tmp_path):
    model = ModelFactory(name="qwen-32b")
    notes = tmp_path / "notes.txt"
    notes.write_text("Launch moved to April 16.\n")
    login("founder")
    expect(page.locator("h1")).to_have_text("Tasks")
    page.get_by_role("link", name="New task").click()
    page.fill("#id_title", "Summarise the launch notes")
    page.fill("#id_instruction", "Read notes.txt and list the decisions.")
    page.check("#tool-fetch_url")
    page.check("input[name=ask_tools][value=fetch_url]")
    page.fill("#id_allowed_domains", "example.org")
    page.select_option("#id_model", str(model.pk))
    page.set_input_files("#id_files", str(notes))
    page.get_by_role("button", name="Create task").click()

    expect(page.locator("#task-status")).to_have_text("Ready")
    expect(page.locator(".flash-success")).to_contain_text("created")
    expect(page.locator(".card.instruction")).to_contain_text("Read notes.txt")
    expect(page.get_by_text("notes.txt", exact=True)).to_be_visible()
    task = Task.objects.get(title="Summarise the launch notes")
    assert task.status == TaskStatus.READY and task.model.name == "qwen-32b"
    assert "fetch_url" in task.tools and task.tool_policies == {"fetch_url": "ask"}
    assert (workspace_dir(task.pk) / "notes.txt").read_text() == "Launch moved to April 16.\n"


def test_approve_one_operation_and_deny_another_from_the_inbox(page, login, founder, screenshot):
    first = pending_approval(url="https://example.org/q3-report.csv", age_minutes=42)
    second = pending_approval(
        url="https://files.example.net/export.json",
        title="Import the customer export",
        reason="policy_ask",
        age_minutes=7,
    )
    login("founder")
    expect(page.locator("#pending-badge")).to_have_text("2")
    page.get_by_role("link", name=re.compile("^Approvals")).click()
    expect(page.locator(f"#approval-{first.pk}")).to_contain_text("q3-report.csv")
    screenshot("inbox.png")

    page.locator(f"#approval-{first.pk} [data-action=approve]").click()
    expect(page.locator(f"#approval-{first.pk}")).to_contain_text("Approved: fetch_url")
    expect(page.locator("#pending-badge")).to_have_text("1")
    assert status_of(first.task) == TaskStatus.READY
    assert Approval.objects.get(pk=first.pk).status == ApprovalStatus.APPROVED

    page.locator(f"#approval-{second.pk} [data-action=deny]").click()
    expect(page.locator(f"#approval-{second.pk}")).to_contain_text("Denied: fetch_url")
    expect(page.locator("#pending-badge")).to_have_text("0")
    assert Approval.objects.get(pk=second.pk).status == ApprovalStatus.DENIED
    assert status_of(second.task) == TaskStatus.READY

    page.locator(f"#approval-{first.pk}").get_by_role("link", name=re.compile("Open task")).click()
    expect(page.locator("#task-status")).to_have_text("Ready")


def test_a_stale_approval_is_refused_in_the_browser(page, login, founder):
    approval = pending_approval()
    login("founder")
    page.goto("/approvals/")
    # Decided elsewhere (another person, the CLI) after this page was loaded.
    Approval.objects.filter(pk=approval.pk).update(arguments_hash="0" * 64)
    page.locator(f"#approval-{approval.pk} [data-action=approve]").click()
    expect(page.locator(f"#approval-{approval.pk}")).to_contain_text("Nothing was changed.")
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING
    assert status_of(approval.task) == TaskStatus.AWAITING_APPROVAL


def test_the_task_page_shows_the_transcript_as_it_grows(page, login, founder, screenshot):
    task = transcript_task(status=TaskStatus.REVIEW)
    login("founder")
    page.goto(f"/tasks/{task.pk}/")
    expect(page.locator("#task-status")).to_have_text("Review")
    expect(page.locator(".turn.discarded")).to_have_count(1)
    expect(page.get_by_text("replaced by a placeholder in later requests")).to_be_visible()
    page.locator("details[id^=full-result] summary").first.click()
    expect(page.locator(".full-result pre").first).to_contain_text("Kick-off with the supplier")
    page.locator("details[id^=full-result] summary").first.click()
    screenshot("task.png")

    running = transcript_task(status=TaskStatus.IN_PROGRESS, title="Draft the release notes")
    page.goto(f"/tasks/{running.pk}/")
    expect(page.locator(".live-dot")).to_be_visible()
    # A worker writes a turn: the page shows it at its next poll (every 2 s).
    TurnFactory(
        task=running,
        run=running.runs.get(),
        index=running.turns.count(),
        role=Role.ASSISTANT,
        content="A new turn, written while the page was open.",
    )
    expect(page.get_by_text("A new turn, written while the page was open.")).to_be_visible()
    # The worker submits for review: the page shows it and stops polling.
    Task.objects.filter(pk=running.pk).update(
        status=TaskStatus.REVIEW, lease_owner="", lease_expires_at=None
    )
    TaskEvent.objects.create(
        task=running,
        kind=EventKind.SUBMITTED,
        actor_kind=ActorKind.WORKER,
        actor_label="worker-1",
        from_status="in_progress",
        to_status="review",
    )
    expect(page.locator("#task-status")).to_have_text("Review")
    expect(page.locator("#live")).not_to_have_attribute("hx-trigger", re.compile("every"))
    expect(page.locator(".live-dot")).to_have_count(0)


def test_close_from_the_review_queue_and_from_the_task_page(page, login, founder, screenshot):
    older = transcript_task(status=TaskStatus.REVIEW, title="Summarise the project notes")
    newer = transcript_task(status=TaskStatus.REVIEW, title="Compare the two supplier quotes")
    third = transcript_task(status=TaskStatus.REVIEW, title="Draft the launch announcement")
    login("founder")
    page.set_viewport_size({"width": 1440, "height": 900})
    expect(page.locator("#review-badge")).to_have_text("3")
    page.get_by_role("banner").get_by_role("link", name=re.compile("^Review")).click()
    rows = page.locator("#review-rows tbody tr")
    expect(rows).to_have_count(3)
    expect(rows.first).to_contain_text("Summarise the project notes")  # oldest first
    # The answer, the verdict and the artifacts on each row.
    row = page.locator(f"tr[data-task='{older.pk}']")
    expect(row).to_contain_text("The launch moved from April 2 to April 16")
    expect(row.locator(".review-verdict")).to_contain_text("approved")
    expect(row.get_by_role("link", name="summary.md")).to_be_visible()
    screenshot("review.png")
    # Bulk close: tick two rows, one click, through the close service.
    row.locator("input[name=task]").check()
    page.locator(f"tr[data-task='{third.pk}'] input[name=task]").check()
    page.locator("[data-action=bulk-close]").click()
    expect(page.locator(".flash-success")).to_contain_text(
        f"Closed 2 task(s): #{older.pk}, #{third.pk}."
    )
    expect(page.locator("#review-rows tbody tr")).to_have_count(1)
    expect(page.locator("#review-badge")).to_have_text("1")
    assert status_of(older) == status_of(third) == TaskStatus.DONE

    page.goto(f"/tasks/{newer.pk}/")
    page.locator("[data-action=close]").click()
    expect(page.locator("#task-status")).to_have_text("Done")
    expect(page.locator(".flash-success")).to_contain_text("Task closed: done.")
    assert status_of(newer) == TaskStatus.DONE
    expect(page.locator("[data-action=close]")).to_have_count(0)


def test_without_the_permission_there_is_no_close_button_and_the_url_is_403(page, login):
    UserFactory(username="viewer", perms=["tasks.view_task"])
    task = review_task()
    login("viewer")
    page.goto(f"/tasks/{task.pk}/")
    expect(page.locator("#task-status")).to_have_text("Review")
    expect(page.locator("[data-action=close]")).to_have_count(0)
    expect(page.locator("[data-action]")).to_have_count(0)
    token = next(c["value"] for c in page.context.cookies() if c["name"] == "csrftoken")
    response = page.request.post(f"/tasks/{task.pk}/close/", headers={"X-CSRFToken": token})
    assert response.status == 403
    assert "CSRF" not in response.text()
    assert status_of(task) == TaskStatus.REVIEW
    # The admin's review queue offers no close action to this person either.
    page.goto("/admin/tasks/task/?status__exact=review")
    expect(page.locator("select[name=action] option[value=close_tasks]")).to_have_count(0)


def review_task():
    task = TaskFactory(status=TaskStatus.REVIEW, title="Quarterly summary")
    run_for(task, answer="Done.", verdict="approved")
    return task
