"""What happens to a task after a run: the facts are read, the end is decided, the plan written.

A run ends with an `Outcome`. `handle` reads what the decision needs under the task's row lock
(`gather`), lets `agents.engine.verdict.decide.decide` — which reads nothing — say what becomes of
the run, the task and the connection, and writes that plan (`apply_plan`). It runs inside the fenced
transaction that records the run's last step (`agents.engine.run.recorder`), or inside
`apply_outcome`'s own fence. The status changes themselves go through tasks.transitions and
agents.engine.store.runs. Runs whose worker died are recovered by `agents.engine.runtime.recovery`.
"""

import logging
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import transaction
from django.db.models import Min
from django.utils import timezone

from agents.catalogue.eligibility import eligible_models, has_tools
from agents.engine.store import (
    HANDOFF_RUN_COLUMNS,
    HANDOFF_TASK_COLUMNS,
    Handoff,
    end_values,
    fence,
    finish_run,
    storable,
)
from agents.engine.verdict.decide import (
    Facts,
    Fallback,
    Health,
    Judgement,
    OutcomeKind,
    Plan,
    Rules,
    decide,
    error_signature,
)
from agents.engine.verdict.policies import auto_close_if_allowed, may_auto_close
from agents.models import AgentRun, Connection, Model
from agents.states import CostTier, FailureCode, RunStatus
from core.actors import Actor
from tasks.models import Task
from tasks.notify.outbox import notification_of
from tasks.services import note_stuck_dependants
from tasks.states import EventKind
from tasks.transitions import event_values, move_columns, record_event, set_status

if TYPE_CHECKING:
    from agents.engine.verdict.supervisor import SupervisorVerdict

__all__ = [
    "Outcome",
    "OutcomeKind",
    "apply_outcome",
    "error_signature",
    "handle",
    "handoff",
]

log = logging.getLogger("acthelm.worker")


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


def rules() -> Rules:
    """The settings a run's end depends on, read once per decision."""
    return Rules(
        max_attempts=settings.ACTHELM_MAX_ATTEMPTS,
        retry_delays=tuple(settings.ACTHELM_RETRY_DELAYS),
        cooldown_seconds=settings.ACTHELM_COOLDOWN_SECONDS,
        max_handbacks=settings.ACTHELM_MAX_HANDBACKS,
        max_requeues=settings.ACTHELM_MAX_REQUEUES,
    )


def _judgement(verdict: "SupervisorVerdict | None") -> Judgement | None:
    if verdict is None:
        return None
    return Judgement(
        approved=bool(verdict.approved),
        reason=verdict.reason,
        unverified=bool(getattr(verdict, "unverified", False)),
        checks=tuple(getattr(verdict, "checks_as_dicts", None) or ()),
    )


def fallback_model(task: Task, *, exclude_connection_id: int | None, now: datetime) -> Model | None:
    """The next zero-cost connection's model that could run the task now (`eligible_models`:
    tested, tool-capable when it has tools, enabled, not cooling down). Never a paid one."""
    qs = eligible_models(with_tools=has_tools(task.tools), now=now).filter(
        connection__cost_tier=CostTier.ZERO_COST
    )
    if exclude_connection_id:
        qs = qs.exclude(connection_id=exclude_connection_id)
    return qs.order_by("-connection__priority", "connection__name", "name").first()


def _health(task: Task, run: AgentRun, code: str, now: datetime) -> Health:
    """The connection a health error is about (locked: its cooldown is written with the task's
    move), whether it refused the credential before, and where else the task could go."""
    connection_id = run.connection_id or task.connection_id
    if connection_id is None:  # neither has one: what `.get(pk=None)` raised
        raise Connection.DoesNotExist("Connection matching query does not exist.")
    conn = Connection.objects.select_for_update().get(pk=connection_id)
    refused = code == FailureCode.PROVIDER_AUTH and (
        AgentRun.objects.filter(task=task, error_code=FailureCode.PROVIDER_AUTH)
        .exclude(pk=run.pk)
        .exists()
    )
    model = fallback_model(task, exclude_connection_id=conn.pk, now=now)
    others = (
        Connection.objects.filter(
            cost_tier=CostTier.ZERO_COST, enabled=True, cooldown_until__gt=now
        )
        .exclude(pk=conn.pk)
        .aggregate(end=Min("cooldown_until"))["end"]
    )
    return Health(
        connection_id=conn.pk,
        connection_name=conn.name,
        cooldown_until=conn.cooldown_until,
        auth_refused_before=refused,
        fallback=Fallback(model.pk, model.connection_id, str(model)) if model else None,
        others_cooldown_end=others,
    )


def gather(
    task: Task,
    run: AgentRun,
    outcome: Outcome,
    verdict: "SupervisorVerdict | None",
    now: datetime,
    rules: Rules,
) -> Facts:
    """Read what the decision on this run's end may need; the run itself is not yet written."""
    kind = OutcomeKind(outcome.kind)
    judgement = _judgement(verdict)
    earlier_attempts: tuple[tuple[str, str], ...] = ()
    failed_attempt = (kind == OutcomeKind.FAILED and not outcome.health) or (
        kind == OutcomeKind.FINAL and not (judgement and judgement.approved)
    )
    if failed_attempt:
        # A failed attempt: the error loop compares it with the attempts before it.
        earlier_attempts = tuple(
            AgentRun.objects.filter(task=task, status=RunStatus.FAILED)
            .exclude(pk=run.pk)
            .exclude(error_code__in=FailureCode.not_attempts())
            .order_by("-number")
            .values_list("error_code", "error_message")[: task.failed_attempts + 1]
        )
    earlier_codes: tuple[str, ...] = ()
    if kind == OutcomeKind.HANDED_BACK:
        earlier_codes = tuple(
            AgentRun.objects.filter(task=task)
            .exclude(pk=run.pk)
            .order_by("-number")
            .values_list("error_code", flat=True)[: rules.max_handbacks]
        )
    health = None
    if kind == OutcomeKind.FAILED and outcome.health:
        health = _health(task, run, outcome.code, now)
    return Facts(
        kind=kind,
        task_status=task.status,
        rules=rules,
        now=now,
        failed_attempts=task.failed_attempts,
        lost_count=task.lost_count,
        code=outcome.code,
        message=outcome.message,
        answer=outcome.answer,
        health=outcome.health,
        retryable=outcome.retryable,
        verdict=judgement,
        earlier_attempts=earlier_attempts,
        earlier_codes=earlier_codes,
        connection=health,
    )


