"""What the end of a run makes of the run, its task and its connection: a decision, then a write.

`decide(facts) -> Plan` holds every rule of a run's end (review, retry with back-off, the error
loop, the hand-back loop, cooldown and the move to the next zero-cost model, recovery of a lost
run) and reads nothing: no database, no settings. The outcome handlers
(`agents.engine.verdict.outcomes`) and recovery (`agents.engine.runtime.recovery`) read the facts
beforehand, under the task's row lock, and apply the plan through the one writer of each status — as
Procrastinate's retry strategy returns a `RetryDecision` that its worker applies. So each rule is
tested with plain values, and a handler is only its reads and its writes.
"""

import enum
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from agents.engine.store import storable
from agents.states import FailureCode, RunStatus, Verdict
from tasks.states import EventKind, TaskStatus


class OutcomeKind(enum.StrEnum):
    FINAL = "final"
    PAUSED = "paused"
    HANDED_BACK = "handed_back"
    AWAITING_APPROVAL = "awaiting_approval"
    NEEDS_REVIEW = "needs_review"
    FAILED = "failed"
    LOST = "lost"


@dataclass(frozen=True)
class Rules:
    """The settings a run's end depends on (ACTHELM_MAX_ATTEMPTS, …), passed in."""

    max_attempts: int  # attempts in all, the first run among them (not retries)
    retry_delays: tuple[int, ...]
    cooldown_seconds: float
    max_handbacks: int
    max_requeues: int


@dataclass(frozen=True)
class Judgement:
    """The supervisor's verdict on a final answer, as far as the run's end needs it."""

    approved: bool
    reason: str = ""
    unverified: bool = False
    checks: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class Fallback:
    """The next zero-cost model that passed its test, on a connection not cooling down."""

    model_id: int
    connection_id: int
    label: str  # "connection/model", for the event


@dataclass(frozen=True)
class Health:
    """The connection a health error is about, read under its row lock, and what else is there."""

    connection_id: int
    connection_name: str
    cooldown_until: datetime | None
    auth_refused_before: bool = False  # an earlier run of the task ended with provider_auth
    fallback: Fallback | None = None
    # The earliest end of a cooldown among the other enabled zero-cost connections (if later
    # than now).
    others_cooldown_end: datetime | None = None


@dataclass(frozen=True)
class Facts:
    """What was read before deciding. `earlier_attempts` are the (error_code, error_message) of
    the task's earlier failed runs, newest first (at least `failed_attempts` of them, when there
    are); `earlier_codes` the error codes of its newest earlier runs (at least `max_handbacks`)."""

    kind: OutcomeKind
    task_status: str
    rules: Rules
    now: datetime
    failed_attempts: int = 0
    lost_count: int = 0
    code: str = ""
    message: str = ""
    answer: str = ""
    health: bool = False
    retryable: bool = False
    verdict: Judgement | None = None
    earlier_attempts: tuple[tuple[str, str], ...] = ()
    earlier_codes: tuple[str, ...] = ()
    connection: Health | None = None
    # A lost run: the started run (None when none was started), its worker, the lease owner.
    run_id: int | None = None
    lost_worker: str = ""
    lease_owner: str = ""


@dataclass(frozen=True)
class RunEnd:
    status: RunStatus
    fields: dict[str, Any]


@dataclass(frozen=True)
class Event:
    """An event recorded without a status change, before the task moves."""

    kind: EventKind
    data: dict[str, Any]


@dataclass(frozen=True)
class Move:
    """The task's next status, the event that says why, and the fields written with it."""

    status: TaskStatus
    kind: EventKind
    data: dict[str, Any] | None = None
    fields: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Cooldown:
    """The connection rests until `until` after the error `code`."""

    connection_id: int
    until: datetime
    code: str
    message: str


@dataclass(frozen=True)
class Plan:
    run: RunEnd | None
    move: Move
    events: tuple[Event, ...] = ()
    cooldown: Cooldown | None = None
    auto_close: bool = False  # the task went to review: a policy may close it

    @property
    def note_stuck(self) -> bool:
        """A failed task: its dependants are told they wait on it."""
        return self.move.status == TaskStatus.FAILED


def error_signature(code: str, message: str) -> str:
    """Same code and message up to numbers, ids and addresses: the same error."""
    text = (message or "").lower()
    text = re.sub(r"0x[0-9a-f]+|[0-9a-f]{8,}|\d+(\.\d+)?", "N", text)
    return f"{code}:{' '.join(text.split())[:300]}"


def _is_attempt(code: str) -> bool:
    known = FailureCode.known(code)
    return known is None or known.is_attempt


def _requeue(f: Facts, kind: EventKind, data: dict[str, Any] | None = None, **fields: Any) -> Move:
    """Back to ready — or to paused, when a person asked for a pause meanwhile."""
    if f.task_status == TaskStatus.PAUSE_REQUESTED:
        return Move(TaskStatus.PAUSED, EventKind.PAUSED, {"after": kind, **(data or {})}, fields)
    return Move(TaskStatus.READY, kind, data, fields)


