"""The verdict holds no connection and nothing starves the heartbeat (issue 32, item 2): real
`manage.py acthelm_worker` processes on a pool smaller than their runs, a model supervisor on
loopback that answers several leases late, ordinary tasks working beside the verdicts."""

import time

import psycopg
import pytest
from django.db import connection

from agents.actions.task import task_cancel
from agents.engine.run.intake import task_create
from agents.models import AgentRun
from agents.states import RunStatus, Verdict
from core.actors import Actor
from tasks.models import Task
from tasks.states import TaskStatus
from tests.agents.conftest import FAST_ENV, WorkerProcess, wait_for
from tests.agents.scripted import conninfo, scripted_model
from tests.fakes.model_server import ScriptedModelServer, hang, reply_text, reply_tool_calls

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

LEASE = 6.0
# The supervisor answers three leases late: a verdict that kept its connection (or a heartbeat
# that waited for one) would let every lease of the process expire.
SUPERVISOR_DELAY = 3 * LEASE
ENV = {
    **FAST_ENV,
    "ACTHELM_LOG_LEVEL": "WARNING",
    "ACTHELM_LEASE_SECONDS": str(LEASE),
    "ACTHELM_HEARTBEAT_SECONDS": "1",
    "ACTHELM_DB_POOL_SIZE": "2",
    "ACTHELM_SUPERVISOR_CONNECTION": "supervisor",
}
STEADY_TURNS = 4


def _supervisor(server) -> None:
    model = scripted_model(server)
    model.connection.name = "supervisor"
    model.connection.timeout_seconds = 120
    model.connection.save(update_fields=["name", "timeout_seconds"])


def _answer(request: dict):
    """The agents' model: a "quick" task answers at once (and waits for its verdict); a "steady"
    one lists its files STEADY_TURNS times first, a turn a second, while the verdicts wait."""
    messages = request.get("messages") or []
    if "quick" in str(messages[:2]):
        return reply_text("Done: nothing to change.")
    if sum(1 for m in messages if m.get("role") == "tool") < STEADY_TURNS:
        return reply_tool_calls([("list_files", {})], delay=1.0)
    return reply_text("Done: the files are listed.")


def _task(model, kind: str, n: int) -> Task:
    return task_create(
        actor=Actor.system("test"),
        title=f"{kind} {n}",
        instruction=f"A {kind} task: list the files, then say you are done.",
        tools=["list_files"],
        model=model,
    )


def _list_once(request: dict):
    """List the files once, then answer."""
    if any(m.get("role") == "tool" for m in request.get("messages") or []):
        return reply_text("Done: nothing to change.")
    return reply_tool_calls([("list_files", {})])


def _backends(name: str) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", [name])
        return cursor.fetchone()[0]


def _stop(worker: WorkerProcess) -> None:
    worker.terminate()  # the runs hand back or end; then the process exits
    try:
        worker.wait(30)
    finally:
        worker.stop()  # killed if it did not


def test_slow_verdicts_on_a_small_pool_lose_no_run_and_stall_no_other_task(worker_env):
    """Pool 2, concurrency 6: four verdicts wait three leases for the model supervisor at once
    while two ordinary tasks keep working. Each task reaches review through one run, approved by
    the model; no lease lapsed, so nothing was recovered as lost or handed back."""
    with (
        ScriptedModelServer(default=reply_text("APPROVED", delay=SUPERVISOR_DELAY)) as judge,
        ScriptedModelServer(default=_answer) as agents,
    ):
        _supervisor(judge)
        model = scripted_model(agents)
        tasks = [_task(model, "quick", n) for n in range(4)]
        tasks += [_task(model, "steady", n) for n in range(2)]
        ids = [t.pk for t in tasks]
        worker = WorkerProcess({**worker_env, **ENV}, "--concurrency", "6", worker_id="judged")
        try:
            # The four quick verdicts are all waiting for the supervisor (the pool is 2).
            assert judge.wait_for_requests(4, 30)
            # The heartbeat has a connection of its own, beside the pool.
            wait_for(lambda: _backends("acthelm-heartbeat judged") == 1, timeout=10)
            wait_for(
                lambda: Task.objects.filter(pk__in=ids, status=TaskStatus.REVIEW).count() == 6,
                timeout=SUPERVISOR_DELAY + 40,
                message="every task in review",
            )
        finally:
            _stop(worker)
    assert worker.proc.returncode == 0, worker.output
    runs = AgentRun.objects.filter(task_id__in=ids)
    assert sorted(runs.values_list("task_id", flat=True)) == sorted(ids)  # one run each
    assert set(runs.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    assert set(runs.values_list("verdict", flat=True)) == {Verdict.APPROVED}
    assert all(
        r.startswith("approved by supervisor/")
        for r in runs.values_list("verdict_reason", flat=True)
    )
    assert len(judge.completion_requests) == 6


def _waiting_on_a_lock(name: str) -> bool:
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s "
            "AND wait_event_type = 'Lock'",
            [name],
        )
        return cursor.fetchone()[0] > 0


