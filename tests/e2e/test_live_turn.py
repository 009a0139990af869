"""The task page's live panel in Chromium (issue 52): while a task runs, the text and tool call
its turn is writing appear on the page before the turn is stored — published by the worker's side
of the live channel (`tasks.live.Publisher`, fed by a real LISTEN on the watch channel, as the
worker's listener feeds it) through real NOTIFYs — and give way to the stored turn when the
page's refresh shows it. The last test runs it all for real: a worker process, and the scripted
model streaming its answer slowly on loopback."""

import time

import pytest
from playwright.sync_api import expect

from agents.engine.run.intake import task_create
from agents.models import Turn
from console.views import tasks as console_tasks
from core.actors import Actor
from tasks import livestream
from tasks.states import EventKind, TaskStatus
from tests.agents.scripted import scripted_model
from tests.factories import AgentRunFactory, TaskEventFactory, TaskFactory, TurnFactory, UserFactory
from tests.fakes.model_server import ScriptedModelServer, reply_text
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


# Counts the page's refreshes and the stored events its live stream delivered (a listener added
# before live.js adds its own, so it has run by the time the test reads it).
WATCH_THE_PAGE = """
window.__settles = 0;
window.__stored = [];
document.addEventListener("htmx:afterSettle", function () { window.__settles += 1; });
var Original = window.EventSource;
window.EventSource = function (url, options) {
  var source = new Original(url, options);
  source.addEventListener("task_event", function (event) {
    window.__stored.push(JSON.parse(event.data).kind);
  });
  return source;
};
"""


def test_the_panel_gives_way_as_soon_as_the_page_shows_the_stored_turn(page, login, monkeypatch):
    """A refresh that began before the turn was stored can show it: the end (which names the
    turn) then empties the panel at once, not a refresh later, so the page never shows the turn
    twice for a refresh's length; and a stored event read late for that turn does not empty the
    next turn's panel."""
    monkeypatch.setattr(console_tasks, "POLL_SECONDS", 5)  # a refresh is far from the next
    UserFactory(username="watcher", perms=["tasks.view_task"])
    task = TaskFactory(status=TaskStatus.IN_PROGRESS, title="Summarise the notes")
    run = AgentRunFactory(task=task)
    TaskEventFactory(task=task, kind=EventKind.CLAIMED, run=run)
    page.add_init_script(WATCH_THE_PAGE)
    with WorkerSide() as worker:
        login("watcher")
        page.goto(f"/tasks/{task.pk}/")
        panel, text = page.locator("#live-turn"), page.locator("#live-turn-text")
        worker.wait_watched(task.pk, seconds=10)
        worker.publisher.publish(task.pk, run.pk, "turn", {})
        worker.publisher.publish(task.pk, run.pk, "text", {"text": WRITTEN})
        expect(text).to_have_text(WRITTEN, timeout=3000)

        # committed; a refresh shows it before the worker's end comes: on the page twice
        TurnFactory(run=run, task=task, index=1, content=WRITTEN)
        expect(page.locator("#turn-1")).to_contain_text(WRITTEN, timeout=12_000)
        expect(panel).to_be_visible()
        settles = page.evaluate("window.__settles")
        worker.publisher.publish(task.pk, run.pk, "end", {"stored": True, "turn": 1})
        expect(panel).to_be_hidden(timeout=3000)
        assert page.evaluate("window.__settles") == settles  # the end did it, no refresh

        # the next turn is written; turn 1's stored event, read late, leaves it shown
        worker.publisher.publish(task.pk, run.pk, "turn", {})
        worker.publisher.publish(task.pk, run.pk, "text", {"text": "Next, the budget."})
        expect(text).to_have_text("Next, the budget.", timeout=3000)
        TaskEventFactory(task=task, kind=EventKind.MODEL_TURN, run=run, data={"turn": 1})
        page.wait_for_function("window.__stored.includes('model_turn')", timeout=5000)
        expect(panel).to_be_visible()
        expect(text).to_have_text("Next, the budget.")
        expect(page.locator("#live-turn-note")).to_contain_text("not stored yet")


STREAMED = (
    "The notes say the launch moves to April because the venue is booked until then, "
    "and the team agrees to use the extra weeks for a second round of testing"
)


def test_a_real_worker_streams_its_turn_onto_the_page_before_storing_it(page, login, start_worker):
    UserFactory(username="watcher", perms=["tasks.view_task"])
    words = len(STREAMED.split())
    # The model waits 2 s (the page opens meanwhile), then writes word by word over 4 s.
    step = reply_text(STREAMED, delay=2.0, pace=4.0 / words)
    with ScriptedModelServer([step]) as server:
        task = task_create(
            actor=Actor.system("test"),
            title="Summarise the notes",
            instruction="Summarise the notes.",
            tools=[],
            model=scripted_model(server),
        )
        login("watcher")
        page.goto(f"/tasks/{task.pk}/")
        start_worker()
        panel, text = page.locator("#live-turn"), page.locator("#live-turn-text")
        expect(panel).to_be_visible(timeout=15_000)
        expect(text).to_contain_text("The notes say", timeout=5000)
        # part of the turn on the page, none of it stored yet
        assert not Turn.objects.filter(task=task, role="assistant").exists()
        assert text.inner_text().strip() != STREAMED
        expect(page.locator(".transcript")).not_to_contain_text("second round of testing")
        # then the stored turn takes its place
        expect(page.locator(".transcript")).to_contain_text(STREAMED, timeout=15_000)
        expect(panel).to_be_hidden(timeout=6000)
        assert server.completion_requests[0].json["stream"] is True
    assert Turn.objects.get(task=task, role="assistant").content == STREAMED
