"""Recovery classes: what happens to a tool call that was in flight when its worker died.

Real worker processes are killed with SIGKILL while a call runs; recovery and a second worker
then handle the call by its class: read-only and idempotent calls run again, an external call
(fetch_url) is never replayed unless a person chooses "run again" (exactly one more request), and
"skip" makes none and tells the model the outcome is unknown."""

import threading
from datetime import timedelta

import psycopg
import pytest
from django.utils import timezone

from agents.actions.decisions import SKIPPED_RESULT, review_run_again, review_skip
from agents.actions.task import task_retry
from agents.engine.run.usage import task_usage
from agents.engine.runtime.recovery import recover_stale
from agents.engine.runtime.worker import Worker
from agents.models import AgentRun, Artifact, ToolCall
from agents.states import RunStatus, ToolCallStatus
from approvals.models import ReviewDecision
from approvals.states import ReviewChoice
from core.exceptions import StaleDecision
from tasks.states import EventKind, TaskStatus
from tasks.workspace import add_input_file
from tests.agents.conftest import wait_for
from tests.agents.scripted import (
    artifact_files,
    calls_of,
    conninfo,
    fast_settings,
    status_of,
    tool_result_for,
    tool_task,
)
from tests.fakes.http_target import HttpTarget
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def loop_settings(settings):
    return fast_settings(settings)


@pytest.fixture
def doomed(spawn_worker, settings):
    """Start a worker process that sees the test's media root and may fetch from loopback."""

    def start():
        return spawn_worker(
            worker_id="doomed",
            env={
                "ACTHELM_MEDIA_ROOT": str(settings.ACTHELM_MEDIA_ROOT),
                "ACTHELM_FETCH_ALLOW_PRIVATE": "true",
            },
        )

    return start


def call_status(task) -> str:
    return ToolCall.objects.filter(task=task).values_list("status", flat=True).get()


def recover(task) -> None:
    """One pass of acthelm_recover, repeated until the dead worker's lease has expired (and its
    database session has let go of the task's row)."""
    wait_for(lambda: task.pk in recover_stale(), timeout=20, message="recovery of the task")
    assert status_of(task) == TaskStatus.READY


def work() -> None:
    Worker(worker_id="rescuer", burst=True).run()


@pytest.fixture
def target():
    with HttpTarget() as server:
        yield server


# --- External: never replayed unless a person chooses --------------------------------------------


@pytest.mark.parametrize("choice", ["run_again", "skip"])
def test_sigkill_during_fetch_url_needs_review_then_run_again_or_skip(
    loop_settings, doomed, target, actor, choice
):
    url = f"{target.url}/stall?seconds=30"  # headers at once, then silence: in flight
    script = [reply_tool_calls([("fetch_url", {"url": url}, "f1")]), reply_text("Finished.")]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["fetch_url"], allowed_domains=["127.0.0.1"])
        worker = doomed()
        wait_for(lambda: target.counts["/stall"] == 1, message="the fetch")
        assert call_status(task) == ToolCallStatus.RUNNING
        worker.kill()
        target.route("/stall", body="The page, at last.")  # a repeat would now answer at once

        recover(task)
        work()
        # Not replayed: the outcome is unknown, and a person decides.
        assert status_of(task) == TaskStatus.NEEDS_REVIEW
        [call] = calls_of(task)
        assert (call.status, call.run_count) == (ToolCallStatus.UNKNOWN, 1)
        decision = ReviewDecision.objects.get(task=task)
        assert decision.tool_call_id == call.pk and decision.choice == ReviewChoice.PENDING
        assert target.counts["/stall"] == 1
        assert len(server.completion_requests) == 1
        assert task_usage(task.pk).network_requests == 1  # it may have reached the server
        work()  # nothing is ready: no worker touches it until a person decides
        assert target.counts["/stall"] == 1

        with pytest.raises(StaleDecision):
            review_run_again(actor=actor, decision_id=decision.pk, arguments_hash="0" * 64)
        decide = review_run_again if choice == "run_again" else review_skip
        decide(actor=actor, decision_id=decision.pk, arguments_hash=call.arguments_hash)
        assert status_of(task) == TaskStatus.READY
        work()
        requests = server.completion_requests

    call.refresh_from_db()
    told = tool_result_for(requests[1], "f1")
    if choice == "run_again":
        assert target.counts["/stall"] == 2  # exactly one more request
        assert (call.status, call.run_count) == (ToolCallStatus.SUCCEEDED, 2)
        assert "The page, at last." in told
        assert task_usage(task.pk).network_requests == 2
    else:
        assert target.counts["/stall"] == 1  # none
        assert (call.status, call.run_count) == (ToolCallStatus.SKIPPED, 1)
        assert told == SKIPPED_RESULT and "unknown" in told
    assert len(requests) == 2
    assert status_of(task) == TaskStatus.REVIEW
    kinds = list(task.events.values_list("kind", flat=True))
    assert EventKind.LOST in kinds and EventKind.NEEDS_REVIEW in kinds
    assert (EventKind.RUN_AGAIN if choice == "run_again" else EventKind.SKIPPED) in kinds


