"""The console while a real worker process runs tasks against the scripted OpenAI-compatible model
server: the task page grows as turns are written, approvals decided in the inbox let the task go on,
and the person closes the result."""

import re
import time

import pytest
from playwright.sync_api import expect

from agents.engine.run.intake import task_create
from agents.models import Connection, Model, ToolCall
from agents.states import ToolCallStatus
from core.actors import Actor
from tasks.models import Task
from tasks.states import TaskStatus
from tests.fakes.http_target import HttpTarget
from tests.fakes.model_server import (
    ScriptedModelServer,
    reply_error,
    reply_text,
    reply_tool_calls,
)

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

PERMS = [
    "tasks.view_task",
    "tasks.add_task",
    "tasks.close_task",
    "tasks.operate_task",
    "approvals.decide_approval",
]
PLAN = {
    "steps": [
        {"step": "Read notes.txt", "status": "in_progress"},
        {"step": "Answer with the decision", "status": "pending"},
    ]
}
ANSWER = "The launch moved from April 2 to April 16."


@pytest.fixture
def founder():
    from tests.factories import UserFactory

    return UserFactory(username="founder", perms=PERMS)


def scripted_model(server) -> Model:
    conn = Connection.objects.create(
        name="scripted", kind="openai_compatible", base_url=server.url, cost_tier="zero_cost"
    )
    return Model.objects.create(
        connection=conn,
        name="test-model",
        supports_tools=True,
        test_status="passed",
        context_window=100_000,
    )


def wait_for_status(task_id: int, status: str, timeout: float = 45) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if Task.objects.filter(pk=task_id, status=status).exists():
            return
        time.sleep(0.2)
    raise AssertionError(f"task {task_id} did not reach {status}")


def test_watch_the_transcript_grow_while_a_worker_runs_the_task(
    page, login, founder, start_worker, tmp_path
):
    notes = tmp_path / "notes.txt"
    notes.write_text("2024-03-15 Decision: move the launch from April 2 to April 16.\n")
    with ScriptedModelServer(flavor="openai") as server:
        # Each answer takes a few seconds, longer than the page's 2 s poll.
        server.enqueue(
            reply_tool_calls([("update_plan", PLAN)], text="I will plan first.", delay=3),
            reply_tool_calls(
                [("read_file", {"path": "notes.txt"})], text="Reading the notes.", delay=3
            ),
            reply_text(ANSWER, delay=3),
        )
        model = scripted_model(server)
        login("founder")
        page.goto("/tasks/new/")
        page.fill("#id_title", "When is the launch?")
        page.fill("#id_instruction", "Read notes.txt and say when the launch is.")
        page.select_option("#id_model", str(model.pk))
        page.set_input_files("#id_files", str(notes))
        page.get_by_role("button", name="Create task").click()
        expect(page.locator("#task-status")).to_have_text("Ready")
        task_id = int(re.search(r"/tasks/(\d+)/", page.url).group(1))

        start_worker()
        expect(page.locator("#task-status")).to_have_text("In progress", timeout=20_000)
        expect(page.locator(".live-dot")).to_be_visible()
        transcript = page.locator(".transcript")
        expect(transcript.get_by_text("I will plan first.")).to_be_visible(timeout=20_000)
        # The transcript grows turn by turn: the answer is not there yet.
        expect(page.locator(".transcript")).not_to_contain_text(ANSWER)
        expect(page.locator(".plan")).to_contain_text("Read notes.txt")
        expect(transcript.get_by_text("Reading the notes.")).to_be_visible(timeout=20_000)
        expect(page.locator(".call", has_text="read_file")).to_contain_text(
            "move the launch from April 2 to April 16", timeout=20_000
        )
        expect(page.locator("#task-status")).to_have_text("Review", timeout=30_000)
        expect(page.locator(".transcript")).to_contain_text(ANSWER)
        expect(page.locator(".answer")).to_contain_text(ANSWER)
        expect(page.get_by_text("Supervisor: approved")).to_be_visible()
        # Settled for now: the page stops polling.
        expect(page.locator(".live-dot")).to_have_count(0)
        assert page.locator("#live").get_attribute("hx-trigger") is None

        page.locator("[data-action=close]").click()
        expect(page.locator("#task-status")).to_have_text("Done")
    assert Task.objects.get(pk=task_id).status == TaskStatus.DONE
    assert len(server.completion_requests) == 3