def _fail(code: str, message: str, **fields: Any) -> Move:
    return Move(
        TaskStatus.FAILED,
        EventKind.FAILED,
        {"code": code, "message": message[:2000]},
        {"failure_code": code, "failure_message": message[:10_000], **fields},
    )


def _retry_or_fail(f: Facts, run: RunEnd, code: str, message: str, feedback: str = "") -> Move:
    """A failed attempt. `max_attempts` counts attempts, the first run among them: after the n-th
    of them fails the task waits retry_delays[n-1] and runs attempt n+1, and the failure of
    attempt `max_attempts` fails the task — so with the defaults (3 attempts; 1 and 5 minutes)
    every delay is used, and at most 3 runs fail. When every attempt failed with the same error
    the task fails as `error_loop`."""
    attempts = f.failed_attempts + 1
    limit = f.rules.max_attempts
    if attempts >= limit:
        # This run as it is stored, then the earlier ones.
        this = (run.fields["error_code"], storable.text(run.fields["error_message"]))
        recent = [a for a in (this, *f.earlier_attempts) if _is_attempt(a[0])][:attempts]
        signatures = {error_signature(c, m) for c, m in recent}
        if attempts > 1 and len(recent) >= attempts and len(signatures) == 1:
            return _fail(
                FailureCode.ERROR_LOOP,
                loop_message(len(recent), code, message),
                failed_attempts=attempts,
            )
        return _fail(code, message, failed_attempts=attempts)
    delays = f.rules.retry_delays
    delay = delays[min(attempts - 1, len(delays) - 1)]
    fields: dict[str, Any] = {
        "failed_attempts": attempts,
        "not_before": f.now + timedelta(seconds=delay),
    }
    if feedback:
        fields["feedback"] = feedback
    # "attempt" is the number of the attempt that failed, "of" the most a task gets.
    data = {
        "attempt": attempts,
        "of": limit,
        "delay_seconds": delay,
        "code": code,
        "message": message[:500],
    }
    return _requeue(f, EventKind.RETRY_SCHEDULED, data, **fields)


def loop_message(attempts: int, code: str, message: str) -> str:
    """The failure message of an error loop: what a person reads on the task page and the CLI."""
    return f"All {attempts} attempts failed with the same error ({code}): {message[:500]}"


def _final(f: Facts) -> Plan:
    verdict = f.verdict
    checks = list(verdict.checks) if verdict else []
    if verdict is not None and verdict.approved:
        kind = Verdict.UNVERIFIED if verdict.unverified else Verdict.APPROVED
        run = RunEnd(
            RunStatus.SUCCEEDED,
            {"verdict": kind, "verdict_reason": verdict.reason, "answer": f.answer},
        )
        data = {"verdict": kind, "reason": verdict.reason} | ({"checks": checks} if checks else {})
        move = Move(
            TaskStatus.REVIEW,
            EventKind.SUBMITTED,
            data,
            {"failure_code": "", "failure_message": ""},
        )
        return Plan(run, move, auto_close=True)
    reason = verdict.reason if verdict else "no verdict"
    code = FailureCode.SUPERVISOR_REJECTED
    run = RunEnd(
        RunStatus.FAILED,
        {
            "verdict": Verdict.REJECTED,
            "verdict_reason": reason,
            "error_code": code,
            "error_message": reason,
        },
    )
    rejected = Event(
        EventKind.REJECTED, {"reason": reason} | ({"checks": checks} if checks else {})
    )
    return Plan(run, _retry_or_fail(f, run, code, reason, feedback=reason), events=(rejected,))


def _paused(f: Facts) -> Plan:
    run = RunEnd(RunStatus.CANCELLED, {"error_code": FailureCode.PAUSED})
    if f.task_status != TaskStatus.PAUSE_REQUESTED:
        # The pause was withdrawn after the run stopped for it: the task goes on, on any worker.
        return Plan(
            run, Move(TaskStatus.READY, EventKind.HANDED_BACK, {"reason": "pause withdrawn"})
        )
    return Plan(run, Move(TaskStatus.PAUSED, EventKind.PAUSED))


def _handed_back(f: Facts) -> Plan:
    run = RunEnd(RunStatus.CANCELLED, {"error_code": FailureCode.HANDED_BACK})
    cap = f.rules.max_handbacks
    recent = [FailureCode.HANDED_BACK, *f.earlier_codes][: cap + 1]
    reason = f.message or "worker shutting down"
    if len(recent) > cap and all(code == FailureCode.HANDED_BACK for code in recent):
        # A hand-back is not an attempt, so no attempt limit ends a task that is handed back
        # again and again (a fault that looks like a lost database, a worker restarting in a
        # loop): after `cap` in a row it fails, for a person to look at.
        message = (
            f"the task was handed back {len(recent)} times in a row without an "
            f"attempt ending (last: {reason})"
        )
        return Plan(run, _fail(FailureCode.HANDBACK_LOOP, message))
    return Plan(run, _requeue(f, EventKind.HANDED_BACK, {"reason": reason}))


