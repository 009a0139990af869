"""Overruling the supervisor in a real browser, with a real worker process and the scripted model
on loopback: the form's natural first task is rejected by the default check named_output (the
model wrote report.md, not summary.md); the task page shows the rejected run, and a person
either accepts it into review with a reason or changes the instruction and retries it now."""

import re

import pytest
from playwright.sync_api import expect

from agents.models import AgentRun
from agents.states import Verdict
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.e2e.test_worker import PERMS, scripted_model
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

INSTRUCTION = "Summarise notes.txt in three bullet points and write them to summary.md"
REPORT = "- The launch moved to April 16\n- Marketing is ready\n- Support is briefed\n"
ANSWER = "The three bullet points are in report.md."


@pytest.fixture
def founder():
    from tests.factories import UserFactory

    return UserFactory(username="founder", perms=PERMS)


PLAN = {"steps": [{"step": "Read notes.txt", "status": "in_progress"}, {"step": "Write"}]}


def first_attempt():
    return (
        reply_tool_calls([("update_plan", PLAN)], text="Planning."),
        reply_tool_calls([("read_file", {"path": "notes.txt"})], text="Reading the notes."),
        reply_tool_calls(
            [("write_artifact", {"name": "report.md", "content": REPORT})], text="Writing."
        ),
        reply_text(ANSWER),
    )


def create_and_get_rejected(page, login, server, start_worker, tmp_path) -> int:
    """The natural first task, from the form, run by a worker until the supervisor rejects it."""
    notes = tmp_path / "notes.txt"
    notes.write_text("Launch moved to April 16. Marketing ready. Support briefed.\n")
    model = scripted_model(server)
    login("founder")
    page.goto("/tasks/new/")
    page.fill("#id_title", "Summarise the notes")
    page.fill("#id_instruction", INSTRUCTION)
    page.select_option("#id_model", str(model.pk))
    page.set_input_files("#id_files", str(notes))
    page.get_by_role("button", name="Create task").click()
    expect(page.locator("#task-status")).to_have_text("Ready")
    task_id = int(re.search(r"/tasks/(\d+)/", page.url).group(1))
    start_worker()
    # Rejected, waiting for its retry (60 s away): the page shows the rejected run.
    rejected = page.locator("#rejected-run")
    expect(rejected).to_contain_text("Rejected by the supervisor", timeout=30_000)
    run = AgentRun.objects.get(task_id=task_id)
    assert run.verdict == Verdict.REJECTED
    assert Task.objects.get(pk=task_id).not_before is not None
    expect(rejected).to_contain_text(ANSWER)
    expect(rejected).to_contain_text("named_output=summary.md")
    expect(rejected.locator('[data-source="default check"]')).to_have_count(1)
    # report.md previewed as Markdown, as the review page previews it.
    expect(rejected.locator(".markdown li").first).to_have_text("The launch moved to April 16")
    return task_id


def test_accept_a_rejected_run_into_review_with_a_reason(
    page, login, founder, start_worker, tmp_path
):
    with ScriptedModelServer(flavor="openai") as server:
        server.enqueue(*first_attempt())
        task_id = create_and_get_rejected(page, login, server, start_worker, tmp_path)
        requests = len(server.completion_requests)

        page.fill("#accept-form textarea[name=reason]", "report.md holds the bullets I wanted")
        # The page of a ready task refreshes itself: what the person typed survives a refresh.
        with page.expect_response(lambda r: r.url.endswith(f"/tasks/{task_id}/")):
            pass
        expect(page.locator("#accept-reason")).to_have_value("report.md holds the bullets I wanted")
        page.locator("#accept-form [data-action=accept]").click()
        expect(page.locator("#task-status")).to_have_text("Review")
        accepted = page.locator("#accepted-by")
        expect(accepted).to_contain_text("founder")
        expect(accepted).to_contain_text("report.md holds the bullets I wanted")
        # The failed check stays visible; the timeline says who accepted and why.
        expect(page.locator("#rejected-run")).to_contain_text("named_output=summary.md")
        expect(page.locator("#rejected-run [data-source='default check']")).to_have_count(1)
        expect(page.get_by_text("Accepted by a person").first).to_be_visible()
        expect(page.locator(".answer").first).to_contain_text(ANSWER)

        # The review page has it with that run's answer; a person closes it there.
        page.goto("/review/")
        expect(page.get_by_text(ANSWER).first).to_be_visible()
        assert len(server.completion_requests) == requests  # no model was asked
    task = Task.objects.get(pk=task_id)
    assert task.status == TaskStatus.REVIEW and task.not_before is None
    event = TaskEvent.objects.get(task=task, kind=EventKind.ACCEPTED)
    assert event.actor_label == "founder" and event.data["failed_checks"][0]["source"] == (
        "default check"
    )


def test_change_the_instruction_and_retry_now(page, login, founder, start_worker, tmp_path):
    with ScriptedModelServer(flavor="openai") as server:
        server.enqueue(
            *first_attempt(),
            # The retry, with the instruction that names the file the model writes.
            reply_tool_calls(
                [("write_artifact", {"name": "report.md", "content": REPORT})], text="Again."
            ),
            reply_text("report.md is written."),
        )
        task_id = create_and_get_rejected(page, login, server, start_worker, tmp_path)

        page.locator("#change-and-retry").click()
        expect(page.locator("#task-edit-form")).to_be_visible()
        page.fill("#id_instruction", INSTRUCTION.replace("summary.md", "report.md"))
        page.locator("[data-action=save_and_retry]").click()
        expect(page.locator("#task-status")).to_have_text("Review", timeout=30_000)
        expect(page.get_by_text("Supervisor: approved")).to_be_visible()
        expect(page.locator("#timeline, .timeline").first).to_contain_text("Settings edited")
    task = Task.objects.get(pk=task_id)
    assert task.instruction.endswith("report.md")
    edited = TaskEvent.objects.get(task=task, kind=EventKind.EDITED)
    assert edited.data["before"]["instruction"] == INSTRUCTION
    assert AgentRun.objects.filter(task=task).count() == 2
    assert task.status == TaskStatus.REVIEW
