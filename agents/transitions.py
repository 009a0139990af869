"""The only writer of a run's status; the caller holds the task's row lock."""

from django.db import connection
from django.utils import timezone

from agents.models import AgentRun, ToolCall
from agents.states import RUN_TRANSITIONS, TOOL_CALL_TRANSITIONS, RunStatus
from tasks.exceptions import TransitionNotAllowed


def finish_run(run: AgentRun | int, status: str, **fields) -> None:
    """Move a started run to succeeded, failed or cancelled, with its result fields."""
    if not connection.in_atomic_block:
        raise RuntimeError("run transitions must run inside transaction.atomic()")
    if status not in RUN_TRANSITIONS[RunStatus.STARTED]:
        raise TransitionNotAllowed(f"a run cannot finish as {status}")
    run_id = run.pk if isinstance(run, AgentRun) else run
    updated = AgentRun.objects.filter(pk=run_id, status=RunStatus.STARTED).update(
        status=status, finished_at=timezone.now(), **fields
    )
    if updated != 1:
        raise TransitionNotAllowed(f"run {run_id} is not started; it cannot become {status}")
    if isinstance(run, AgentRun):
        run.status = status
        for name, value in fields.items():
            setattr(run, name, value)


def end_started_runs(task_id: int, status: str, **fields) -> list[int]:
    """A person's action ends whatever attempt was running (the worker notices at its heartbeat)."""
    ids = list(
        AgentRun.objects.filter(task_id=task_id, status=RunStatus.STARTED).values_list(
            "id", flat=True
        )
    )
    for run_id in ids:
        finish_run(run_id, status, **fields)
    return ids


def set_call_status(call: ToolCall | int, to: str, **fields) -> None:
    """Move a tool call along TOOL_CALL_TRANSITIONS with its result fields, in one conditional
    UPDATE; the caller is in the transaction that holds the task's lock (a fenced write, or a
    person's decision)."""
    if not connection.in_atomic_block:
        raise RuntimeError("tool-call transitions must run inside transaction.atomic()")
    call_id = call.pk if isinstance(call, ToolCall) else call
    sources = [state for state, targets in TOOL_CALL_TRANSITIONS.items() if to in targets]
    updated = ToolCall.objects.filter(pk=call_id, status__in=sources).update(status=to, **fields)
    if updated != 1:
        raise TransitionNotAllowed(f"tool call {call_id} cannot become {to}")
    if isinstance(call, ToolCall):
        call.status = to
        for name, value in fields.items():
            setattr(call, name, value)
