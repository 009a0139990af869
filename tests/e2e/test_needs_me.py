"""What needs me, in a real browser: the nav's counts change without a reload when work changes
underneath the page, and a task's files open in the page (Markdown with its <script> shown as
text and never run, a CSV file as a table)."""

import pytest
from playwright.sync_api import expect

from tasks.states import TaskStatus
from tasks.workspace import artifacts_dir
from tests.console.scenes import pending_approval
from tests.factories import ArtifactFactory, TaskFactory, UserFactory

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

# agents.view_agentrun: the worker page, where the first test watches the nav.
PERMS = ["tasks.view_task", "tasks.close_task", "approvals.decide_approval", "agents.view_agentrun"]


@pytest.fixture
def founder():
    return UserFactory(username="founder", perms=PERMS)


def test_the_nav_counts_update_without_a_reload(page, login, founder, settings):
    settings.ACTHELM_CONSOLE_REFRESH_SECONDS = 1
    login("founder")
    page.goto("/workers/")  # any page: the nav is on every one
    expect(page.locator("#needs-me-badge")).to_have_text("0")
    page.evaluate("window.notReloaded = true")
    # Work changes underneath the open page: a task fails, one enters review, one waits.
    TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps")
    TaskFactory(status=TaskStatus.REVIEW)
    pending_approval()
    TaskFactory(status=TaskStatus.REVIEW, is_evaluation=True)  # never counted
    expect(page.locator("#pending-badge")).to_have_text("1")
    expect(page.locator("#review-badge")).to_have_text("1")
    expect(page.locator("#failed-badge")).to_have_text("1")
    expect(page.locator("#needs-me-badge")).to_have_text("3")
    assert page.evaluate("window.notReloaded") is True
    # One click from anywhere: the Needs me page lists them.
    page.get_by_role("link", name="Needs me").click()
    expect(page.locator("#needs-decisions")).to_contain_text("fetch_url")
    expect(page.locator("#needs-failed")).to_contain_text("limit_steps")


def test_the_task_list_refreshes_itself(page, login, founder, settings):
    settings.ACTHELM_CONSOLE_REFRESH_SECONDS = 1
    login("founder")
    page.goto("/?status=ready")
    expect(page.locator("[data-status=ready] .count")).to_have_text("0")
    TaskFactory(title="Arrived while the list was open")
    expect(page.get_by_text("Arrived while the list was open")).to_be_visible()
    expect(page.locator("[data-status=ready] .count")).to_have_text("1")


def test_an_artifact_opens_in_the_page_markdown_escaped_and_csv_as_a_table(page, login, founder):
    task = TaskFactory(status=TaskStatus.REVIEW, title="Write the report")
    folder = artifacts_dir(task.pk)
    markdown = b"# Quarterly report\n\nRevenue **rose**.\n\n<script>window.pwned = 1</script>\n"
    (folder / "report.md").write_bytes(markdown)
    report = ArtifactFactory(
        task=task, name="report.md", size=len(markdown), content_type="text/markdown"
    )
    table = b"region,total\nnorth,12\nsouth,<b>7</b>\n"
    (folder / "totals.csv").write_bytes(table)
    ArtifactFactory(task=task, name="totals.csv", size=len(table), content_type="text/csv")
    dialogs = []
    page.on("dialog", lambda dialog: (dialogs.append(dialog.message), dialog.dismiss()))
    login("founder")
    page.goto(f"/tasks/{task.pk}/")
    page.locator("#task-files").get_by_role("link", name="report.md").click()
    preview = page.locator("#file-preview .markdown")
    expect(preview.locator("h1")).to_have_text("Quarterly report")
    expect(preview.locator("strong")).to_have_text("rose")
    expect(preview).to_contain_text("<script>window.pwned = 1</script>")  # shown as text
    assert page.evaluate("window.pwned") is None and dialogs == []
    expect(page.get_by_role("link", name="Download")).to_have_attribute(
        "href", f"/tasks/{task.pk}/artifacts/{report.pk}/"
    )
    page.go_back()
    page.locator("#task-files").get_by_role("link", name="totals.csv").click()
    cells = page.locator("#file-preview table.csv")
    expect(cells.locator("th")).to_have_text(["region", "total"])
    expect(cells.locator("tbody tr")).to_have_count(2)
    expect(cells.locator("tbody tr").nth(1).locator("td").nth(1)).to_have_text("<b>7</b>")
