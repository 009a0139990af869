"""What happens to a task after a run: review, retry, back-off, loop, cooldown, hand-back, and
recovery of runs whose worker died.

A run ends with an `Outcome`; `HANDLERS` maps each `OutcomeKind` to one small function that moves
the run and the task. They run inside the fenced transaction that records the run's last step
(`agents.engine.recorder`), or inside `apply_outcome`'s own fence. The status changes themselves go
through tasks.transitions.
"""

import enum
import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import Q
from django.utils import timezone

from agents.engine import storable
from agents.engine.leases import fence
from agents.engine.policies import auto_close_if_allowed
from agents.engine.transitions import finish_run
from agents.models import AgentRun, Connection, Model
from agents.states import CostTier, ModelTestStatus, RunStatus, Verdict
from tasks.actors import Actor
from tasks.models import Task
from tasks.services import note_stuck_dependants
from tasks.states import HELD, EventKind, TaskStatus
from tasks.transitions import record_event, set_status

log = logging.getLogger("acthelm.worker")


class OutcomeKind(enum.StrEnum):
    FINAL = "final"
    PAUSED = "paused"
    HANDED_BACK = "handed_back"
    AWAITING_APPROVAL = "awaiting_approval"
    NEEDS_REVIEW = "needs_review"
    FAILED = "failed"
    LOST = "lost"


@dataclass(frozen=True)
class Outcome:
    """How a run ended. `retryable` says whether the same attempt may succeed later; `health`
    that the error is about the connection (auth, quota, rate limit), not the task."""

    kind: OutcomeKind
    answer: str = ""
    code: str = ""
    message: str = ""
    health: bool = False
    retryable: bool = False

    def __post_init__(self) -> None:
        # A provider's or a tool's words reach the run row, the task and its events.
        object.__setattr__(self, "answer", storable.text(self.answer))
        object.__setattr__(self, "message", storable.text(self.message))

    FINAL = OutcomeKind.FINAL
    PAUSED = OutcomeKind.PAUSED
    HANDED_BACK = OutcomeKind.HANDED_BACK
    AWAITING_APPROVAL = OutcomeKind.AWAITING_APPROVAL
    NEEDS_REVIEW = OutcomeKind.NEEDS_REVIEW
    FAILED = OutcomeKind.FAILED
    LOST = OutcomeKind.LOST


# Failures that retrying cannot fix: the task fails at once.
FINAL_CODES = frozenset(
    {"connection_missing", "connection_disabled", "model_untested", "model_not_tool_capable"}
)
# Run endings that are not failed attempts.
NOT_ATTEMPTS = frozenset(
    {
        "worker_lost",
        "handed_back",
        "paused",
        "awaiting_approval",
        "needs_review",
        "cancelled",
        "provider_auth",
        "provider_cooling_down",
    }
)


def error_signature(code: str, message: str) -> str:
    """Same code and message up to numbers, ids and addresses: the same error."""
    text = (message or "").lower()
    text = re.sub(r"0x[0-9a-f]+|[0-9a-f]{8,}|\d+(\.\d+)?", "N", text)
    return f"{code}:{' '.join(text.split())[:300]}"


def _requeue(task: Task, *, actor: Actor, kind: str, run=None, data=None, **fields) -> None:
    """Back to ready — or to paused, when a person asked for a pause meanwhile."""
    if task.status == TaskStatus.PAUSE_REQUESTED:
        set_status(
            task,
            TaskStatus.PAUSED,
            actor=actor,
            kind=EventKind.PAUSED,
            run=run,
            data={"after": kind, **(data or {})},
            **fields,
        )
    else:
        set_status(task, TaskStatus.READY, actor=actor, kind=kind, run=run, data=data, **fields)


def _fail_task(task, run, *, actor, code: str, message: str, **fields) -> None:
    set_status(
        task,
        TaskStatus.FAILED,
        actor=actor,
        kind=EventKind.FAILED,
        run=run,
        data={"code": code, "message": message[:2000]},
        failure_code=code,
        failure_message=message[:10_000],
        **fields,
    )
    note_stuck_dependants(task, actor=actor)


@dataclass
class Ending:
    """Everything a handler needs: the locked task, the run, who acts, the database's clock."""

    task: Task
    run: AgentRun
    actor: Actor
    outcome: Outcome
    verdict: object
    now: object


