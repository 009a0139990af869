"""The task page's live panel in Chromium (issue 52): while a task runs, the text and tool call
its turn is writing appear on the page before the turn is stored — published by the worker's side
of the live channel (`tasks.live.Publisher`, fed by a real LISTEN on the watch channel, as the
worker's listener feeds it) through real NOTIFYs — and give way to the stored turn when the
page's refresh shows it."""

import time

import pytest
from playwright.sync_api import expect

from agents.models import Turn
from tasks import livestream
from tasks.states import EventKind, TaskStatus
from tests.factories import AgentRunFactory, TaskEventFactory, TaskFactory, TurnFactory, UserFactory
from tests.live.helpers import WorkerSide

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]

WRITTEN = "Reading notes.txt: the launch moves to April"


@pytest.fixture(autouse=True)
def fresh_hub(monkeypatch):
    monkeypatch.setattr(livestream, "_hub", None)


def test_the_text_being_written_shows_before_the_turn_is_stored(page, login):
    UserFactory(username="watcher", perms=["tasks.view_task"])
    task = TaskFactory(status=TaskStatus.IN_PROGRESS, title="Summarise the notes")
    run = AgentRunFactory(task=task)
    TaskEventFactory(task=task, kind=EventKind.CLAIMED, run=run)
    with WorkerSide() as worker:
        login("watcher")
        page.goto(f"/tasks/{task.pk}/")
        panel = page.locator("#live-turn")
        expect(panel).to_be_hidden()
        worker.wait_watched(task.pk, seconds=10)  # the page's stream announced the task

        worker.publisher.publish(task.pk, run.pk, "turn", {})
        for word in WRITTEN.split(" "):
            worker.publisher.publish(task.pk, run.pk, "text", {"text": word + " "})
            time.sleep(0.05)
        worker.publisher.publish(
            task.pk, run.pk, "tool_call", {"index": 0, "name": "read_file", "arguments": '{"pa'}
        )
        worker.publisher.publish(
            task.pk, run.pk, "tool_call", {"index": 0, "name": "", "arguments": 'th": "notes.txt"}'}
        )
        expect(panel).to_be_visible(timeout=3000)
        expect(page.locator("#live-turn-text")).to_have_text(WRITTEN + " ")
        expect(panel.locator(".call code.tool")).to_have_text("read_file")
        expect(panel.locator(".call pre.args")).to_have_text('{"path": "notes.txt"}')
        expect(page.locator("#live-turn-note")).to_contain_text("not stored yet")
        # shown before it was stored: no turn yet, and the transcript does not hold the text
        assert not Turn.objects.filter(task=task).exists()
        expect(page.locator(".transcript")).not_to_contain_text("the launch moves to April")

        # the step commits the turn, then the worker says so: the refresh shows the stored one
        TurnFactory(run=run, task=task, index=1, content=WRITTEN)
        TaskEventFactory(task=task, kind=EventKind.MODEL_TURN, run=run)
        worker.publisher.publish(task.pk, run.pk, "end", {"stored": True})
        expect(page.locator(".transcript")).to_contain_text(WRITTEN, timeout=6000)
        expect(panel).to_be_hidden(timeout=6000)
