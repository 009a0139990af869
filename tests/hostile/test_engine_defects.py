"""The worker and agent-loop defects of the hardening review (issue 13, items 1-9), each reproduced
against a real worker, real PostgreSQL and the scripted model server on loopback."""

import threading
import time
from datetime import timedelta

import psycopg
import pytest
from django.utils import timezone

from agents.actions.decisions import approval_approve
from agents.actions.task import task_cancel, task_delete
from agents.engine.runtime.recovery import recover_stale
from agents.engine.runtime.worker import Worker
from agents.engine.store import claim_next
from agents.engine.verdict.outcomes import apply_outcome
from agents.models import AgentRun, Connection, ToolCall
from approvals.models import Approval, ReviewDecision
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.agents.conftest import run_burst, wait_for
from tests.agents.scripted import conninfo, fast_settings, status_of, tool_task
from tests.fakes.model_server import (
    ScriptedModelServer,
    hang,
    reply_error,
    reply_text,
    reply_tool_calls,
)

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def loop_settings(settings):
    return fast_settings(settings)


def _worker_thread(**kwargs):
    worker = Worker(worker_id=kwargs.pop("worker_id", "w"), **kwargs)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    return worker, thread


# --- 1. A worker slot survives its task's deletion ------------------------------------------------


def test_1_a_slot_survives_a_running_task_cancelled_and_deleted(loop_settings, actor):
    with ScriptedModelServer([hang(30), reply_text("second task done")]) as server:
        first = tool_task(server, [], title="doomed")
        worker, thread = _worker_thread()
        try:
            assert server.wait_for_requests(1, 10)
            task_cancel(actor=actor, task_id=first.pk)
            task_delete(actor=actor, task_id=first.pk)
            second = tool_task(server, [], title="next")
            wait_for(lambda: status_of(second) == TaskStatus.REVIEW, timeout=15, message="review")
        finally:
            worker.stop()
            thread.join(15)
    assert not thread.is_alive()


# --- 2. A permanent provider error does not cycle forever ---------------------------------------


def test_2_a_task_on_a_cooling_connection_is_not_claimed(loop_settings, person):
    from django.test import Client

    with ScriptedModelServer([]) as server:
        task = tool_task(server, [])
        Connection.objects.filter(pk=task.connection_id).update(
            cooldown_until=timezone.now() + timedelta(minutes=30),
            last_error_code="provider_quota",
            last_error_message="HTTP 429: insufficient_quota",
        )
        assert claim_next(worker_id="w") is None
        assert status_of(task) == TaskStatus.READY
        assert not AgentRun.objects.filter(task=task).exists()
    # The task page says why it waits.
    client = Client()
    client.force_login(person)
    page = client.get(f"/tasks/{task.pk}/").content.decode()
    assert "cools down until" in page and "insufficient_quota" in page


def test_2_a_repeated_authentication_error_fails_the_task(loop_settings):
    loop_settings.ACTHELM_COOLDOWN_SECONDS = 0  # the cooldown cycle passes at once
    with ScriptedModelServer([reply_error(401)] * 10, default=reply_error(401)) as server:
        task = tool_task(server, [])
        worker, thread = _worker_thread(burst=True)
        try:
            wait_for(lambda: status_of(task) == TaskStatus.FAILED, timeout=15, message="failed")
        finally:
            worker.stop()
            thread.join(15)
    task.refresh_from_db()
    assert task.failure_code == "provider_auth"
    assert "401" in task.failure_message
    assert AgentRun.objects.filter(task=task).count() == 2


def test_2_a_rate_limit_counts_against_the_attempts(loop_settings):
    body = {"error": {"message": "slow down", "type": "rate_limit"}}
    with ScriptedModelServer([reply_error(429, body)]) as server:
        task = tool_task(server, [])
        run_burst()
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.failed_attempts == 1


# --- 3. Overdue runs: the database clock and the task's own runtime limit -------------------------


def test_3_a_healthy_run_within_its_runtime_limit_is_not_overdue(loop_settings):
    loop_settings.ACTHELM_RUN_TIMEOUT_SECONDS = 10
    with ScriptedModelServer([]) as server:
        task = tool_task(server, [], limits={"limit_runtime_seconds": 7200})
        claim = claim_next(worker_id="w")
        AgentRun.objects.filter(pk=claim.run_id).update(
            started_at=timezone.now() - timedelta(seconds=400)
        )
        assert recover_stale() == []
        assert status_of(task) == TaskStatus.IN_PROGRESS


