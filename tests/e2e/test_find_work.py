"""Finding work and reading runs in a real browser: the tasks list filtered and bookmarked, the
Runs table, the prices page in the nav, and a connection's Test that shows its progress while
the page stays usable (a scripted model on loopback holds its answer)."""

import re
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone
from playwright.sync_api import expect

from agents.models import AgentRun
from agents.states import ModelTestStatus, Role, RunStatus, Verdict
from tasks.states import TaskStatus
from tests.factories import (
    AgentRunFactory,
    ConnectionFactory,
    GoalFactory,
    ModelFactory,
    TaskFactory,
    TurnFactory,
    UserFactory,
)
from tests.fakes.model_server import ScriptedModelServer, reply_text

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def founder():
    return UserFactory(username="founder", perms=["tasks.view_task", "agents.manage_connections"])


def listed(page) -> list[str]:
    return page.locator("#task-rows tbody tr td:nth-child(2)").all_inner_texts()


def test_a_filtered_list_is_a_bookmark(page, login, founder):
    goal = GoalFactory(title="Quarter close")
    TaskFactory(title="Quarterly report", tags=["finance"], goal=goal)
    TaskFactory(title="Quarterly draft", tags=["ops"], goal=goal)
    TaskFactory(title="Team offsite", tags=["finance"])
    login("founder")
    expect(page.locator("#task-rows tbody tr")).to_have_count(3)
    page.fill("#f-q", "quarterly")
    page.fill("#f-tag", "finance")
    page.select_option("#f-goal", str(goal.pk))
    page.get_by_role("button", name="Filter").click()
    # The rows are swapped in place and the address bar holds the filters.
    expect(page.locator("#task-rows tbody tr")).to_have_count(1)
    expect(page).to_have_url(re.compile(r"q=quarterly.*tag=finance.*goal="))
    assert listed(page) == ["Quarterly report"]
    bookmark = page.url

    other = page.context.new_page()
    other.goto(bookmark)
    expect(other.locator("#task-rows tbody tr")).to_have_count(1)
    expect(other.locator("#f-q")).to_have_value("quarterly")
    expect(other.locator("#f-tag")).to_have_value("finance")
    expect(other.locator("#f-goal")).to_have_value(str(goal.pk))
    # Times read exactly and relatively.
    expect(other.locator("#task-rows tbody time").first).to_contain_text(" UTC · ")
    other.close()


def test_the_runs_table_reads_each_run(page, login, founder):
    model = ModelFactory(name="qwen-small", connection__name="local")
    task = TaskFactory(title="Summarise notes", status=TaskStatus.PAUSED, model=model)
    start = timezone.now() - timedelta(hours=1)
    rejected = AgentRunFactory(
        task=task,
        number=1,
        claim_count=1,
        model=model,
        status=RunStatus.FAILED,
        verdict=Verdict.REJECTED,
        verdict_reason="summary.md was not written",
        error_code="supervisor_rejected",
        input_tokens=1200,
        output_tokens=300,
        model_turns=3,
        finished_at=start + timedelta(seconds=65),
    )
    TurnFactory(run=rejected, role=Role.ASSISTANT, cost=Decimal("0.0042"))
    AgentRunFactory(
        task=task,
        number=2,
        claim_count=2,
        model=model,
        status=RunStatus.CANCELLED,
        error_code="paused",
        finished_at=start + timedelta(minutes=20),
    )
    AgentRun.objects.filter(task=task).update(started_at=start)
    login("founder")
    page.goto(f"/tasks/{task.pk}/")
    table = page.locator(".runs-card table")
    expect(table.locator("thead")).to_contain_text("Attempt")
    first, second = table.locator("tr[data-run='1']"), table.locator("tr[data-run='2']")
    expect(first).to_contain_text("failed")
    expect(first).to_contain_text("rejected by the supervisor")
    expect(first).to_contain_text("1 min 5 s")
    expect(first).to_contain_text("1200 / 300")
    expect(first).to_contain_text("$0.0042")
    expect(second.locator(".status")).to_have_text("paused")
    expect(second).not_to_contain_text("Cancelled")
    expect(second).to_contain_text("paused by a person")


def test_the_prices_page_is_in_the_nav(page, login, founder):
    ModelFactory(name="priced-model")
    login("founder")
    page.locator("header nav, nav").first.get_by_role("link", name="Prices").click()
    expect(page.locator("h1")).to_have_text("Model prices")
    expect(page.get_by_text("priced-model")).to_be_visible()


def test_a_connection_test_shows_progress_while_the_page_stays_usable(page, login, founder):
    with ScriptedModelServer(flavor="openai", context_length=16384) as server:
        server.enqueue(reply_text("OK", delay=3))  # a slow model
        conn = ConnectionFactory(name="slow-local", base_url=server.url)
        ModelFactory(
            connection=conn,
            name="slow-model",
            supports_tools=False,
            test_status=ModelTestStatus.UNTESTED,
            context_window=None,
        )
        login("founder")
        page.goto("/connections/")
        progress = page.locator(f"#conn-test-{conn.pk}")
        page.locator(f"#conn-{conn.pk} [data-action=test]").click()
        expect(progress).to_contain_text("waiting for the model")
        expect(progress).to_contain_text("slow-model")
        # The page is usable while the model thinks: type into the form, click Test again.
        page.fill("#id_name", "typed-while-testing")
        expect(page.locator("#id_name")).to_have_value("typed-while-testing")
        page.locator(f"#conn-{conn.pk} [data-action=test]").click()
        expect(progress).to_contain_text("passed", timeout=15_000)
        expect(progress).to_contain_text("context window 16384")
        expect(page.locator("#id_name")).to_have_value("typed-while-testing")
        assert len(server.completion_requests) == 1  # the second click started nothing


def test_the_filters_keep_the_url_short_match_tags_in_any_case_and_say_what_is_wrong(
    page, login, founder
):
    TaskFactory(title="Weekly numbers", tags=["Weekly Report"])
    TaskFactory(title="Team offsite", tags=["ops"])
    login("founder")
    page.fill("#f-tag", "weekly report")
    page.get_by_role("button", name="Filter").click()
    # Only what was filled reaches the address bar; the tag matches whatever its case.
    expect(page).to_have_url(re.compile(r"/\?tag=weekly(\+|%20)report$"))
    expect(page.locator("#task-rows tbody tr")).to_have_count(1)
    assert listed(page) == ["Weekly numbers"]
    expect(page.locator("#filter-problems")).to_have_count(0)

    # What the page does not understand it says, instead of listing everything silently.
    page.goto("/?since=yesterday&status=finished")
    problems = page.locator("#filter-problems")
    expect(problems).to_contain_text('since "yesterday" is not a date')
    expect(problems).to_contain_text('status "finished" is not a task state')
    page.goto("/review/?since=2026-13-45")
    expect(page.locator("#filter-problems")).to_contain_text('since "2026-13-45" is not a date')
