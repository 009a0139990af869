"""The recorder's step write (agents.engine.run.recorder, its statements through core.fastsql): the
fence still guards every write — a run that no longer holds its task writes nothing and gets
AttemptLost — and a step is one transaction at the server, counted by PostgreSQL itself
(pg_stat_database.xact_commit of the test database)."""

from typing import Any

import pytest
from django.db import connection, transaction
from django.utils import timezone

from agents.actions.task import task_cancel
from agents.engine.run.recorder import CallState, NewCall, NewTurn, Recorder, Result, Step
from agents.engine.run.usage import Usage
from agents.engine.store import claim_next
from agents.models import AgentRun, ToolCall, Turn
from agents.states import RunStatus, ToolCallStatus
from core.actors import Actor
from core.exceptions import AttemptLost, TransitionNotAllowed
from tasks.models import Task, TaskEvent
from tasks.states import EventKind
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _checkpoint() -> dict[str, Any]:
    return {"remaining": {}, "pending_operations": []}


def _step(index: int, previous: CallState | None = None) -> tuple[Step, CallState]:
    """An assistant turn asking for list_files (and the previous call's result, when given),
    with its events and usage: what a read-only tool step writes."""
    call = CallState(
        call_id=f"call_{index}",
        tool="list_files",
        arguments={},
        arguments_raw="{}",
        recovery_class="read_only",
        position=0,
    )
    step = Step(usage=Usage(model_turns=1, input_tokens=100, output_tokens=10))
    step.turns.append(
        NewTurn(index=index, role="assistant", content="", stop_reason="tool_calls", calls=[])
    )
    step.turns[0].calls.append(NewCall(call))
    step.event(EventKind.MODEL_TURN, {"turn": index, "tool_calls": 1})
    if previous is not None:
        step.results.append(
            Result(
                previous,
                ToolCallStatus.SUCCEEDED,
                result="a.txt",
                result_for_model="a.txt",
                error_code="",
                runs=1,
                started=True,
            )
        )
        step.event(EventKind.TOOL_RESULT, {"tool": "list_files", "ok": True}, call=previous)
    return step, call


def _claimed() -> tuple[Recorder, Task]:
    task = TaskFactory(tools=["list_files"])
    claim = claim_next(worker_id="w")
    assert claim is not None and claim.task_id == task.pk
    recorder = Recorder(task_id=task.pk, run_id=claim.run_id, actor=Actor.worker("w"))
    return recorder, task


def _rows(task: Task) -> tuple[int, int, int]:
    return (
        Turn.objects.filter(task=task).count(),
        ToolCall.objects.filter(task=task).count(),
        TaskEvent.objects.filter(task=task).count(),
    )


def test_a_held_run_writes_its_step_and_the_next_one_moves_the_call():
    recorder, task = _claimed()
    first, call = _step(0)
    assert recorder.commit(first, checkpoint=_checkpoint) == "in_progress"
    assert call.pk is not None
    second, _ = _step(1, previous=call)
    recorder.commit(second, checkpoint=_checkpoint)
    row = ToolCall.objects.get(pk=call.pk)
    assert (row.status, row.result, row.run_count) == ("succeeded", "a.txt", 1)
    assert row.run_id == recorder.run_id and row.started_at is not None
    event = TaskEvent.objects.get(task=task, kind=EventKind.TOOL_RESULT)
    assert event.data["tool_call_id"] == call.pk and event.run_id == recorder.run_id
    run = AgentRun.objects.get(pk=recorder.run_id)
    assert (run.model_turns, run.input_tokens, run.output_tokens) == (2, 200, 20)
    assert run.checkpoint == _checkpoint()
    assert _rows(task) == (2, 2, 1 + 2 + 1)  # the claim event, two model turns, one result


def _lose_by_claim_count(task: Task, run_id: int) -> None:
    Task.objects.filter(pk=task.pk).update(claim_count=task.claim_count + 5)


def _lose_by_run_ended(task: Task, run_id: int) -> None:
    AgentRun.objects.filter(pk=run_id).update(status=RunStatus.FAILED, finished_at=timezone.now())


def _lose_by_cancel(task: Task, run_id: int) -> None:
    task_cancel(actor=Actor.system("test"), task_id=task.pk)