def test_approve_one_fetch_and_deny_another_and_the_task_goes_on(
    page, login, founder, start_worker
):
    with HttpTarget() as target, ScriptedModelServer(flavor="openai") as server:
        target.route("/q3.txt", body=b"Q3 revenue: 1.2M")
        target.route("/payroll.txt", body=b"must not be fetched")
        allowed, refused = f"{target.url}/q3.txt", f"{target.url}/payroll.txt"
        server.enqueue(
            reply_tool_calls([("update_plan", PLAN)]),
            reply_tool_calls(
                [("fetch_url", {"url": allowed}), ("fetch_url", {"url": refused})],
                text="Fetching both reports.",
            ),
            reply_text("Q3 revenue was 1.2M; the payroll report was denied.", delay=1),
        )
        task = task_create(
            actor=Actor.system("test"),
            title="Collect the Q3 reports",
            instruction="Fetch the two reports and summarise them.",
            tools=["update_plan", "fetch_url"],
            model=scripted_model(server),
        )
        start_worker()
        wait_for_status(task.pk, TaskStatus.AWAITING_APPROVAL)

        login("founder")
        expect(page.locator("#pending-badge")).to_have_text("2")
        page.goto("/approvals/")
        approve_card = page.locator("article.decision", has_text="/q3.txt")
        deny_card = page.locator("article.decision", has_text="/payroll.txt")
        expect(approve_card).to_contain_text("The domain is not in the task's allowed list")
        approve_card.locator("[data-action=approve]").click()
        expect(approve_card).to_contain_text("Approved: fetch_url")
        assert Task.objects.get(pk=task.pk).status == TaskStatus.AWAITING_APPROVAL
        deny_card.locator("[data-action=deny]").click()
        expect(deny_card).to_contain_text("Denied: fetch_url")
        expect(page.locator("#pending-badge")).to_have_text("0")

        page.goto(f"/tasks/{task.pk}/")
        expect(page.locator("#task-status")).to_have_text("Review", timeout=30_000)
        fetched = page.locator(".call", has_text="/q3.txt")
        expect(fetched).to_contain_text("Succeeded")
        expect(fetched).to_contain_text("Q3 revenue: 1.2M")
        expect(page.locator(".call", has_text="/payroll.txt")).to_contain_text("Denied by a person")
        expect(page.locator(".answer")).to_contain_text("Q3 revenue was 1.2M")
    assert target.counts["/q3.txt"] == 1 and target.counts["/payroll.txt"] == 0
    statuses = dict(ToolCall.objects.filter(task=task).values_list("tool", "status"))
    assert statuses["update_plan"] == ToolCallStatus.SUCCEEDED


def test_attempts_read_as_the_setting_counts_them(
    page, login, founder, start_worker, worker_env, settings
):
    """ACTHELM_MAX_ATTEMPTS=3 is three attempts, the first run among them: the page counts
    them as the setting does, from the first failure to the error loop."""
    settings.ACTHELM_MAX_ATTEMPTS = 3
    worker_env |= {"ACTHELM_MAX_ATTEMPTS": "3", "ACTHELM_RETRY_DELAYS": "600"}
    with ScriptedModelServer([reply_error(500)] * 5, flavor="openai") as server:
        task = task_create(
            actor=Actor.system("test"),
            title="Summarise the notes",
            instruction="Summarise the notes.",
            tools=[],
            model=scripted_model(server),
        )
        start_worker()
        login("founder")
        page.goto(f"/tasks/{task.pk}/")
        attempts, retry = page.locator("#task-attempts"), page.locator("#state-retry")
        expect(attempts).to_have_text("1 of 3 attempts failed", timeout=20_000)
        expect(retry).to_contain_text("Attempt 2 of 3 scheduled after provider_server_error")
        page.locator("[data-action=retry_now]").click()
        expect(attempts).to_have_text("2 of 3 attempts failed", timeout=20_000)
        expect(retry).to_contain_text("Attempt 3 of 3 scheduled after provider_server_error")
        page.locator("[data-action=retry_now]").click()
        expect(page.locator("#task-status")).to_have_text("Failed", timeout=20_000)
        expect(attempts).to_have_text("all 3 attempts failed")
        expect(page.locator(".failure")).to_contain_text(
            "error_loop All 3 attempts failed with the same error (provider_server_error): HTTP 500"
        )
        assert len(server.completion_requests) == 3