def _on_final(e: Ending) -> None:
    verdict = e.verdict
    checks = list(getattr(verdict, "checks_as_dicts", None) or [])
    if verdict is not None and verdict.approved:
        kind = Verdict.UNVERIFIED if getattr(verdict, "unverified", False) else Verdict.APPROVED
        finish_run(
            e.run,
            RunStatus.SUCCEEDED,
            verdict=kind,
            verdict_reason=verdict.reason,
            answer=e.outcome.answer,
        )
        set_status(
            e.task,
            TaskStatus.REVIEW,
            actor=e.actor,
            kind=EventKind.SUBMITTED,
            run=e.run,
            data={"verdict": kind, "reason": verdict.reason}
            | ({"checks": checks} if checks else {}),
            failure_code="",
            failure_message="",
        )
        auto_close_if_allowed(e.task, e.run, actor=e.actor)
        return
    reason = verdict.reason if verdict else "no verdict"
    finish_run(
        e.run,
        RunStatus.FAILED,
        verdict=Verdict.REJECTED,
        verdict_reason=reason,
        error_code="supervisor_rejected",
        error_message=reason,
    )
    record_event(
        e.task,
        actor=e.actor,
        kind=EventKind.REJECTED,
        run=e.run,
        data={"reason": reason} | ({"checks": checks} if checks else {}),
    )
    _retry_or_fail(
        e.task,
        e.run,
        actor=e.actor,
        code="supervisor_rejected",
        message=reason,
        now=e.now,
        feedback=reason,
    )


def _on_paused(e: Ending) -> None:
    finish_run(e.run, RunStatus.CANCELLED, error_code="paused")
    if e.task.status != TaskStatus.PAUSE_REQUESTED:
        # The pause was withdrawn after the run stopped for it: the task goes on, on any worker.
        set_status(
            e.task,
            TaskStatus.READY,
            actor=e.actor,
            kind=EventKind.HANDED_BACK,
            run=e.run,
            data={"reason": "pause withdrawn"},
        )
        return
    set_status(e.task, TaskStatus.PAUSED, actor=e.actor, kind=EventKind.PAUSED, run=e.run)


def _on_handed_back(e: Ending) -> None:
    finish_run(e.run, RunStatus.CANCELLED, error_code="handed_back")
    cap = settings.ACTHELM_MAX_HANDBACKS
    recent = list(
        AgentRun.objects.filter(task=e.task)
        .order_by("-number")
        .values_list("error_code", flat=True)[: cap + 1]
    )
    if len(recent) > cap and all(code == "handed_back" for code in recent):
        # A hand-back is not an attempt, so no attempt limit ends a task that is handed back
        # again and again (a fault that looks like a lost database, a worker restarting in a
        # loop): after `cap` in a row it fails, for a person to look at.
        _fail_task(
            e.task,
            e.run,
            actor=e.actor,
            code="handback_loop",
            message=f"the task was handed back {len(recent)} times in a row without an "
            f"attempt ending (last: {e.outcome.message or 'worker shutting down'})",
        )
        return
    _requeue(
        e.task,
        actor=e.actor,
        kind=EventKind.HANDED_BACK,
        run=e.run,
        data={"reason": e.outcome.message or "worker shutting down"},
    )


def _on_awaiting_approval(e: Ending) -> None:
    finish_run(e.run, RunStatus.CANCELLED, error_code="awaiting_approval")
    set_status(
        e.task,
        TaskStatus.AWAITING_APPROVAL,
        actor=e.actor,
        kind=EventKind.APPROVAL_REQUESTED,
        run=e.run,
    )


def _on_needs_review(e: Ending) -> None:
    finish_run(e.run, RunStatus.CANCELLED, error_code="needs_review")
    set_status(
        e.task, TaskStatus.NEEDS_REVIEW, actor=e.actor, kind=EventKind.NEEDS_REVIEW, run=e.run
    )


def _on_failed(e: Ending) -> None:
    outcome = e.outcome
    finish_run(
        e.run,
        RunStatus.FAILED,
        error_code=outcome.code,
        error_message=outcome.message[:10_000],
    )
    if outcome.health:
        _cool_down_and_move(
            e.task, e.run, actor=e.actor, code=outcome.code, message=outcome.message, now=e.now
        )
    elif outcome.code.startswith("limit_") or outcome.code in FINAL_CODES or not outcome.retryable:
        _fail_task(e.task, e.run, actor=e.actor, code=outcome.code, message=outcome.message)
    else:
        _retry_or_fail(
            e.task, e.run, actor=e.actor, code=outcome.code, message=outcome.message, now=e.now
        )


HANDLERS: dict[OutcomeKind, Callable[[Ending], None]] = {
    OutcomeKind.FINAL: _on_final,
    OutcomeKind.PAUSED: _on_paused,
    OutcomeKind.HANDED_BACK: _on_handed_back,
    OutcomeKind.AWAITING_APPROVAL: _on_awaiting_approval,
    OutcomeKind.NEEDS_REVIEW: _on_needs_review,
    OutcomeKind.FAILED: _on_failed,
}


