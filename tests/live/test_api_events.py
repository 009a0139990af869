"""`GET /api/tasks/{id}/events` on real PostgreSQL with real LISTEN/NOTIFY: the token refused,
the stored events replayed after Last-Event-ID, a live delta delivered within a second, the
stream ended when the task settles, and a clear 503 past the process's bound of viewers."""

import time

import pytest

from agents.actions.task import task_cancel
from core.actors import Actor
from tasks import livestream
from tasks.states import EventKind, TaskStatus
from tests.api.conftest import ALL_PERMS, client_for
from tests.factories import AgentRunFactory, TaskEventFactory, TaskFactory
from tests.live.helpers import StreamReader, WorkerSide, parse_sse

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def api():
    return client_for("founder", ALL_PERMS)


@pytest.fixture(autouse=True)
def fresh_hub(monkeypatch):
    """Each test its own hub (the process's one is made on first use); at its end no viewer
    is left and the hub's connection is closed."""
    monkeypatch.setattr(livestream, "_hub", None)
    yield
    hub = livestream._hub
    if hub is not None:
        assert hub.viewer_count() == 0
        thread = hub._thread
        if thread is not None:
            thread.join(5)
            assert not thread.is_alive()


def url(task_id: int) -> str:
    return f"/api/tasks/{task_id}/events"


def test_refused_without_a_token_a_valid_token_or_the_permission(api):
    task = TaskFactory()
    anonymous = client_for("anon", [])
    anonymous.token = None
    answer = anonymous.get(url(task.pk))
    assert answer.status_code == 401
    assert answer.json()["code"] == "token_missing"
    assert 'Bearer realm="acthelm"' in answer["WWW-Authenticate"]
    forged = client_for("forger", ALL_PERMS)
    forged.token = "acthelm_notarealtoken"
    assert forged.get(url(task.pk)).status_code == 401
    assert client_for("nobody", []).get(url(task.pk)).status_code == 403
    assert api.get(url(999999)).status_code == 404
    assert livestream.hub().viewer_count() == 0  # none of them holds a place


def test_stored_events_are_replayed_after_last_event_id_and_a_settled_task_ends(api):
    task = TaskFactory(status=TaskStatus.DONE)
    first, second, third = (
        TaskEventFactory(task=task, kind=kind)
        for kind in (EventKind.CREATED, EventKind.MODEL_TURN, EventKind.CLOSED)
    )
    answer = api.get(url(task.pk), headers={"Last-Event-ID": str(first.pk)})
    assert answer.status_code == 200
    assert answer["Content-Type"] == "text/event-stream"
    messages = parse_sse(answer.streaming_content)
    assert [(m["event"], m.get("id")) for m in messages] == [
        ("task_event", str(second.pk)),
        ("task_event", str(third.pk)),
        ("end", None),
    ]
    assert messages[0]["data"]["kind"] == "model_turn"
    assert messages[-1]["data"] == {"status": "done"}
    everything = parse_sse(api.get(url(task.pk)).streaming_content)
    assert [m.get("id") for m in everything[:-1]] == [str(e.pk) for e in (first, second, third)]
    assert livestream.hub().viewer_count() == 0