@pytest.mark.parametrize("lose", [_lose_by_claim_count, _lose_by_run_ended, _lose_by_cancel])
def test_a_stale_attempts_step_changes_nothing_and_raises_attempt_lost(lose):
    recorder, task = _claimed()
    first, call = _step(0)
    recorder.commit(first, checkpoint=_checkpoint)
    task.refresh_from_db()
    lose(task, recorder.run_id)
    before_rows = _rows(task)
    before_run = AgentRun.objects.values().get(pk=recorder.run_id)
    before_call = ToolCall.objects.values().get(pk=call.pk)
    stale, _ = _step(1, previous=call)
    stale.answer = "late answer"
    with pytest.raises(AttemptLost):
        recorder.commit(stale, checkpoint=lambda: {"stale": True})
    assert _rows(task) == before_rows
    assert AgentRun.objects.values().get(pk=recorder.run_id) == before_run
    assert ToolCall.objects.values().get(pk=call.pk) == before_call


def _transactions() -> int:
    """Transactions committed in this database so far, as the server counts them (this
    backend's pending counts flushed first)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def _transactions_of(fn) -> int:
    empty = -_transactions() + _transactions()  # what counting itself adds
    before = _transactions()
    fn()
    return _transactions() - before - empty


def test_a_step_is_one_transaction_at_the_server():
    recorder, _ = _claimed()
    first, call = _step(0)
    assert _transactions_of(lambda: recorder.commit(first, checkpoint=_checkpoint)) == 1
    second, _ = _step(1, previous=call)
    assert _transactions_of(lambda: recorder.commit(second, checkpoint=_checkpoint)) == 1
    assert _transactions_of(lambda: None) == 0  # the counter sees no phantom transactions


def _server_counts() -> tuple[int, int, int]:
    """Transactions committed, rolled back, and rows written (inserted, updated, deleted) in this
    database so far, as the server counts them (this backend's pending counts flushed first)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit, xact_rollback, tup_inserted + tup_updated + tup_deleted "
            "FROM pg_stat_database WHERE datname = current_database()"
        )
        commits, rollbacks, rows = cursor.fetchone()
        return int(commits), int(rollbacks), int(rows)


def test_a_stale_step_is_one_read_only_commit_at_the_server_and_writes_no_row():
    """The step function finds the fence lost and returns without a status: its statement
    commits having written nothing (no row, no lease renewal), nothing to roll back."""
    recorder, task = _claimed()
    first, call = _step(0)
    recorder.commit(first, checkpoint=_checkpoint)
    _lose_by_claim_count(task, recorder.run_id)
    task.refresh_from_db()
    stale, _ = _step(1, previous=call)
    empty = tuple(b - a for a, b in zip(_server_counts(), _server_counts(), strict=True))
    before = _server_counts()
    with pytest.raises(AttemptLost):
        recorder.commit(stale, checkpoint=_checkpoint)
    after = _server_counts()
    commits, rollbacks, rows = (b - a - e for a, b, e in zip(before, after, empty, strict=True))
    assert (commits, rollbacks, rows) == (1, 0, 0)
    assert Task.objects.get(pk=task.pk).lease_expires_at == task.lease_expires_at


