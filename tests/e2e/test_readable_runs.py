"""What the console, the CLI and the API say about a run, read in a real browser with a real worker
process and the scripted model on loopback: a run a person accepted over the supervisor's
rejection reads "accepted by NAME: REASON" wherever a verdict shows; the runs table and the nav
fit a 1360 px and a 1024 px window; the timeline speaks words; amounts are fixed-point strings
and counts whole numbers; an approval's file content is edited as text."""

import json
import re
from decimal import Decimal

import httpx
import pytest
from playwright.sync_api import expect

from acthelm_site.api.tokens import token_create
from agents.engine.run.intake import task_create
from agents.models import Artifact
from core.actors import Actor
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.e2e.test_overrule import create_and_get_rejected, first_attempt
from tests.e2e.test_worker import PERMS, scripted_model, wait_for_status
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

REASON = "report.md holds the bullets I wanted"
ACCEPTED = f"accepted by founder: {REASON}"
MONEY = re.compile(r"^-?\d+\.\d+$|^-?\d+$")  # fixed point, never "0E-8"


@pytest.fixture
def founder():
    from tests.factories import UserFactory

    return UserFactory(username="founder", perms=[*PERMS, "agents.view_agentrun"])


def nav_fits_one_line(page) -> None:
    """The nav is one line: every visible link, menu and button in it starts at the same
    height (within a few pixels of their own alignment), and it is as tall as one of them."""
    tops = page.locator(
        ".topbar nav a:visible, .topbar nav summary:visible, .topbar nav button:visible"
    ).evaluate_all("els => els.map(e => e.getBoundingClientRect().top)")
    assert len(tops) >= 8 and max(tops) - min(tops) < 6, tops
    height = page.locator(".topbar nav").evaluate("e => e.getBoundingClientRect().height")
    assert height < 50, height


def within_viewport(page, selector: str) -> None:
    width = page.viewport_size["width"]
    for box in page.locator(selector).evaluate_all(
        "els => els.map(e => { const r = e.getBoundingClientRect(); return [r.left, r.right]; })"
    ):
        assert box[0] >= 0 and box[1] <= width, (selector, box, width)


def money_and_counts(doc: dict) -> None:
    """Every amount a fixed-point string and every count a whole number, in a task's JSON."""
    for run in doc["runs"]:
        assert run["cost"] is None or MONEY.match(run["cost"]), run["cost"]
        for count in ("input_tokens", "output_tokens", "model_turns", "network_requests"):
            assert type(run[count]) is int, (count, run[count])
    for count in ("model_turns", "tokens", "network_requests"):
        assert type(doc["usage"][count]) is int, (count, doc["usage"][count])
    assert "E" not in json.dumps(doc.get("cost")) and "E-" not in json.dumps(doc["usage"])


def test_an_accepted_run_reads_accepted_by_its_person_everywhere(
    page, login, founder, start_worker, manage, tmp_path, live_server, screenshot
):
    with ScriptedModelServer(flavor="openai") as server:
        server.enqueue(*first_attempt())
        task_id = create_and_get_rejected(page, login, server, start_worker, tmp_path)
        page.fill("#accept-form textarea[name=reason]", REASON)
        page.locator("#accept-form [data-action=accept]").click()
        expect(page.locator("#task-status")).to_have_text("Review")

    # The task page: the result panel and the runs table say who accepted it and why.
    expect(page.locator("#result-verdict")).to_contain_text("Accepted by founder")
    expect(page.locator("#result-verdict")).not_to_contain_text("rejected")
    outcome = page.locator("tr[data-run='1'] .run-outcome")
    expect(outcome).to_contain_text(ACCEPTED)
    expect(outcome.locator("[data-verdict]")).to_have_attribute("data-verdict", "accepted")
    # The timeline speaks words: no internal ids, no JSON, state words not codes.
    timeline = page.locator(".timeline")
    expect(timeline).to_contain_text("Ready → In progress")
    for internal in ("newest run id", "claim count", "{", "in_progress"):
        expect(timeline).not_to_contain_text(internal)

    # At 1360 px and 1024 px the nav is one line and the runs table's verdict is not clipped.
    for width in (1360, 1024):
        page.set_viewport_size({"width": width, "height": 900})
        page.reload()
        nav_fits_one_line(page)
        within_viewport(page, "table.runs td.run-outcome")
        within_viewport(page, "table.runs")
    page.set_viewport_size({"width": 1360, "height": 900})
    page.reload()
    screenshot("task-accepted.png")

    # The review queue and its header.
    page.goto("/review/")
    row = page.locator(f"tr[data-task='{task_id}']")
    expect(row.locator(".review-verdict")).to_contain_text(ACCEPTED)
    expect(row.locator(".verdict-rejected")).to_have_count(0)
    expect(page.locator(".page-head")).to_contain_text("a person accepted")

    # The CLI: the verdict once, in words; --json with fixed-point money and whole counts.
    shown = manage("acthelm_task", "--user", "founder", "show", str(task_id), check=True)
    assert f"verdict: {ACCEPTED}" in shown.stdout
    assert "approved: approved" not in shown.stdout
    assert re.search(rf"run 1 · .*{re.escape(ACCEPTED)}", shown.stdout), shown.stdout
    as_json = manage(
        "acthelm_task", "--json", "--user", "founder", "show", str(task_id), check=True
    )
    doc = json.loads(as_json.stdout)
    assert doc["verdict_shown"] == "accepted" and doc["verdict_words"] == ACCEPTED
    assert doc["runs"][0]["verdict_words"] == ACCEPTED
    assert doc["runs"][0]["accepted"]["by"] == "founder"
    money_and_counts(doc)
    assert Decimal(doc["cost"]) == 0 and doc["cost"] == "0.00000000"

    # The API, over HTTP with a token.
    secret = token_create(user=founder, name="e2e").secret
    api = httpx.get(
        f"{live_server.url}/api/tasks/{task_id}",
        headers={"Authorization": f"Bearer {secret}"},
    )
    assert api.status_code == 200, api.text
    body = api.json()
    assert body["runs"][0]["verdict_words"] == ACCEPTED
    assert body["runs"][0]["verdict_shown"] == "accepted"
    assert body["runs"][0]["accepted"]["reason"] == REASON
    money_and_counts(body)