def test_a_run_again_that_is_lost_too_asks_the_person_again(loop_settings, target, actor):
    """The chosen re-run's worker loses the task mid-fetch as well: the spent choice does not
    leave the task in needs_review with nothing to decide; the operation needs a new decision."""
    url = f"{target.url}/slow?chunks=300&delay=0.1"  # a chunk every 0.1 s: in flight for 30 s
    script = [reply_tool_calls([("fetch_url", {"url": url}, "f1")]), reply_text("Finished.")]

    def lose_the_fetch():
        """A worker (in a thread) fetches; recovery takes the task away from it mid-fetch."""
        before = target.counts["/slow"]
        thread = threading.Thread(target=work)
        thread.start()
        wait_for(lambda: target.counts["/slow"] == before + 1, message="the fetch")
        # Started two hours ago: overdue, so recovered whatever its heartbeat does meanwhile.
        run = AgentRun.objects.get(task=task, status=RunStatus.STARTED)
        AgentRun.objects.filter(pk=run.pk).update(started_at=timezone.now() - timedelta(hours=2))
        # Recovery skips a task row locked at that moment (the worker's heartbeat renewing its
        # lease): it takes the task on a later pass, as the periodic recovery does.
        wait_for(lambda: task.pk in recover_stale(), message="recovery takes the task")
        run.refresh_from_db()
        assert (run.status, run.error_code) == (RunStatus.FAILED, "worker_lost")
        thread.join(30)
        assert not thread.is_alive()

    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["fetch_url"], allowed_domains=["127.0.0.1"])
        lose_the_fetch()  # requeued; the same worker claims it again: needs_review
        assert status_of(task) == TaskStatus.NEEDS_REVIEW
        decision = ReviewDecision.objects.get(task=task)
        call = decision.tool_call
        review_run_again(actor=actor, decision_id=decision.pk, arguments_hash=call.arguments_hash)
        lose_the_fetch()  # lost a second time: the task fails (worker_lost) with the call open
        assert status_of(task) == TaskStatus.FAILED
        assert call_status(task) == ToolCallStatus.RUNNING
        task_retry(actor=actor, task_id=task.pk)
        work()
        assert status_of(task) == TaskStatus.NEEDS_REVIEW
        decision.refresh_from_db()
        assert decision.choice == ReviewChoice.PENDING and decision.decided_at is None
        review_skip(actor=actor, decision_id=decision.pk, arguments_hash=call.arguments_hash)
        work()
        requests = server.completion_requests
    assert target.counts["/slow"] == 2
    assert tool_result_for(requests[-1], "f1") == SKIPPED_RESULT
    assert status_of(task) == TaskStatus.REVIEW


# --- Idempotent: run again, rewriting the same artifact ------------------------------------------


