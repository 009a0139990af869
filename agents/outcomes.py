"""What happens to a task after a run: review, retry, back-off, loop, cooldown, hand-back, and
recovery of runs whose worker died. The status changes themselves go through tasks.transitions;
every write a live worker makes here is fenced."""

import logging
import re
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.db.models import Q
from django.db.models.functions import Now
from django.utils import timezone

from agents.loop import Outcome
from agents.models import AgentRun, Connection, Model
from agents.states import CostTier, ModelTestStatus, RunStatus, Verdict
from agents.supervisor import SupervisorVerdict
from agents.transitions import finish_run
from tasks.actors import Actor
from tasks.models import Task
from tasks.states import HELD, EventKind, TaskStatus
from tasks.transitions import fenced, record_event, set_status

log = logging.getLogger("acthelm.worker")

# Failures that retrying cannot fix: the task fails at once.
FINAL_CODES = frozenset({"connection_missing", "connection_disabled", "model_untested"})
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
        "provider_rate_limited",
        "provider_quota",
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


def _note_stuck(task: Task, actor: Actor) -> None:
    try:
        from tasks.services import note_stuck_dependants
    except ImportError:  # arrives with the reconciler work
        return
    note_stuck_dependants(task, actor=actor)


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
    _note_stuck(task, actor)


def apply_outcome(
    *,
    task_id: int,
    run_id: int,
    worker_id: str,
    outcome: Outcome,
    verdict: SupervisorVerdict | None = None,
    now=None,
) -> str | None:
    """Write the run's result and move the task, fenced. Returns the task's new status, or None
    when the run had already lost its task (nothing written)."""
    actor = Actor.worker(worker_id)
    now = now or timezone.now()
    if outcome.kind == Outcome.LOST:
        return None
    with fenced(run_id, task_id) as task:
        run = AgentRun.objects.get(pk=run_id)
        kind = outcome.kind
        if kind == Outcome.FINAL and verdict is not None and verdict.approved:
            finish_run(
                run,
                RunStatus.SUCCEEDED,
                verdict=Verdict.APPROVED,
                verdict_reason=verdict.reason,
                answer=outcome.answer,
            )
            set_status(
                task,
                TaskStatus.REVIEW,
                actor=actor,
                kind=EventKind.SUBMITTED,
                run=run,
                data={"verdict": Verdict.APPROVED, "reason": verdict.reason},
                failure_code="",
                failure_message="",
            )
            _auto_close(task, run, actor)
        elif kind == Outcome.FINAL:
            reason = verdict.reason if verdict else "no verdict"
            finish_run(
                run,
                RunStatus.FAILED,
                verdict=Verdict.REJECTED,
                verdict_reason=reason,
                error_code="supervisor_rejected",
                error_message=reason,
            )
            record_event(
                task, actor=actor, kind=EventKind.REJECTED, run=run, data={"reason": reason}
            )
            _retry_or_fail(
                task,
                run,
                actor=actor,
                code="supervisor_rejected",
                message=reason,
                now=now,
                feedback=reason,
            )
        elif kind == Outcome.PAUSED:
            finish_run(run, RunStatus.CANCELLED, error_code="paused")
            set_status(task, TaskStatus.PAUSED, actor=actor, kind=EventKind.PAUSED, run=run)
        elif kind == Outcome.HANDED_BACK:
            finish_run(run, RunStatus.CANCELLED, error_code="handed_back")
            _requeue(
                task,
                actor=actor,
                kind=EventKind.HANDED_BACK,
                run=run,
                data={"reason": "worker shutting down"},
            )
        elif kind == Outcome.AWAITING_APPROVAL:
            finish_run(run, RunStatus.CANCELLED, error_code="awaiting_approval")
            set_status(
                task,
                TaskStatus.AWAITING_APPROVAL,
                actor=actor,
                kind=EventKind.APPROVAL_REQUESTED,
                run=run,
            )
        elif kind == Outcome.NEEDS_REVIEW:
            finish_run(run, RunStatus.CANCELLED, error_code="needs_review")
            set_status(
                task, TaskStatus.NEEDS_REVIEW, actor=actor, kind=EventKind.NEEDS_REVIEW, run=run
            )
        elif kind == Outcome.FAILED:
            finish_run(
                run,
                RunStatus.FAILED,
                error_code=outcome.code,
                error_message=outcome.message[:10_000],
            )
            if outcome.health:
                _cool_down_and_move(
                    task, run, actor=actor, code=outcome.code, message=outcome.message, now=now
                )
            elif outcome.code.startswith("limit_") or outcome.code in FINAL_CODES:
                _fail_task(task, run, actor=actor, code=outcome.code, message=outcome.message)
            else:
                _retry_or_fail(
                    task, run, actor=actor, code=outcome.code, message=outcome.message, now=now
                )
        else:
            raise ValueError(f"unknown outcome {kind!r}")
        return task.status


def _auto_close(task, run, actor) -> None:
    try:
        from tasks.policies import auto_close_if_allowed
    except ImportError:  # arrives with the reconciler work
        return
    auto_close_if_allowed(task, run, actor=actor)


def _retry_or_fail(task, run, *, actor, code, message, now, feedback: str = "") -> None:
    attempts = task.failed_attempts + 1
    if attempts >= settings.ACTHELM_MAX_ATTEMPTS:
        recent = list(
            AgentRun.objects.filter(task=task, status=RunStatus.FAILED)
            .exclude(error_code__in=NOT_ATTEMPTS)
            .order_by("-number")
            .values_list("error_code", "error_message")[: settings.ACTHELM_MAX_ATTEMPTS]
        )
        signatures = {error_signature(c, m) for c, m in recent}
        if len(recent) >= settings.ACTHELM_MAX_ATTEMPTS and len(signatures) == 1:
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
    )


# --- Recovery of lost runs ---------------------------------------------------------------------


def _stale_filter() -> Q:
    """Lease expired, or started longer ago than the run timeout + 5 minutes — both judged by the
    database's clock, so the clocks of worker hosts do not matter."""
    overdue = Now() - timedelta(seconds=settings.ACTHELM_RUN_TIMEOUT_SECONDS + 300)
    return Q(lease_expires_at__lt=Now()) | Q(
        runs__status=RunStatus.STARTED, runs__started_at__lt=overdue
    )


def recover_stale(*, actor: Actor | None = None) -> list[int]:
    """Fail runs whose lease expired or that overran the run timeout + 5 minutes; requeue their
    task once (the next run resumes from the checkpoint); a second loss fails it (worker_lost)."""
    actor = actor or Actor.system("recover_stale")
    recovered = []
    candidates = list(
        Task.objects.filter(status__in=HELD)
        .filter(_stale_filter())
        .values_list("pk", flat=True)
        .distinct()[:500]
    )
    for task_id in candidates:
        with transaction.atomic():
            task = Task.objects.select_for_update(skip_locked=True).filter(pk=task_id).first()
            if task is None or task.status not in HELD:
                continue
            if not Task.objects.filter(_stale_filter(), pk=task_id).exists():
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