CONTENT = 'Line one with "quotes"\nLine two\\with a backslash\n'
EDITED = 'Line one with "quotes"\nLine two, edited\n'


def test_an_approval_is_requested_once_and_its_file_edited_as_text(
    page, login, founder, start_worker
):
    with ScriptedModelServer(flavor="openai") as server:
        server.enqueue(
            reply_tool_calls([("update_plan", {"steps": [{"step": "Write"}]})]),
            reply_tool_calls(
                [("write_artifact", {"name": "notes.md", "content": CONTENT})], text="Writing."
            ),
            reply_text("notes.md is written."),
        )
        task = task_create(
            actor=Actor.system("test"),
            title="Write the notes",
            instruction="Write notes.md.",
            tools=["update_plan", "write_artifact"],
            tool_policies={"write_artifact": "ask"},
            model=scripted_model(server),
        )
        start_worker()
        wait_for_status(task.pk, TaskStatus.AWAITING_APPROVAL)

        login("founder")
        page.goto("/approvals/")
        expect(page.locator("#approvals-count")).to_have_text("1")
        card = page.locator("article.decision", has_text="notes.md")
        card.locator("details.answer-edit summary").click()
        content = card.locator("textarea[data-argument=content]")
        # The file's content is text to edit, not a JSON-escaped string.
        expect(content).to_have_value(CONTENT)
        content.fill(EDITED)
        card.locator("[data-action=approve-edited]").click()
        expect(card).to_contain_text("Approved with edited arguments")
        # The headings count what still waits, as the nav does.
        expect(page.locator("#approvals-count")).to_have_text("0")
        expect(page.locator("#pending-badge")).to_have_text("0")

        wait_for_status(task.pk, TaskStatus.REVIEW)
        page.goto(f"/tasks/{task.pk}/")
        expect(page.locator("#task-status")).to_have_text("Review")
    artifact = Artifact.objects.get(task=task, name="notes.md")
    assert artifact.size == len(EDITED.encode())
    timeline = page.locator(".timeline tbody tr")
    requested = timeline.filter(has_text="Approval requested")
    expect(requested).to_have_count(1)
    expect(requested).to_contain_text("In progress → Awaiting approval")
    expect(requested).to_contain_text("write_artifact")
    assert TaskEvent.objects.filter(task=task, kind=EventKind.APPROVAL_REQUESTED).count() == 2
    assert Task.objects.get(pk=task.pk).status == TaskStatus.REVIEW


def test_favicon_is_served(page, live_server):
    response = httpx.get(f"{live_server.url}/favicon.ico")
    assert response.status_code == 200
    assert response.headers["content-type"] == "image/x-icon"
    assert response.content[:4] == b"\x00\x00\x01\x00"  # an icon file


def test_the_retry_card_counts_seconds(page, login, founder):
    from datetime import timedelta

    from django.utils import timezone

    from tests.factories import TaskFactory

    task = TaskFactory(status=TaskStatus.READY, not_before=timezone.now() + timedelta(seconds=40))
    TaskEvent.objects.create(
        task=task,
        kind=EventKind.RETRY_SCHEDULED,
        actor_kind="worker",
        data={"attempt": 1, "of": 3, "delay_seconds": 40, "code": "provider_server_error"},
    )
    login("founder")
    page.goto(f"/tasks/{task.pk}/")
    retry_in = page.locator("#retry-in")
    expect(retry_in).to_have_text(re.compile(r"^in \d+ seconds$"))
    expect(page.locator("#state-retry")).not_to_contain_text("0 minutes")