def apply_plan(
    task: Task, run: AgentRun | None, *, actor: Actor, plan: Plan, now: datetime
) -> None:
    """Write `plan`: the run, the connection's cooldown, the events, the task's move, and what
    follows a move to review or to failed. The caller holds the task's row lock."""
    if plan.run is not None and run is not None:
        finish_run(run, plan.run.status, **plan.run.fields)
    if plan.cooldown is not None:
        c = plan.cooldown
        Connection.objects.filter(pk=c.connection_id).update(
            cooldown_until=c.until,
            last_error_code=c.code,
            last_error_message=c.message,
            last_error_at=now,
        )
    for event in plan.events:
        record_event(task, actor=actor, kind=event.kind, run=run, data=event.data)
        if event.kind == EventKind.PROVIDER_COOLDOWN:
            log.warning(
                "provider.cooldown",
                extra={
                    "connection": event.data["connection"],
                    "code": event.data["code"],
                    "task_id": task.pk,
                },
            )
    move = plan.move
    set_status(
        task, move.status, actor=actor, kind=move.kind, run=run, data=move.data, **move.fields
    )
    if plan.auto_close:
        auto_close_if_allowed(task, run, actor=actor)
    if plan.note_stuck:
        note_stuck_dependants(task, actor=actor)


def handle(
    task: Task,
    run: AgentRun,
    *,
    actor: Actor,
    outcome: Outcome,
    verdict: "SupervisorVerdict | None" = None,
    now: datetime | None = None,
) -> str:
    """Apply `outcome` to a task the caller holds (inside its fenced transaction)."""
    if OutcomeKind(outcome.kind) == OutcomeKind.LOST:
        raise ValueError(f"outcome {outcome.kind!r} writes nothing")
    now = now or timezone.now()
    plan = decide(gather(task, run, outcome, verdict, now, rules()))
    apply_plan(task, run, actor=actor, plan=plan, now=now)
    return task.status


def handoff(
    task: Task,
    run: AgentRun,
    *,
    actor: Actor,
    outcome: Outcome,
    verdict: "SupervisorVerdict | None",
    now: datetime,
) -> Handoff | None:
    """The run's end as its last step's one statement writes it: a `Handoff`, the value this
    hands the store (`agents.engine.store.statement`), which never imports the verdict. An
    approved final answer moves the task to review, decided (`decide`) as `handle` decides it,
    from the task as the run read it — the statement writes it only if the task's status is
    still that one, and the run still holds it. None (the fenced transaction, `handle`) for
    any other end, and for a plan that also writes events, a cooldown, or a move a policy may
    follow (`policies.may_auto_close`). Reads nothing."""
    judgement = _judgement(verdict)
    if OutcomeKind(outcome.kind) != OutcomeKind.FINAL or not (judgement and judgement.approved):
        return None
    # An approved final answer is no failed attempt, hand-back or health error: `gather` reads
    # nothing for it.
    plan = decide(gather(task, run, outcome, verdict, now, rules()))
    if plan.run is None or plan.events or plan.cooldown is not None or plan.note_stuck:
        return None
    if plan.auto_close and may_auto_close(task):
        return None
    move = plan.move
    ended = end_values(plan.run.status, now, **plan.run.fields)
    moved = move_columns(task.status, move.status, {**move.fields, "updated_at": now})
    if not (set(ended) <= set(HANDOFF_RUN_COLUMNS) and set(moved) <= set(HANDOFF_TASK_COLUMNS)):
        return None
    event = event_values(
        task.pk,
        actor=actor,
        kind=move.kind,
        run_id=run.pk,
        data=move.data,
        from_status=task.status,
        to_status=move.status,
    )
    notify = None
    if not task.is_evaluation:  # the evaluation runner's own tasks notify nobody
        notify = notification_of(move.kind, event["data"], task.status, move.status)
    return Handoff(task.status, ended, moved, event, notify)


def apply_outcome(
    *,
    task_id: int,
    run_id: int,
    worker_id: str,
    outcome: Outcome,
    verdict: "SupervisorVerdict | None" = None,
    now: datetime | None = None,
) -> str | None:
    """Write the run's result and move the task, fenced. Returns the task's new status, or None
    when the run had already lost its task (nothing written)."""
    if outcome.kind == Outcome.LOST:
        return None

    with transaction.atomic():
        held = fence(run_id, task_id, full=True)
        assert held.task is not None  # the full fence carries the row
        run = AgentRun.objects.get(pk=run_id)
        return handle(
            held.task,
            run,
            actor=Actor.worker(worker_id),
            outcome=outcome,
            verdict=verdict,
            now=now or held.now,
        )