def _row_version(task: Task) -> tuple[str, str]:
    """The task row's version (xmin: the transaction that wrote it) and its locker (xmax)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT xmin::text, xmax::text FROM tasks_task WHERE id = %s", [task.pk])
        return cursor.fetchone()


def test_a_step_locks_the_task_row_and_writes_no_new_version_of_it():
    """The step's fence is a locking read (store.fence.fence_lock): the row is locked — its xmax is
    the step's transaction — but not rewritten, and the lease is the heartbeat's to renew."""
    recorder, task = _claimed()
    written, _ = _row_version(task)
    lease = Task.objects.get(pk=task.pk).lease_expires_at
    first, call = _step(0)
    recorder.commit(first, checkpoint=_checkpoint)
    second, _ = _step(1, previous=call)
    recorder.commit(second, checkpoint=_checkpoint)
    xmin, xmax = _row_version(task)
    assert xmin == written and xmax != "0"
    assert Task.objects.get(pk=task.pk).lease_expires_at == lease
    assert Turn.objects.filter(task=task).count() == 2


def test_a_step_waits_for_a_persons_cancel_holding_the_row_and_then_writes_nothing():
    """The lock is the one a person's transaction takes: a step that arrives while a cancel
    holds the task row waits for it, re-reads the row after the wait and finds the run fenced
    out — nothing of the step is written."""
    import threading

    from tasks.transitions import lock_task
    from tests.agents.scripted import waits_for_a_lock

    recorder, task = _claimed()
    first, call = _step(0)
    recorder.commit(first, checkpoint=_checkpoint)
    holding, errors = threading.Event(), []

    def person() -> None:
        try:
            with transaction.atomic():
                lock_task(task.pk)
                holding.set()
                if not waits_for_a_lock("%acthelm_step%"):
                    errors.append("the step never waited for the person's lock")
                task_cancel(actor=Actor.system("test"), task_id=task.pk)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(repr(exc))
        finally:
            connection.close()

    thread = threading.Thread(target=person)
    thread.start()
    assert holding.wait(10)
    before = _rows(task)
    stale, _ = _step(1, previous=call)
    with pytest.raises(AttemptLost):
        recorder.commit(stale, checkpoint=_checkpoint)
    thread.join(10)
    assert not errors, errors
    assert Task.objects.get(pk=task.pk).status == "cancelled"
    assert _rows(task) == (before[0], before[1], before[2] + 1)  # the cancel's own event only


def test_a_steps_new_call_ids_reach_its_events_and_checkpoint():
    """The one-statement step: a new call's id, known only inside the statement, goes into the
    event that names it and into the checkpoint (what `checkpoint()` read from the call)."""
    recorder, task = _claimed()
    first, call = _step(0)
    refused = CallState(
        call_id="call_0b",
        tool="nope",
        arguments={},
        arguments_raw="{}",
        recovery_class="read_only",
        position=1,
        status=ToolCallStatus.REFUSED,
        error_code="tool_not_offered",
    )
    first.turns[0].calls.append(NewCall(refused, result="tool_not_offered: no"))
    first.event(EventKind.TOOL_RESULT, {"tool": "nope", "ok": False}, call=refused)
    calls = [call, refused]

    def checkpoint() -> dict[str, Any]:
        return {
            "pending_operations": [{"id": c.pk, "tool": c.tool} for c in calls],
            "turn_calls": [c.pk for c in calls],
            "note": "0\u2603",
        }

    recorder.commit(first, checkpoint=checkpoint)
    rows = {c.call_id: c for c in ToolCall.objects.filter(task=task)}
    assert (call.pk, refused.pk) == (rows["call_0"].pk, rows["call_0b"].pk)
    assert rows["call_0b"].status == "refused" and rows["call_0b"].finished_at is not None
    assert rows["call_0"].turn_id == rows["call_0b"].turn_id == Turn.objects.get(task=task).pk
    event = TaskEvent.objects.get(task=task, kind=EventKind.TOOL_RESULT)
    assert event.data == {"tool": "nope", "ok": False, "tool_call_id": refused.pk}
    run = AgentRun.objects.get(pk=recorder.run_id)
    assert run.checkpoint == checkpoint()
    assert run.checkpoint["turn_calls"] == [call.pk, refused.pk]


def test_a_new_call_moved_in_its_own_step_is_written_in_its_final_state():
    """An external call's intent with the turn that asks for it: inserted running, once."""
    recorder, _ = _claimed()
    first, call = _step(0)
    call.status = ToolCallStatus.RUNNING
    first.results.append(Result(call, ToolCallStatus.RUNNING, finished=False, runs=1, started=True))
    recorder.commit(first, checkpoint=_checkpoint)
    row = ToolCall.objects.get(pk=call.pk)
    assert (row.status, row.run_count, row.finished_at) == ("running", 1, None)
    assert row.started_at is not None


def test_a_move_the_table_refuses_writes_nothing_of_the_step():
    """A saved call that cannot make its move (succeeded -> succeeded): TransitionNotAllowed,
    and nothing of the step — turn, call, event, usage, checkpoint — is stored."""
    recorder, task = _claimed()
    first, call = _step(0)
    recorder.commit(first, checkpoint=_checkpoint)
    second, _ = _step(1, previous=call)
    recorder.commit(second, checkpoint=_checkpoint)
    before_rows = _rows(task)
    before_run = AgentRun.objects.values().get(pk=recorder.run_id)
    again, _ = _step(2, previous=call)  # the same call, succeeded already
    with pytest.raises(TransitionNotAllowed):
        recorder.commit(again, checkpoint=lambda: {"again": True})
    assert _rows(task) == before_rows
    assert AgentRun.objects.values().get(pk=recorder.run_id) == before_run