def handle(
    task: Task, run: AgentRun, *, actor: Actor, outcome: Outcome, verdict=None, now=None
) -> str:
    """Apply `outcome` to a task the caller holds (inside its fenced transaction)."""
    handler = HANDLERS.get(OutcomeKind(outcome.kind))
    if handler is None:
        raise ValueError(f"outcome {outcome.kind!r} writes nothing")
    handler(Ending(task, run, actor, outcome, verdict, now or timezone.now()))
    return task.status


def apply_outcome(
    *,
    task_id: int,
    run_id: int,
    worker_id: str,
    outcome: Outcome,
    verdict=None,
    now=None,
) -> str | None:
    """Write the run's result and move the task, fenced. Returns the task's new status, or None
    when the run had already lost its task (nothing written)."""
    if outcome.kind == Outcome.LOST:
        return None

    with transaction.atomic():
        held = fence(run_id, task_id, full=True)
        run = AgentRun.objects.get(pk=run_id)
        return handle(
            held.task,
            run,
            actor=Actor.worker(worker_id),
            outcome=outcome,
            verdict=verdict,
            now=now or held.now,
        )


def _retry_or_fail(task, run, *, actor, code, message, now, feedback: str = "") -> None:
    """A failed attempt. The first run is not a retry: after the n-th failed attempt the task
    waits ACTHELM_RETRY_DELAYS[n-1] and runs again, so with the defaults (3 retries; 1, 5, 30
    minutes) every delay is used, and the failure after the third retry fails the task — as
    `error_loop` when every attempt failed with the same error."""
    attempts = task.failed_attempts + 1
    if attempts > settings.ACTHELM_MAX_ATTEMPTS:
        recent = list(
            AgentRun.objects.filter(task=task, status=RunStatus.FAILED)
            .exclude(error_code__in=NOT_ATTEMPTS)
            .order_by("-number")
            .values_list("error_code", "error_message")[:attempts]
        )
        signatures = {error_signature(c, m) for c, m in recent}
        if len(recent) >= attempts and len(signatures) == 1:
            loop_message = (
                f"a loop: all {len(recent)} attempts failed with the same error "
                f"({code}: {message[:500]})"
            )
            _fail_task(
                task,
                run,
                actor=actor,
                code="error_loop",
                message=loop_message,
                failed_attempts=attempts,
            )
        else:
            _fail_task(task, run, actor=actor, code=code, message=message, failed_attempts=attempts)
        return
    delays = settings.ACTHELM_RETRY_DELAYS
    delay = delays[min(attempts - 1, len(delays) - 1)]
    fields = {"failed_attempts": attempts, "not_before": now + timedelta(seconds=delay)}
    if feedback:
        fields["feedback"] = feedback
    _requeue(
        task,
        actor=actor,
        kind=EventKind.RETRY_SCHEDULED,
        run=run,
        data={"attempt": attempts, "delay_seconds": delay, "code": code, "message": message[:500]},
        **fields,
    )


def fallback_model(task: Task, *, exclude_connection_id: int | None, now) -> Model | None:
    """The next zero-cost connection whose model passed its test and is not cooling down.
    Never a paid one."""
    qs = (
        Model.objects.select_related("connection")
        .filter(
            test_status=ModelTestStatus.PASSED,
            connection__enabled=True,
            connection__cost_tier=CostTier.ZERO_COST,
        )
        .filter(Q(connection__cooldown_until__isnull=True) | Q(connection__cooldown_until__lte=now))
    )
    if exclude_connection_id:
        qs = qs.exclude(connection_id=exclude_connection_id)
    if [t for t in task.tools if t]:
        qs = qs.filter(supports_tools=True)
    return qs.order_by("-connection__priority", "connection__name", "name").first()


