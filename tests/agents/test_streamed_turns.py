"""A real worker process streams its model's turns to whoever watches (issue 52): the scripted
model answers in Server-Sent Events, slowly, on loopback; a watcher announces the task on the
watch channel, as a web process does, and LISTENs on the live channel. The pieces reach it before
the turn is stored, the stored turn is the one a whole answer gives, a cancel mid-stream drops
the connection at once, a stream broken mid-turn stores nothing and the run recovers as an
interrupted request does."""

from __future__ import annotations

import json
import threading
import time

import psycopg
import pytest
from django.db import connection

from agents.actions.task import task_cancel, task_retry_now
from agents.models import AgentRun, Model, ToolCall, Turn
from core.actors import Actor
from core.dburl import libpq_conninfo
from tasks import live
from tasks.models import Task
from tasks.states import TaskStatus
from tests.agents.conftest import FAST_ENV, WorkerProcess, run_burst, wait_for
from tests.agents.scripted import tool_task
from tests.fakes.model_server import (
    ScriptedModelServer,
    reply_endless,
    reply_error,
    reply_streamed,
    reply_text,
    reply_tool_calls,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

QUIET = {"ACTHELM_LOG_LEVEL": "WARNING"}
TEXT = "The launch moves to April because the venue is booked until then and the team agrees"


class Watcher(threading.Thread):
    """Someone watching a task: its id announced on the watch channel every 0.3 s (as the web
    process does while a viewer is connected, more often), each live message kept with the time
    it came and how many assistant turns of the task were stored at that moment."""

    def __init__(self, task_id: int):
        super().__init__(daemon=True)
        self.task_id = task_id
        self.halt = threading.Event()
        self.listening = threading.Event()
        self.deltas: list[tuple[float, str, dict, int]] = []
        self.lock = threading.Lock()

    def run(self) -> None:
        info = libpq_conninfo(connection.settings_dict, application_name="test-watcher")
        with (
            psycopg.connect(info, autocommit=True) as listen,
            psycopg.connect(info, autocommit=True) as query,
        ):
            listen.execute(f"LISTEN {live.LIVE_CHANNEL}")
            self.listening.set()
            announced = 0.0
            while not self.halt.is_set():
                if time.monotonic() - announced > 0.3:
                    query.execute(
                        "SELECT pg_notify(%s, %s)", [live.WATCH_CHANNEL, str(self.task_id)]
                    )
                    announced = time.monotonic()
                for note in listen.notifies(timeout=0.2, stop_after=20):
                    message = json.loads(note.payload)
                    if message["task"] != self.task_id:
                        continue
                    stored = query.execute(
                        "SELECT count(*) FROM agents_turn WHERE task_id = %s "
                        "AND role = 'assistant' AND NOT discarded",
                        [self.task_id],
                    ).fetchone()[0]
                    with self.lock:
                        for kind, data in message["deltas"]:
                            self.deltas.append((time.monotonic(), kind, data, stored))

    def __enter__(self) -> Watcher:
        self.start()
        assert self.listening.wait(5)
        return self

    def __exit__(self, *exc: object) -> None:
        self.halt.set()
        self.join(5)

    def seen(self, kind: str) -> list[tuple[float, str, dict, int]]:
        with self.lock:
            return [d for d in self.deltas if d[1] == kind]

    def text(self) -> str:
        return "".join(d[2]["text"] for d in self.seen("text"))


def worker(worker_env, worker_id: str, **env: str) -> WorkerProcess:
    return WorkerProcess(
        {**worker_env, **FAST_ENV, **QUIET, **env}, "--concurrency", "4", worker_id=worker_id
    )


def status(task) -> str:
    return Task.objects.values_list("status", flat=True).get(pk=task.pk)


def assistant_turns(task) -> list[Turn]:
    return list(Turn.objects.filter(task=task, role="assistant").order_by("index"))


def test_the_pieces_reach_a_watcher_before_the_turn_is_stored_and_the_turn_is_the_whole_one(
    worker_env,
):
    with (
        ScriptedModelServer([reply_streamed(TEXT, seconds=2.0)]) as streaming,
        ScriptedModelServer([reply_text(TEXT)], streams=False) as whole,
    ):
        task = tool_task(streaming, [], title="streamed")
        other = tool_task(whole, [], title="whole")
        with Watcher(task.pk) as watcher:
            proc = worker(worker_env, "streamer")
            try:
                wait_for(
                    lambda: {status(task), status(other)} == {TaskStatus.REVIEW},
                    timeout=60,
                    message="both tasks in review",
                )
                wait_for(lambda: watcher.seen("end"), timeout=10, message="the turn's end")
            finally:
                proc.stop()
        assert streaming.completion_requests[0].json["stream"] is True
    texts = watcher.seen("text")
    assert watcher.text() == TEXT
    assert len(texts) > 3  # word by word (coalesced at most four times a second)
    first, end = texts[0], watcher.seen("end")[-1]
    assert first[3] == 0  # the first words were seen before the turn was stored
    assert end[3] == 1  # the end comes after the commit
    assert end[0] - first[0] > 1.0  # shown as it was written, over the answer's two seconds
    (streamed,), (answered,) = assistant_turns(task), assistant_turns(other)
    assert end[2] == {"stored": True, "turn": streamed.index}  # where the page will show it
    fields = ("content", "stop_reason", "discarded", "input_tokens", "output_tokens", "cost")
    assert [getattr(streamed, f) for f in fields] == [getattr(answered, f) for f in fields]


def test_a_cancel_mid_stream_drops_the_connection_at_once_and_stores_nothing(worker_env):
    with ScriptedModelServer([reply_streamed(TEXT * 10, seconds=60)]) as server:
        task = tool_task(server, [])
        with Watcher(task.pk) as watcher:
            # The heartbeat (30 s) is not what lets go of the request: the cancel's NOTIFY is.
            proc = worker(
                worker_env, "canceller", ACTHELM_HEARTBEAT_SECONDS="30", ACTHELM_LEASE_SECONDS="90"
            )
            try:
                wait_for(lambda: watcher.seen("text"), timeout=20, message="the first words")
                task_cancel(actor=Actor.system("test"), task_id=task.pk)
                cancelled_at = time.monotonic()
                assert server.wait_aborted(10)
                assert time.monotonic() - cancelled_at < 10
                wait_for(lambda: watcher.seen("end"), timeout=10, message="the turn's end")
            finally:
                proc.stop()
    assert watcher.seen("end")[-1][2] == {"stored": False}
    assert status(task) == TaskStatus.CANCELLED
    assert assistant_turns(task) == []


def test_a_stream_broken_mid_turn_stores_nothing_and_the_run_recovers_as_an_interrupted_one(
    worker_env,
):
    script = [reply_text(TEXT, pace=0.3, cut_after=8), reply_streamed(TEXT, seconds=0.5)]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, [])
        with Watcher(task.pk) as watcher:
            proc = worker(worker_env, "breaker")
            try:
                wait_for(
                    lambda: AgentRun.objects.filter(task=task, error_code__gt="").exists(),
                    timeout=30,
                    message="the first run's end",
                )
                run = AgentRun.objects.get(task=task)
                assert run.error_code == "provider_server_error"
                task.refresh_from_db()
                # as an interrupted request: an attempt counted, a back-off, nothing stored
                assert task.status == TaskStatus.READY and task.failed_attempts == 1
                assert assistant_turns(task) == []
                wait_for(lambda: watcher.seen("end"), timeout=10, message="the cut turn's end")
                assert watcher.seen("end")[0][2] == {"stored": False}
                assert watcher.text() and watcher.text() != TEXT  # part of it was shown
                task_retry_now(actor=Actor.system("test"), task_id=task.pk)
                wait_for(lambda: status(task) == TaskStatus.REVIEW, timeout=30, message="in review")
            finally:
                proc.stop()
    (turn,) = assistant_turns(task)
    assert turn.content == TEXT


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [True, False])
def test_the_setting_decides_whether_turns_are_streamed_and_the_turn_is_the_same(
    model_server, http_model, loop_task, fast_worker_settings, settings, flavor, stream
):
    """ACTHELM_STREAM_TURNS (an in-process worker): on, the model is asked to stream; off, for
    whole answers; the turns stored are the same (the tool call's arguments included)."""
    settings.ACTHELM_STREAM_TURNS = stream
    call = ("write_artifact", {"name": "report.md", "content": "April"})
    server = model_server(
        [reply_tool_calls([call], text="Writing the report"), reply_text(TEXT)], flavor=flavor
    )
    task = loop_task(http_model(server, flavor=flavor), tools=["write_artifact"])
    run_burst()
    asked = [r.json.get("stream") for r in server.completion_requests]
    assert asked == ([True, True] if stream else [False if flavor == "openai" else None] * 2)
    turns = assistant_turns(task)
    assert [t.content for t in turns] == ["Writing the report", TEXT]
    (stored,) = ToolCall.objects.filter(task=task)
    assert stored.tool == call[0] and stored.arguments_raw == json.dumps(call[1])
    assert {k: stored.arguments[k] for k in call[1]} == call[1]
    assert status(task) == TaskStatus.REVIEW


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
def test_a_turn_streamed_past_the_output_limit_is_discarded_as_a_truncated_one(
    model_server, http_model, loop_task, fast_worker_settings, flavor
):
    """The model's server ignores max_tokens and writes a tool call's arguments forever (an
    in-process worker, as the truncated whole answer's test in test_loop.py): the connection
    is dropped once the stream is clearly past the output limit, the turn is stored as a
    truncated one is — discarded, stop reason "length", nothing of it kept, its call never run —
    and the model is asked again, told why, as after a truncated whole answer."""
    endless = reply_endless('{"name": "r.md", "content": "more ', tool_call="write_artifact")
    server = model_server([endless, reply_text(TEXT)], flavor=flavor)
    task = loop_task(
        http_model(server, flavor=flavor),
        tools=["write_artifact"],
        limits={"limit_output_tokens": 20},
    )
    run_burst()
    assert server.wait_aborted(5)  # cut off, long before the server's 60 s
    first, second = server.completion_requests
    assert first.json["stream"] is True and first.json["max_tokens"] == 20
    cut, answer = assistant_turns(task)
    assert cut.discarded and cut.stop_reason == "length" and cut.content == ""
    assert cut.output_tokens > 20  # what the cut turn took at least, booked
    assert not ToolCall.objects.filter(task=task).exists() and not task.artifacts.exists()
    note = Turn.objects.get(task=task, index=cut.index + 1)
    assert note.role == "user" and "cut off or declined (length)" in note.content
    assert "cut off or declined (length)" in json.dumps(second.json["messages"])
    assert not answer.discarded and answer.content == TEXT
    assert status(task) == TaskStatus.REVIEW