def test_a_run_stuck_on_the_database_with_the_whole_pool_does_not_stop_the_heartbeat(worker_env):
    """Pool 1: the first verdict's read waits on a lock (held here for three leases) with the
    pool's one connection, the other runs wait for the pool. The heartbeat, on its own
    connection, still renews every lease, so the other worker process recovers nothing."""
    lease = 4.0
    env = {**worker_env, **ENV, "ACTHELM_DB_POOL_SIZE": "1", "ACTHELM_SUPERVISOR_CONNECTION": ""}
    env.update(ACTHELM_LEASE_SECONDS=str(lease), ACTHELM_HEARTBEAT_SECONDS="0.5")
    with ScriptedModelServer(default=_list_once) as agents:
        model = scripted_model(agents)
        ids = [_task(model, "quick", n).pk for n in range(3)]
        with psycopg.connect(conninfo()) as locker:
            # The verdict reads the run's artifacts first
            # (agents.engine.verdict.evidence.run_record): a task that made a tool call, so that
            # there is something to read.
            locker.execute("LOCK TABLE agents_artifact IN ACCESS EXCLUSIVE MODE")
            stuck = WorkerProcess(env, "--concurrency", "3", worker_id="stuck")
            rescuer = None
            try:
                wait_for(lambda: _waiting_on_a_lock("acthelm-worker stuck"), timeout=30)
                # Every task is held by the stuck process; the other one only recovers.
                rescuer = WorkerProcess(env, worker_id="rescuer")
                time.sleep(3 * lease)
                locker.commit()
                wait_for(
                    lambda: Task.objects.filter(pk__in=ids, status=TaskStatus.REVIEW).count() == 3,
                    timeout=40,
                    message="every task in review",
                )
            finally:
                _stop(stuck)
                if rescuer is not None:
                    _stop(rescuer)
    runs = AgentRun.objects.filter(task_id__in=ids)
    assert sorted(runs.values_list("task_id", flat=True)) == sorted(ids)  # one run each
    assert set(runs.values_list("status", flat=True)) == {RunStatus.SUCCEEDED}
    assert set(runs.values_list("worker_id", flat=True)) == {"stuck"}


def test_a_cancel_aborts_the_supervisors_request_at_once(worker_env):
    with (
        ScriptedModelServer(default=hang(60, then=reply_text("APPROVED"))) as judge,
        ScriptedModelServer([reply_text("Done.")]) as agents,
    ):
        _supervisor(judge)
        task = _task(scripted_model(agents), "quick", 0)
        env = {
            **worker_env,
            **ENV,
            "ACTHELM_HEARTBEAT_SECONDS": "30",
            "ACTHELM_LEASE_SECONDS": "90",
        }
        worker = WorkerProcess(env, worker_id="cancelled-verdict")
        try:
            assert judge.wait_for_requests(1, 20)
            task_cancel(actor=Actor.system("test"), task_id=task.pk)
            cancelled_at = time.monotonic()
            # Let go of well before the 30-s heartbeat, let alone the 60-s answer.
            assert judge.wait_aborted(10)
            assert time.monotonic() - cancelled_at < 10
        finally:
            _stop(worker)
    task.refresh_from_db()
    assert task.status == TaskStatus.CANCELLED
    run = AgentRun.objects.get(task=task)
    assert run.status == RunStatus.CANCELLED and run.verdict == ""