def test_sigkill_during_write_artifact_reruns_it_into_one_artifact(loop_settings, doomed):
    content = "# Final report\n" + "All figures checked.\n" * 2000
    script = [
        reply_tool_calls([("write_artifact", {"name": "report.md", "content": content}, "w1")]),
        reply_text("Report written."),
    ]
    # Hold the worker between writing the file and recording it: recording the step (the call's
    # result, its artifact, the next model turn) waits for this lock, so the kill lands after the
    # file is on disk and before anything of the step is recorded.
    hold = psycopg.connect(conninfo())
    try:
        hold.execute("LOCK TABLE agents_artifact IN EXCLUSIVE MODE")
        with ScriptedModelServer(script) as server:
            task = tool_task(server, ["write_artifact"])
            worker = doomed()
            wait_for(
                lambda: (
                    [p.name for p in artifact_files(task)] == ["report.md"]
                    and len(server.completion_requests) == 2
                    and call_status(task) == ToolCallStatus.PENDING
                ),
                message="the artifact written but not recorded",
            )
            worker.kill()
            hold.rollback()
            assert not Artifact.objects.filter(task=task).exists()

            recover(task)
            work()
            requests = server.completion_requests
    finally:
        hold.close()

    [call] = calls_of(task)
    # Run again after the crash (the first execution was never recorded: run_count counts the
    # recorded ones); an idempotent call needs no intent record.
    assert (call.status, call.run_count) == (ToolCallStatus.SUCCEEDED, 1)
    assert not ReviewDecision.objects.filter(task=task).exists()  # no person was asked
    artifact = Artifact.objects.get(task=task)
    [path] = artifact_files(task)  # one file, no temporary leftovers
    assert path.name == "report.md" and path.read_text() == content
    assert artifact.size == len(content.encode()) and artifact.tool_call_id == call.pk
    # The model was not asked again for the call it made; the request in flight at the crash
    # (its answer was never stored) was simply sent again, identical.
    assert len(requests) == 3
    assert requests[2].json["messages"] == requests[1].json["messages"]
    assert "Wrote artifact report.md" in tool_result_for(requests[2], "w1")
    assert status_of(task) == TaskStatus.REVIEW


# --- Read-only: simply run again ---------------------------------------------------------------


def test_sigkill_during_a_read_only_call_simply_runs_it_again(loop_settings, doomed):
    script = [
        reply_tool_calls([("analyze_csv", {"path": "data.csv"}, "a1")]),
        reply_text("Analysed."),
    ]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["analyze_csv"])
        # Big enough that analysing it takes seconds: the kill lands while it runs.
        loop_settings.ACTHELM_INPUT_FILE_MAX_BYTES = 100_000_000  # 37 MB, over the default cap
        rows = "north,12.5,2024-01-01,some text here\n" * 1_000_000
        add_input_file(task.pk, name="data.csv", data="region,amount,day,note\n" + rows)
        worker = doomed()
        # The turn with the call is recorded just before the call runs (a read-only call has no
        # intent record); the analysis then takes seconds.
        wait_for(
            lambda: ToolCall.objects.filter(task=task).exists(),
            interval=0.01,
            message="the analysis running",
        )
        worker.kill()
        assert call_status(task) == ToolCallStatus.PENDING
        assert len(server.completion_requests) == 1
        # The file changes meanwhile: the result must come from a real second run.
        add_input_file(task.pk, name="data.csv", data="region,amount\nnorth,1\nsouth,2\n")

        recover(task)
        work()
        requests = server.completion_requests

    [call] = calls_of(task)
    assert (call.status, call.run_count) == (ToolCallStatus.SUCCEEDED, 1)
    assert not ReviewDecision.objects.filter(task=task).exists()  # no person was asked
    assert call.result.startswith("data.csv: 2 rows, 2 columns")
    assert len(requests) == 2  # the model was not asked again for the call it made
    assert tool_result_for(requests[1], "a1") == call.result_for_model
    assert status_of(task) == TaskStatus.REVIEW