def _awaiting_approval(f: Facts) -> Plan:
    run = RunEnd(RunStatus.CANCELLED, {"error_code": FailureCode.AWAITING_APPROVAL})
    return Plan(run, Move(TaskStatus.AWAITING_APPROVAL, EventKind.APPROVAL_REQUESTED))


def _needs_review(f: Facts) -> Plan:
    run = RunEnd(RunStatus.CANCELLED, {"error_code": FailureCode.NEEDS_REVIEW})
    return Plan(run, Move(TaskStatus.NEEDS_REVIEW, EventKind.NEEDS_REVIEW))


def _failed(f: Facts) -> Plan:
    run = RunEnd(RunStatus.FAILED, {"error_code": f.code, "error_message": f.message[:10_000]})
    known = FailureCode.known(f.code)
    if f.health:
        return _cool_down_and_move(f, run)
    if (known is not None and (known.is_limit or known.is_final)) or not f.retryable:
        return Plan(run, _fail(f.code, f.message))
    return Plan(run, _retry_or_fail(f, run, f.code, f.message))


def _cool_down_and_move(f: Facts, run: RunEnd) -> Plan:
    conn = f.connection
    if conn is None:
        raise ValueError("a health error needs the facts of its connection")
    code, message, now = f.code, f.message, f.now
    cooldown = None
    until = conn.cooldown_until
    if code != FailureCode.PROVIDER_COOLING_DOWN:
        until = now + timedelta(seconds=f.rules.cooldown_seconds)
        cooldown = Cooldown(conn.connection_id, until, code, message[:2000])
    event = Event(
        EventKind.PROVIDER_COOLDOWN,
        {
            "connection": conn.connection_name,
            "code": code,
            "until": until.isoformat() if until else None,
        },
    )

    def plan(move: Move) -> Plan:
        return Plan(run, move, events=(event,), cooldown=cooldown)

    if code == FailureCode.PROVIDER_AUTH and conn.auth_refused_before:
        # The key was refused again after a whole cooldown cycle: a wrong key does not heal.
        return plan(
            _fail(
                code,
                f"the connection {conn.connection_name} refused the credential again after its "
                f"cooldown: {message}",
            )
        )
    fields: dict[str, Any] = {}
    if code in (FailureCode.PROVIDER_QUOTA, FailureCode.PROVIDER_RATE_LIMITED):
        # Quota and rate limits count against the attempts like other errors: they end.
        attempts = f.failed_attempts + 1
        if attempts >= f.rules.max_attempts:
            return plan(_fail(code, message, failed_attempts=attempts))
        fields["failed_attempts"] = attempts
    if conn.fallback is not None:
        to = conn.fallback
        data = {"fallback": to.label, "from": conn.connection_name, "code": code}
        return plan(
            _requeue(
                f,
                EventKind.RETRY_SCHEDULED,
                data,
                connection_id=to.connection_id,
                model_id=to.model_id,
                not_before=None,
                **fields,
            )
        )
    # No zero-cost connection is available: wait for the earliest cooldown to end, not fail.
    ends = [end for end in (until, conn.others_cooldown_end) if end is not None and end > now]
    wait_until = min(ends) if ends else now + timedelta(seconds=f.rules.cooldown_seconds)
    data = {"waiting_for_cooldown": wait_until.isoformat(), "code": code}
    return plan(_requeue(f, EventKind.RETRY_SCHEDULED, data, not_before=wait_until, **fields))


def _lost(f: Facts) -> Plan:
    """Recovery of a run whose worker died: requeued once (the next run resumes from the
    checkpoint); a loss beyond max_requeues fails the task (worker_lost)."""
    run = None
    if f.run_id is not None:
        run = RunEnd(
            RunStatus.FAILED,
            {
                "error_code": FailureCode.WORKER_LOST,
                "error_message": f"worker {f.lost_worker} stopped renewing its lease",
            },
        )
    lost = f.lost_count + 1
    if f.lost_count < f.rules.max_requeues:
        move = _requeue(f, EventKind.REQUEUED, lost_count=lost)
    else:
        move = _fail(FailureCode.WORKER_LOST, "the task's worker was lost twice", lost_count=lost)
    lost_event = Event(EventKind.LOST, {"worker": f.lease_owner, "run_id": f.run_id})
    return Plan(run, move, events=(lost_event,))


_DECIDERS = {
    OutcomeKind.FINAL: _final,
    OutcomeKind.PAUSED: _paused,
    OutcomeKind.HANDED_BACK: _handed_back,
    OutcomeKind.AWAITING_APPROVAL: _awaiting_approval,
    OutcomeKind.NEEDS_REVIEW: _needs_review,
    OutcomeKind.FAILED: _failed,
    OutcomeKind.LOST: _lost,
}


def decide(facts: Facts) -> Plan:
    """The plan for a run's end. Pure: the same facts give the same plan."""
    return _DECIDERS[OutcomeKind(facts.kind)](facts)