@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@pytest.mark.parametrize("refuses", [True, False], ids=["refuses-stream", "streams"])
def test_the_worker_asks_a_server_that_the_test_found_not_streaming_for_whole_answers(
    model_server, actor, fast_worker_settings, flavor, refuses
):
    """The connection test records whether the server streams; the worker asks one that
    refused the `stream` field for whole answers at once (no refused attempt first), and
    streams from one that streams."""
    from agents.catalogue.connections import connection_add, connection_test
    from agents.engine.run.intake import task_create
    from tests.agents.test_services import STREAM_REFUSED

    probe = [reply_text("OK")]
    if refuses:
        probe.insert(0, reply_error(400, STREAM_REFUSED[flavor]))
    server = model_server([*probe, reply_text(TEXT)], flavor=flavor)
    connection_add(
        actor=actor,
        name="local",
        kind="openai_compatible" if flavor == "openai" else "anthropic",
        base_url=server.url,
        cost_tier="zero_cost",
        models=[{"name": "small", "supports_tools": False}],
    )
    [result] = connection_test(actor=actor, name="local")
    assert result["ok"] and result["streams"] is not refuses
    tested = len(server.completion_requests)
    task = task_create(
        actor=actor, title="Report", instruction="Write it.", tools=[], model=Model.objects.get()
    )
    run_burst()
    assert status(task) == TaskStatus.REVIEW
    asked = [r.json.get("stream") for r in server.completion_requests[tested:]]
    if refuses:
        assert asked == [False if flavor == "openai" else None]  # one request, whole
    else:
        assert asked == [True]
    (turn,) = assistant_turns(task)
    assert turn.content == TEXT
