"""The console's Change form after a rejection, in a real browser, with a real worker process and
the scripted model on loopback: the form shows the rejection it answers and asks whether the
retry continues the conversation or starts over; continuing, the model's next request is the
stored conversation plus one message with the task as changed."""

import re

import pytest
from playwright.sync_api import expect

from agents.engine.run.prompting import CHANGE_HEAD
from agents.selectors import task_run_facts
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.e2e.test_overrule import ANSWER, INSTRUCTION, REPORT, create_and_get_rejected
from tests.e2e.test_overrule import first_attempt as rejected_attempt
from tests.e2e.test_worker import PERMS
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

CHANGED = INSTRUCTION.replace("summary.md", "report.md")


@pytest.fixture
def founder():
    from tests.factories import UserFactory

    return UserFactory(username="founder", perms=PERMS)


def test_the_change_form_shows_the_rejection_and_continuing_sends_the_change(
    page, login, founder, start_worker, tmp_path, screenshot
):
    with ScriptedModelServer(flavor="openai") as server:
        server.enqueue(
            *rejected_attempt(),
            reply_tool_calls(
                [("write_artifact", {"name": "report.md", "content": REPORT})], text="Again."
            ),
            reply_text("report.md is written."),
        )
        task_id = create_and_get_rejected(page, login, server, start_worker, tmp_path)
        asked = len(server.completion_requests)
        stored = server.completion_requests[-1].json["messages"]

        page.locator("#change-and-retry").click()
        form = page.locator("#task-edit-form")
        expect(form).to_be_visible()
        # The rejection this change answers: the supervisor's reason, the check, the answer.
        answered = page.locator("#rejection-answered")
        expect(answered).to_contain_text("rejected by the supervisor")
        expect(answered.locator("#rejection-reason")).to_contain_text("named_output=summary.md")
        expect(answered.locator('[data-source="default check"]')).to_have_count(1)
        expect(answered).to_contain_text(ANSWER)
        # Continue or start over; continuing is the default.
        choice = page.locator("#retry-then")
        expect(choice.get_by_label(re.compile("^Continue the conversation"))).to_be_checked()
        expect(choice.get_by_label(re.compile("^Start over"))).not_to_be_checked()
        page.fill("#id_instruction", CHANGED)
        screenshot("change-and-retry.png")
        page.locator("[data-action=save_and_retry]").click()
        expect(page.locator("#task-status")).to_have_text("Review", timeout=30_000)

        # The model was asked again: the stored conversation as it was sent, its answer, and
        # one message with the change.
        request = server.completion_requests[asked].json["messages"]
        assert request[: len(stored)] == stored
        assert request[len(stored)]["role"] == "assistant"
        assert request[len(stored)]["content"] == ANSWER
        assert len(request) == len(stored) + 2
        change = request[-1]["content"]
        assert change.startswith(CHANGE_HEAD) and CHANGED in change
        # The rejection was the default check of the old instruction: it no longer applies.
        assert "summary.md" not in change
    task = Task.objects.get(pk=task_id)
    assert task.status == TaskStatus.REVIEW and task.instruction == CHANGED
    assert [f.attempt for f in task_run_facts(task_id)] == [1, 2]
    assert TaskEvent.objects.get(task=task, kind=EventKind.RETRIED).data["change_sent"] == [
        "instruction"
    ]