def test_a_live_delta_arrives_within_a_second_then_new_events_then_the_end(api):
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    run = AgentRunFactory(task=task)
    claimed = TaskEventFactory(task=task, kind=EventKind.CLAIMED, run=run)
    with WorkerSide() as worker:
        answer = api.get(url(task.pk), headers={"Last-Event-ID": str(claimed.pk)})
        assert answer.status_code == 200
        reader = StreamReader(answer)
        reader.start()
        worker.wait_watched(task.pk)  # the web process announced it, the worker heard it
        sent = time.monotonic()
        worker.publisher.publish(task.pk, run.pk, "turn", {})
        worker.publisher.publish(task.pk, run.pk, "text", {"text": "Reading the notes"})
        # The sending thread may take the turn's start alone, the text in the next batch
        # (at most 4 a second): the text must be there within a second, in one or two deltas.
        deltas: list = []
        while ["text", {"text": "Reading the notes"}] not in deltas:
            at, delta = reader.next("delta", seconds=3)
            assert at - sent < 1.0, f"the delta took {at - sent:.2f} s"
            assert "id" not in delta  # a delta is not resumable
            assert delta["data"]["task"] == task.pk and delta["data"]["run"] == run.pk
            deltas += delta["data"]["deltas"]
        worker.publisher.publish(
            task.pk, run.pk, "tool_call", {"index": 0, "name": "read_file", "arguments": "{"}
        )
        _, call = reader.next("delta", seconds=3)
        assert call["data"]["deltas"][0][1]["name"] == "read_file", call
        assert not call["data"]["reset"]
        task_cancel(actor=Actor.person(api.user), task_id=task.pk)
        _, stored = reader.next("task_event", seconds=3)  # committed, then read within a second
        assert stored["data"]["kind"] == "cancelled" and int(stored["id"]) > claimed.pk
        _, end = reader.next("end", seconds=3)
        assert end["data"] == {"status": "cancelled"}
        assert reader.done.wait(3), "the stream did not end at the final state"
    assert livestream.hub().viewer_count() == 0


def test_past_the_bound_a_viewer_is_refused_with_503_and_retry_after(api, settings):
    settings.ACTHELM_LIVE_MAX_VIEWERS = 1
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    held = api.get(url(task.pk))
    assert held.status_code == 200
    reader = StreamReader(held)
    reader.start()
    refused = api.get(url(task.pk))
    assert refused.status_code == 503
    assert refused["Retry-After"] == "5"
    assert refused.json()["code"] == "too_many_viewers"
    TaskFactory._meta.model.objects.filter(pk=task.pk).update(status=TaskStatus.FAILED)
    assert reader.done.wait(5)  # the task settled: the place is free again
    again = api.get(url(task.pk))
    assert again.status_code == 200
    again.close()  # a client gone before the first byte: its place is given back
    assert livestream.hub().viewer_count() == 0


def test_a_server_that_runs_one_request_at_a_time_is_refused_at_once(api):
    """gunicorn's sync worker (its default): a stream would hold the process's only request
    slot until the worker timeout killed it, every page waiting meanwhile (measured: /healthz
    answered after 41 s, the stream cut at 30 s and the worker SIGKILLed). `make serve` runs
    threads; under the sync worker the stream is refused, 503 without Retry-After."""
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    sync = {"SERVER_SOFTWARE": "gunicorn/23.0.0", "wsgi.multithread": False}
    answer = api.client.get(url(task.pk), headers={"Authorization": f"Bearer {api.token}"}, **sync)
    assert answer.status_code == 503
    assert answer.json()["code"] == "live_unavailable"
    assert "--threads" in answer.json()["message"]
    assert "Retry-After" not in answer
    threaded = {"SERVER_SOFTWARE": "gunicorn/23.0.0", "wsgi.multithread": True}
    answer = api.client.get(
        url(task.pk), headers={"Authorization": f"Bearer {api.token}"}, **threaded
    )
    assert answer.status_code == 200
    answer.close()


def test_a_viewer_arriving_mid_turn_is_sent_what_was_written_so_far(api):
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    run = AgentRunFactory(task=task)
    with WorkerSide() as worker:
        worker.publisher.publish(task.pk, run.pk, "turn", {})
        worker.publisher.publish(task.pk, run.pk, "text", {"text": "Written before "})
        worker.publisher.publish(task.pk, run.pk, "text", {"text": "anyone watched."})
        assert worker.publisher.sent == 0  # nobody watched: nothing was sent
        answer = api.get(url(task.pk))
        reader = StreamReader(answer)
        reader.start()
        _, caught_up = reader.next("delta", seconds=5)
        assert caught_up["data"]["reset"] is True
        assert caught_up["data"]["deltas"] == [["text", {"text": "Written before anyone watched."}]]
        worker.publisher.publish(task.pk, run.pk, "text", {"text": " And after."})
        _, more = reader.next("delta", seconds=3)
        assert more["data"]["reset"] is False
        assert more["data"]["deltas"] == [["text", {"text": " And after."}]]
        TaskFactory._meta.model.objects.filter(pk=task.pk).update(status=TaskStatus.DONE)
        assert reader.done.wait(5)
