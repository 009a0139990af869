"""`make run`'s demo: a goal whose planning task runs against the scripted demo model."""

import threading
from http.server import ThreadingHTTPServer

import pytest

from acthelm_site.demo_model import Handler
from agents.models import AgentRun, Artifact, ToolCall
from tasks.models import Goal, Task
from tasks.states import TaskKind, TaskOrigin, TaskStatus

pytestmark = pytest.mark.django_db(transaction=True)


class QuickHandler(Handler):
    stream_seconds = 0.05  # each turn streamed, quickly


@pytest.fixture
def demo_model():
    server = ThreadingHTTPServer(("127.0.0.1", 0), QuickHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_the_demo_shows_the_whole_loop(demo_model, monkeypatch, settings):
    from django.core.management import call_command

    from agents.engine.runtime.reconciler import reconcile
    from agents.engine.runtime.worker import Worker

    settings.ACTHELM_HEARTBEAT_SECONDS = 0.5
    monkeypatch.setenv("ACTHELM_DEMO_MODEL_PORT", str(demo_model))
    monkeypatch.setenv("ACTHELM_DEMO_PASSWORD", "demo-pass")
    call_command("acthelm_demo")
    goal = Goal.objects.get()
    reconcile()
    planning = Task.objects.get(goal=goal, kind=TaskKind.PLANNING)
    assert planning.origin == TaskOrigin.RECONCILER
    Worker(worker_id="demo", burst=True).run()
    planning.refresh_from_db()
    assert planning.status == TaskStatus.REVIEW  # a person closes it (the policy is off)
    follow_ups = list(Task.objects.filter(spawned_by=planning).order_by("id"))
    assert [t.title for t in follow_ups] == ["Gather the facts", "Write the summary"]
    # The summary waited for the facts; the worker ran both to review.
    assert [t.status for t in follow_ups] == [TaskStatus.REVIEW, TaskStatus.BLOCKED]
    work = Task.objects.get(title__startswith="Summarise last quarter")
    assert work.status == TaskStatus.REVIEW
    assert Artifact.objects.filter(task=work, name="report.md").exists()
    # It read the file its task names and said what it did: the supervisor's default checks
    # (used_tools, answer_not_echo) let it into review.
    assert ToolCall.objects.filter(task=work, tool="read_file", status="succeeded").exists()
    run = AgentRun.objects.get(task=work)
    assert run.verdict == "approved" and "3 default checks" in run.verdict_reason
    assert run.answer.startswith("I read tickets.csv and wrote report.md.")


def test_the_demo_model_passes_its_own_connection_test_tool_probe_included(demo_model, monkeypatch):
    from django.core.management import call_command

    from agents.catalogue.connections import connection_test
    from agents.models import Model
    from core.actors import Actor
    from tests.factories import UserFactory

    monkeypatch.setenv("ACTHELM_DEMO_MODEL_PORT", str(demo_model))
    call_command("acthelm_demo")
    actor = Actor.person(UserFactory(username="ops", is_superuser=True))
    [result] = connection_test(actor=actor, name="demo")
    assert result["ok"] and result["supports_tools"], result
    assert "tool calling works" in result["message"]
    model = Model.objects.get(connection__name="demo")
    assert (model.test_status, model.supports_tools) == ("passed", True)


def test_a_second_make_run_keeps_the_first_ones_demo_connection(demo_model, monkeypatch):
    from io import StringIO

    from django.core.management import call_command

    from agents.models import Connection

    monkeypatch.setenv("ACTHELM_DEMO_MODEL_PORT", str(demo_model))
    call_command("acthelm_demo", stdout=StringIO())
    first = f"http://127.0.0.1:{demo_model}/v1"
    # A second run on another port, while the first one's demo model answers: left alone.
    monkeypatch.setenv("ACTHELM_DEMO_MODEL_PORT", "9")  # nothing listens on the discard port
    out = StringIO()
    call_command("acthelm_demo", stdout=out)
    assert Connection.objects.get(name="demo").base_url == first
    assert "stays on" in out.getvalue()
    # Once nothing answers where it points (the first run is gone), the next run takes it.
    Connection.objects.filter(name="demo").update(base_url="http://127.0.0.1:9/v1")
    monkeypatch.setenv("ACTHELM_DEMO_MODEL_PORT", str(demo_model))
    call_command("acthelm_demo", stdout=StringIO())
    assert Connection.objects.get(name="demo").base_url == first


def test_the_demo_password_is_printed_beside_the_consoles_address_on_every_run(monkeypatch):
    from io import StringIO

    from django.core.management import call_command

    monkeypatch.delenv("ACTHELM_DEMO_PASSWORD", raising=False)
    out = StringIO()
    call_command("acthelm_demo", "--console-url", "http://127.0.0.1:8000/", stdout=out)
    [line] = [x for x in out.getvalue().splitlines() if x.startswith("Console:")]
    password = line.split("sign in as founder / ")[1].split()[0]
    assert line.startswith("Console: http://127.0.0.1:8000/  sign in as founder / ")
    again = StringIO()
    call_command("acthelm_demo", "--console-url", "http://127.0.0.1:8000/", stdout=again)
    assert f"sign in as founder / {password}  (admin: http://127.0.0.1:8000/admin/)" in (
        again.getvalue()
    )


def test_the_natural_first_task_reaches_review_with_the_file_it_names(demo_model, monkeypatch):
    """ "…and write them to summary.md", model left on the default: the demo model writes
    summary.md, so the default check named_output=summary.md lets the work into review."""
    from django.core.management import call_command

    from agents.actions.task import task_create_by_name
    from agents.engine.runtime.worker import Worker
    from core.actors import Actor
    from tests.factories import UserFactory

    monkeypatch.setenv("ACTHELM_DEMO_MODEL_PORT", str(demo_model))
    monkeypatch.setenv("ACTHELM_DEMO_PASSWORD", "demo-pass")
    call_command("acthelm_demo")
    person = UserFactory(username="newcomer", perms=["tasks.add_task"])
    task = task_create_by_name(
        actor=Actor.person(person),
        title="Summarise notes",
        instruction="Summarise notes.txt in three bullet points and write them to summary.md",
        files=[("notes.txt", b"one\ntwo\nthree\n")],
    )
    Worker(worker_id="demo", burst=True).drain()
    task.refresh_from_db()
    assert task.status == TaskStatus.REVIEW and task.failed_attempts == 0
    assert Artifact.objects.filter(task=task, name="summary.md").exists()
    run = AgentRun.objects.get(task=task)
    assert run.verdict == "approved"
    assert run.answer.startswith("I read notes.txt and wrote summary.md.")


def test_the_demo_model_streams_word_by_word_over_a_second_or_two():
    """Asked to stream, as the worker asks, the demo model's turn arrives in pieces over about
    STREAM_SECONDS, and makes the same turn as its whole answer."""
    import time

    from acthelm_site.demo_model import STREAM_SECONDS
    from agents.catalogue.providers import Message, build_provider
    from tests.agents.test_provider_http import in_thread

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        provider = build_provider(
            "openai_compatible", base_url=f"http://127.0.0.1:{server.server_address[1]}/v1"
        )
        ask = {
            "model": "demo",
            "messages": [Message(role="user", content="## Task\nSummarise tickets.csv")],
            "tools": [],
            "max_tokens": 200,
        }
        times: list[float] = []
        pieces: list[str] = []

        def on_delta(kind, data):
            times.append(time.monotonic())
            pieces.append(data["text"])

        started = time.monotonic()
        streamed = in_thread(lambda: provider.complete(**ask, on_delta=on_delta))
        ended = time.monotonic()
        whole = in_thread(lambda: provider.complete(**ask))
    finally:
        server.shutdown()
        server.server_close()
    assert streamed == whole
    assert "".join(pieces) == whole.text and len(pieces) > 10  # word by word
    assert times[0] - started < 0.5
    assert STREAM_SECONDS * 0.7 < ended - started < STREAM_SECONDS + 1.5
