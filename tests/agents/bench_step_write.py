"""What a read-only step's write costs in CPU, the worker's and its PostgreSQL backend's, over
STEPS steps of one run, and the WAL it makes (not collected by the suite: run it by name, a tree
against another).

    .venv/bin/python -m pytest tests/agents/bench_step_write.py -q -s
    STEPS=1500 PREPARE=1 .venv/bin/python -m pytest tests/agents/bench_step_write.py -q -s

Each step is what a list_files step writes: the previous call's result and its event, a model
turn asking for one call, its model_turn event, the usage and the checkpoint. The client's CPU is
the process's (building the step included); the backend's is read from /proc (the embedded
server). PREPARE=1 makes the connection prepare every statement (psycopg's prepare_threshold 0:
what `OPTIONS["prepare_threshold"]` does when no transaction-mode pooler is in between)."""

import os
import time
from typing import Any

import pytest
from django.db import connection

from agents.engine.run.recorder import CallState, NewCall, NewTurn, Recorder, Result, Step
from agents.engine.run.usage import Usage
from agents.engine.store import claim_next
from agents.states import ToolCallStatus
from core.actors import Actor
from tasks.states import EventKind
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)
STEPS = int(os.environ.get("STEPS", "1500"))
WARM_UP = 50


def _backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wal() -> int:
    """Bytes of WAL the server has written so far (every database's: run it on a quiet one)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn")
        return int(cursor.fetchone()[0])


def test_step_write_cpu() -> None:
    task = TaskFactory(tools=["list_files"])
    claim = claim_next(worker_id="w")
    assert claim is not None
    recorder = Recorder(task_id=task.pk, run_id=claim.run_id, actor=Actor.worker("w"))
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        pid = cursor.fetchone()[0]
    if os.environ.get("PREPARE"):
        connection.connection.prepare_threshold = 0
    calls: list[CallState] = []

    def step(i: int) -> Step:
        call = CallState(
            call_id=f"call_{i}",
            tool="list_files",
            arguments={"path": "."},
            arguments_raw='{"path": "."}',
            recovery_class="read_only",
            position=0,
        )
        s = Step(usage=Usage(model_turns=1, input_tokens=1000, output_tokens=20))
        if calls:
            previous = calls[-1]
            previous.status = ToolCallStatus.SUCCEEDED
            s.results.append(
                Result(
                    previous,
                    ToolCallStatus.SUCCEEDED,
                    result="a.txt\nb.txt",
                    result_for_model="a.txt\nb.txt",
                    error_code="",
                    runs=1,
                    started=True,
                    arguments={"path": "."},
                    arguments_hash="h" * 64,
                )
            )
            s.event(EventKind.TOOL_RESULT, {"tool": "list_files", "ok": True}, call=previous)
        turn = NewTurn(index=i, role="assistant", content="", stop_reason="tool_calls")
        turn.calls.append(NewCall(call))
        s.turns.append(turn)
        s.event(EventKind.MODEL_TURN, {"turn": i, "stop_reason": "tool_calls", "tool_calls": 1})
        calls.append(call)
        return s

    def checkpoint() -> dict[str, Any]:
        return {
            "remaining": {"model_turns": 10},
            "pending_operations": [
                {"id": c.pk, "tool": c.tool, "status": str(c.status)}
                for c in calls
                if c.status == ToolCallStatus.PENDING
            ],
            "turn_calls": [calls[-1].pk],
        }

    for i in range(WARM_UP):
        recorder.commit(step(i), checkpoint=checkpoint)
    l0 = _wal()
    c0, b0, w0 = time.process_time(), _backend_cpu(pid), time.perf_counter()
    for i in range(WARM_UP, WARM_UP + STEPS):
        recorder.commit(step(i), checkpoint=checkpoint)
    c1, b1, w1 = time.process_time(), _backend_cpu(pid), time.perf_counter()
    wal = _wal() - l0
    print(
        f"\nstep write, ms a step: client CPU {(c1 - c0) * 1000 / STEPS:.3f}, "
        f"backend CPU {(b1 - b0) * 1000 / STEPS:.3f}, wall {(w1 - w0) * 1000 / STEPS:.3f}; "
        f"WAL {wal / STEPS:.0f} bytes a step (the whole server's)"
    )