def test_3_the_run_start_is_the_database_clock(loop_settings):
    from django.db import connection

    with ScriptedModelServer([]) as server:
        tool_task(server, [])
        claim = claim_next(worker_id="w")
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT r.started_at = e.created_at FROM agents_agentrun r "
                "JOIN tasks_taskevent e ON e.id = r.claim_event_id WHERE r.id = %s",
                [claim.run_id],
            )
            assert cursor.fetchone()[0] is True


# --- 4. A database blip does not spend the one requeue -------------------------------------------


@pytest.mark.parametrize("cuts", [1, 2])
def test_4_a_database_error_mid_step_is_written_again_or_hands_the_task_back(loop_settings, cuts):
    """The end's one statement waits on a lock and its connection is cut: written again once on
    a new connection (one cut), else the task is handed back (two cuts) — never left for
    recovery to count as a lost worker."""
    script = [reply_text("the answer", delay=1.0), reply_text("the answer")]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, [])
        hold = psycopg.connect(conninfo())
        try:
            _worker, thread = _worker_thread(burst=True)
            assert server.wait_for_requests(1, 10)
            hold.execute("LOCK TABLE agents_turn IN EXCLUSIVE MODE")

            cut: set[int] = set()

            def cut_the_waiter():
                # pg_stat_activity is read once per transaction unless the snapshot is let go:
                # without this, only a worker already waiting at the first look is seen. A
                # backend already cut may still be listed for a moment: only a new one counts.
                hold.execute("SELECT pg_stat_clear_snapshot()")
                waiting = hold.execute(
                    "SELECT pid FROM pg_stat_activity "
                    "WHERE datname = current_database() AND wait_event_type = 'Lock' "
                    "AND wait_event = 'relation' AND pid <> pg_backend_pid() "
                    "AND NOT pid = ANY(%s)",
                    [sorted(cut)],
                ).fetchall()
                for (pid,) in waiting:
                    hold.execute("SELECT pg_terminate_backend(%s)", [pid])
                    cut.add(pid)
                return bool(waiting)

            for _ in range(cuts):
                wait_for(cut_the_waiter, timeout=10, message="the worker waiting on the lock")
            hold.rollback()
            thread.join(20)
        finally:
            hold.close()
        time.sleep(2.0)  # past the lease: recovery would now count a lost worker
        recover_stale()
        run_burst("w2")
    task.refresh_from_db()
    assert task.status == TaskStatus.REVIEW
    assert task.lost_count == 0
    assert not TaskEvent.objects.filter(task=task, kind=EventKind.LOST).exists()
    handed_back = TaskEvent.objects.filter(task=task, kind=EventKind.HANDED_BACK).exists()
    assert handed_back is (cuts == 2)


# --- 5. Retries: 1, 5 and 30 minutes; a bad request is not retried -------------------------------


def test_5_every_retry_delay_is_reachable_with_the_defaults(loop_settings):
    from agents.engine.run.loop import Outcome

    with ScriptedModelServer([]) as server:
        task = tool_task(server, [])
        now = timezone.now()
        delays = []
        for _attempt in range(10):
            claim = claim_next(worker_id="w")
            status = apply_outcome(
                task_id=task.pk,
                run_id=claim.run_id,
                worker_id="w",
                now=now,
                outcome=Outcome(
                    Outcome.FAILED, code="provider_timeout", message="slow", retryable=True
                ),
            )
            if status != TaskStatus.READY:
                break
            task.refresh_from_db()
            delays.append(round((task.not_before - now).total_seconds()))
            Task.objects.filter(pk=task.pk).update(not_before=None)
    assert delays == [60, 300]
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED and task.failure_code == "error_loop"


def test_5_a_bad_request_is_not_retried(loop_settings):
    body = {"error": {"message": "unknown parameter", "type": "invalid_request_error"}}
    with ScriptedModelServer([reply_error(400, body)]) as server:
        task = tool_task(server, [])
        run_burst()
        assert len(server.completion_requests) == 1
    task.refresh_from_db()
    assert (task.status, task.failure_code) == (TaskStatus.FAILED, "provider_bad_request")


# --- 6. A withdrawn pause does not pause; the last runtime is booked -----------------------------


def test_6_a_withdrawn_pause_does_not_pause(loop_settings):
    from agents.engine.run.loop import AgentLoop, Outcome, RunSignals

    with ScriptedModelServer([reply_text("finished")]) as server:
        task = tool_task(server, [])
        claim = claim_next(worker_id="w")
        signals = RunSignals()
        signals.pause.set()  # the heartbeat saw a pause request that was withdrawn since
        loop = AgentLoop(task_id=task.pk, run_id=claim.run_id, worker_id="w", signals=signals)
        outcome = loop.run()
    assert outcome.kind == Outcome.FINAL