def _cool_down_and_move(task, run, *, actor, code, message, now) -> None:
    conn = Connection.objects.select_for_update().get(pk=run.connection_id or task.connection_id)
    if code != "provider_cooling_down":
        conn.cooldown_until = now + timedelta(seconds=settings.ACTHELM_COOLDOWN_SECONDS)
        conn.last_error_code = code
        conn.last_error_message = message[:2000]
        conn.last_error_at = now
        conn.save(
            update_fields=[
                "cooldown_until",
                "last_error_code",
                "last_error_message",
                "last_error_at",
            ]
        )
    record_event(
        task,
        actor=actor,
        kind=EventKind.PROVIDER_COOLDOWN,
        run=run,
        data={
            "connection": conn.name,
            "code": code,
            "until": conn.cooldown_until.isoformat() if conn.cooldown_until else None,
        },
    )
    log.warning(
        "provider.cooldown", extra={"connection": conn.name, "code": code, "task_id": task.pk}
    )
    if code == "provider_auth" and (
        AgentRun.objects.filter(task=task, error_code="provider_auth").exclude(pk=run.pk).exists()
    ):
        # The key was refused again after a whole cooldown cycle: a wrong key does not heal.
        _fail_task(
            task,
            run,
            actor=actor,
            code=code,
            message=f"the connection {conn.name} refused the credential again after its "
            f"cooldown: {message}",
        )
        return
    fields = {}
    if code in ("provider_quota", "provider_rate_limited"):
        # Quota and rate limits count against the attempts like other errors: they end.
        attempts = task.failed_attempts + 1
        if attempts > settings.ACTHELM_MAX_ATTEMPTS:
            _fail_task(task, run, actor=actor, code=code, message=message, failed_attempts=attempts)
            return
        fields["failed_attempts"] = attempts
    model = fallback_model(task, exclude_connection_id=conn.pk, now=now)
    if model is not None:
        _requeue(
            task,
            actor=actor,
            kind=EventKind.RETRY_SCHEDULED,
            run=run,
            data={"fallback": str(model), "from": conn.name, "code": code},
            connection=model.connection,
            model=model,
            not_before=None,
            **fields,
        )
        return
    # No zero-cost connection is available: wait for the earliest cooldown to end, not fail.
    ends = list(
        Connection.objects.filter(
            Q(pk=conn.pk) | Q(cost_tier=CostTier.ZERO_COST, enabled=True),
            cooldown_until__gt=now,
        ).values_list("cooldown_until", flat=True)
    )
    wait_until = min(ends) if ends else now + timedelta(seconds=settings.ACTHELM_COOLDOWN_SECONDS)
    _requeue(
        task,
        actor=actor,
        kind=EventKind.RETRY_SCHEDULED,
        run=run,
        data={"waiting_for_cooldown": wait_until.isoformat(), "code": code},
        not_before=wait_until,
        **fields,
    )


# --- Recovery of lost runs ---------------------------------------------------------------------


_STALE_SQL = """
SELECT t.id FROM tasks_task t
WHERE t.status IN ('in_progress', 'pause_requested') {only}
  AND (t.lease_expires_at < now()
       OR EXISTS (SELECT 1 FROM agents_agentrun r
                  WHERE r.task_id = t.id AND r.status = 'started'
                    AND r.started_at < now() - make_interval(
                        secs => greatest(t.limit_runtime_seconds, %(timeout)s) + 300)))
ORDER BY t.id LIMIT 500
"""


def _stale_ids(task_id: int | None = None) -> list[int]:
    """Held tasks whose lease expired, or whose run started longer ago than it may last + 5
    minutes: the larger of the global run timeout and the task's own runtime limit. Judged by
    the database's clock, like the run's start, so the clocks of worker hosts do not matter."""
    params = {"timeout": settings.ACTHELM_RUN_TIMEOUT_SECONDS}
    only = ""
    if task_id is not None:
        only, params["task"] = "AND t.id = %(task)s", task_id
    with connection.cursor() as cursor:
        cursor.execute(_STALE_SQL.format(only=only), params)
        return [row[0] for row in cursor.fetchall()]


def recover_stale(*, actor: Actor | None = None) -> list[int]:
    """Fail runs whose lease expired or that overran the run timeout + 5 minutes; requeue their
    task once (the next run resumes from the checkpoint); a second loss fails it (worker_lost)."""
    actor = actor or Actor.system("recover_stale")
    recovered = []
    candidates = _stale_ids()
    for task_id in candidates:
        with transaction.atomic():
            task = Task.objects.select_for_update(skip_locked=True).filter(pk=task_id).first()
            if task is None or task.status not in HELD:
                continue
            if not _stale_ids(task_id):
                continue  # renewed meanwhile
            run = AgentRun.objects.filter(task=task, status=RunStatus.STARTED).first()
            if run is not None:
                finish_run(
                    run,
                    RunStatus.FAILED,
                    error_code="worker_lost",
                    error_message=f"worker {run.worker_id} stopped renewing its lease",
                )
            record_event(
                task,
                actor=actor,
                kind=EventKind.LOST,
                run=run,
                data={"worker": task.lease_owner, "run_id": run.pk if run else None},
            )
            if task.lost_count < settings.ACTHELM_MAX_REQUEUES:
                _requeue(
                    task,
                    actor=actor,
                    kind=EventKind.REQUEUED,
                    run=run,
                    lost_count=task.lost_count + 1,
                )
            else:
                _fail_task(
                    task,
                    run,
                    actor=actor,
                    code="worker_lost",
                    message="the task's worker was lost twice",
                    lost_count=task.lost_count + 1,
                )
            recovered.append(task_id)
            log.warning(
                "run.recovered", extra={"task_id": task_id, "run_id": run.pk if run else None}
            )
    return recovered