def test_6_the_runtime_of_a_failed_request_is_booked(loop_settings):
    with ScriptedModelServer([hang(30)]) as server:
        task = tool_task(server, [])
        Connection.objects.filter(pk=task.connection_id).update(timeout_seconds=1.0)
        run_burst()
    run = AgentRun.objects.get(task=task)
    assert run.error_code == "provider_timeout"
    assert run.active_seconds >= 0.9


# --- 7. Cancel settles open decisions; the inbox shows only what can be decided -----------------


def test_7_cancel_settles_pending_approvals(loop_settings, actor):
    from console.views.approvals import pending_approvals

    script = [reply_tool_calls([("list_files", {}, "l1")])]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["list_files"], tool_policies={"list_files": "ask"})
        run_burst()
    assert status_of(task) == TaskStatus.AWAITING_APPROVAL
    approval = Approval.objects.get(task=task)
    assert approval in pending_approvals()
    task_cancel(actor=actor, task_id=task.pk)
    approval.refresh_from_db()
    assert approval.status != "pending" and approval.decided_at is not None
    assert approval not in pending_approvals()


def test_7_the_inbox_hides_decisions_of_tasks_no_longer_waiting(loop_settings, actor):
    from console.views.approvals import pending_reviews
    from tests.factories import AgentRunFactory, TaskFactory, TurnFactory

    task = TaskFactory(status=TaskStatus.CANCELLED)
    run = AgentRunFactory(task=task)
    turn = TurnFactory(task=task, run=run)
    call = ToolCall.objects.create(
        task=task,
        run=run,
        turn=turn,
        position=0,
        call_id="c",
        tool="fetch_url",
        recovery_class="external",
        status="unknown",
    )
    decision = ReviewDecision.objects.create(task=task, tool_call=call)
    assert decision not in pending_reviews()


# --- 8. The checkpoint is written when a round stops ---------------------------------------------


def test_8_a_round_that_stops_for_approval_writes_its_checkpoint(loop_settings):
    script = [reply_tool_calls([("list_files", {}, "l1")])]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["list_files"], tool_policies={"list_files": "ask"})
        run_burst()
    checkpoint = AgentRun.objects.get(task=task).checkpoint
    assert checkpoint["remaining"]["limit_steps"] == task.limit_turns - 1
    pending = checkpoint["pending_operations"]
    assert [(p["tool"], p["status"]) for p in pending] == [("list_files", "awaiting_approval")]


# --- 9. An approved call is checked against the task's list again ---------------------------------


def test_9_an_approved_call_whose_tool_was_removed_is_refused(loop_settings, actor):
    script = [reply_tool_calls([("list_files", {}, "l1")]), reply_text("done")]
    with ScriptedModelServer(script) as server:
        task = tool_task(server, ["list_files", "read_file"], tool_policies={"list_files": "ask"})
        run_burst()
        approval = Approval.objects.get(task=task)
        # The task's list changes while the operation waits (an admin edit).
        Task.objects.filter(pk=task.pk).update(tools=["read_file"], tool_policies={})
        approval_approve(
            actor=actor, approval_id=approval.pk, arguments_hash=approval.arguments_hash
        )
        run_burst("w2")
    call = ToolCall.objects.get(task=task)
    assert (call.status, call.error_code, call.run_count) == ("refused", "tool_not_allowed", 0)
    assert status_of(task) == TaskStatus.REVIEW


# --- A fenced-out run cannot replace a newer run's artifact (issue 12, item 4) -------------------


def test_write_artifact_of_an_older_run_cannot_replace_a_newer_runs_file(tmp_path):
    from agents.catalogue.tools import ToolContext, ToolError, get_tool
    from agents.catalogue.tools.artifacts import stamp_fence

    tool = get_tool("write_artifact")
    folder = tmp_path / "task" / "artifacts"

    def write(token, content):
        ctx = ToolContext(workspace=tmp_path, artifacts_dir=folder, fence_token=token)
        return tool.run(tool.parse({"name": "report.md", "content": content}), ctx)

    write(1, "first run")  # the first run writes
    assert (folder / "report.md").read_text() == "first run"
    write(2, "second run")  # a newer run (claim 2) replaces it
    with pytest.raises(ToolError) as lost:
        write(1, "late write of the first run")  # the first run, fenced out, comes back
    assert lost.value.code == "cancelled"
    assert (folder / "report.md").read_text() == "second run"
    # A newer run that has not written yet is protected from the moment it starts.
    stamp_fence(folder, 3)
    with pytest.raises(ToolError):
        write(2, "late write of the second run")
    assert (folder / "report.md").read_text() == "second run"
    assert [p.name for p in folder.iterdir()] == ["report.md"]  # no temporary file left
