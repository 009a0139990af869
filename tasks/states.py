"""The task state machine as data: states, the allowed moves, and what a person may do in each.

Pure: no database access. `tasks.transitions` is the only writer and consults these tables.
"""

from collections.abc import Iterable

from django.db import models


class TaskStatus(models.TextChoices):
    BLOCKED = "blocked", "Blocked"
    READY = "ready", "Ready"
    IN_PROGRESS = "in_progress", "In progress"
    PAUSE_REQUESTED = "pause_requested", "Pause requested"
    PAUSED = "paused", "Paused"
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    NEEDS_REVIEW = "needs_review", "Needs review"
    REVIEW = "review", "Review"
    DONE = "done", "Done"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


class TaskKind(models.TextChoices):
    WORK = "work", "Work"
    PLANNING = "planning", "Planning"


class TaskOrigin(models.TextChoices):
    PERSON = "person", "Person"
    RECONCILER = "reconciler", "Reconciler"
    AGENT = "agent", "Agent (follow-up)"


class ToolPolicy(models.TextChoices):
    ALLOW = "allow", "Allow"
    ASK = "ask", "Ask a person"


class Action(models.TextChoices):
    PAUSE = "pause", "Pause"
    WITHDRAW_PAUSE = "withdraw_pause", "Withdraw pause"
    RESUME = "resume", "Resume"
    CANCEL = "cancel", "Cancel"
    APPROVE = "approve", "Approve"
    DENY = "deny", "Deny"
    RUN_AGAIN = "run_again", "Run again"
    SKIP = "skip", "Skip"
    CLOSE = "close", "Close"
    REOPEN = "reopen", "Reopen with feedback"
    RETRY = "retry", "Retry"
    DELETE = "delete", "Delete"
    ACCEPT = "accept", "Accept into review"


class EventKind(models.TextChoices):
    CREATED = "created", "Created"
    PROMOTED = "promoted", "Dependencies done"
    BLOCKED = "blocked", "Waiting for a dependency"
    CLAIMED = "claimed", "Claimed"
    HANDED_BACK = "handed_back", "Handed back"
    LOST = "lost", "Worker lost"
    REQUEUED = "requeued", "Requeued"
    PAUSE_REQUESTED = "pause_requested", "Pause requested"
    PAUSE_WITHDRAWN = "pause_withdrawn", "Pause withdrawn"
    PAUSED = "paused", "Paused"
    RESUMED = "resumed", "Resumed"
    CANCELLED = "cancelled", "Cancelled"
    APPROVAL_REQUESTED = "approval_requested", "Approval requested"
    APPROVED = "approved", "Approved"
    DENIED = "denied", "Denied"
    NEEDS_REVIEW = "needs_review", "Outcome unknown"
    RUN_AGAIN = "run_again", "Run again chosen"
    SKIPPED = "skipped", "Skip chosen"
    TOOL_RESULT = "tool_result", "Tool result"
    MODEL_TURN = "model_turn", "Model turn"
    SUBMITTED = "submitted", "Submitted for review"
    REJECTED = "rejected", "Supervisor rejected"
    CLOSED = "closed", "Closed"
    AUTO_CLOSED = "auto_closed", "Closed by policy"
    REOPENED = "reopened", "Reopened"
    FAILED = "failed", "Failed"
    RETRY_SCHEDULED = "retry_scheduled", "Retry scheduled"
    RETRIED = "retried", "Retried"
    PROVIDER_COOLDOWN = "provider_cooldown", "Provider cooling down"
    LIMITS_CHANGED = "limits_changed", "Limits changed"
    EDITED = "edited", "Settings edited"
    ACCEPTED = "accepted", "Accepted by a person"
    UNBLOCK_BLOCKED = "dependency_stuck", "Dependency cancelled or failed"


S = TaskStatus

# Where a task may go from each state. The worker's moves are from IN_PROGRESS/PAUSE_REQUESTED.
_WORKER_ENDS = frozenset(
    {S.READY, S.PAUSED, S.AWAITING_APPROVAL, S.NEEDS_REVIEW, S.REVIEW, S.FAILED, S.CANCELLED}
)
TRANSITIONS: dict[str, frozenset[str]] = {
    S.BLOCKED: frozenset({S.READY, S.CANCELLED}),
    # READY -> REVIEW and FAILED -> REVIEW: a person accepts the run the supervisor rejected
    # (`agents.actions.task.task_accept`, which also checks that the last run was rejected).
    S.READY: frozenset({S.IN_PROGRESS, S.PAUSED, S.BLOCKED, S.CANCELLED, S.REVIEW}),
    S.IN_PROGRESS: _WORKER_ENDS | {S.PAUSE_REQUESTED},
    S.PAUSE_REQUESTED: _WORKER_ENDS | {S.IN_PROGRESS},
    S.PAUSED: frozenset({S.READY, S.CANCELLED}),
    S.AWAITING_APPROVAL: frozenset({S.READY, S.CANCELLED}),
    S.NEEDS_REVIEW: frozenset({S.READY, S.CANCELLED}),
    S.REVIEW: frozenset({S.DONE, S.READY, S.CANCELLED}),
    S.DONE: frozenset(),
    S.FAILED: frozenset({S.READY, S.REVIEW}),
    S.CANCELLED: frozenset(),
}

# States in which a worker holds the task through a lease.
HELD = frozenset({S.IN_PROGRESS, S.PAUSE_REQUESTED})
# States that no worker and no timer will ever leave on their own.
SETTLED = frozenset({S.DONE, S.FAILED, S.CANCELLED})
# States that count as open work (not closed and not abandoned).
OPEN = frozenset(set(S) - {S.DONE, S.CANCELLED})
DELETABLE = frozenset({S.DONE, S.FAILED, S.CANCELLED})


def sql_list(states: Iterable[str]) -> str:
    """A set of states as the list of an SQL ``IN``, for the raw statements of the claim, the
    fence and recovery: ``('in_progress', 'pause_requested')``. Sorted, so a statement's text
    does not change between processes; each value is a state's (lower case and underscores)."""
    values = sorted(states)
    if not values or not all(value in S.values for value in values):
        raise ValueError(f"not a set of task states: {values!r}")
    return "(" + ", ".join(f"'{value}'" for value in values) + ")"


#: HELD in the raw statements: ``t.status IN {HELD_SQL}``.
HELD_SQL = sql_list(HELD)

# What a person can do in each state (the console offers exactly these).
A = Action
ACTIONS: dict[str, frozenset[str]] = {
    S.BLOCKED: frozenset({A.CANCEL}),
    # ACCEPT: only after the supervisor rejected the last run (the service checks the run).
    S.READY: frozenset({A.PAUSE, A.CANCEL, A.ACCEPT}),
    S.IN_PROGRESS: frozenset({A.PAUSE, A.CANCEL}),
    S.PAUSE_REQUESTED: frozenset({A.WITHDRAW_PAUSE, A.CANCEL}),
    S.PAUSED: frozenset({A.RESUME, A.CANCEL}),
    S.AWAITING_APPROVAL: frozenset({A.APPROVE, A.DENY, A.CANCEL}),
    S.NEEDS_REVIEW: frozenset({A.RUN_AGAIN, A.SKIP, A.CANCEL}),
    S.REVIEW: frozenset({A.CLOSE, A.REOPEN, A.CANCEL}),
    S.DONE: frozenset({A.DELETE}),
    S.FAILED: frozenset({A.RETRY, A.DELETE, A.ACCEPT}),
    S.CANCELLED: frozenset({A.DELETE}),
}

# Person events that do not take a task away from the worker holding it: it reacts to them
# cooperatively at its next safe point. Every other person event after a claim fences the run out.
COOPERATIVE_EVENTS = frozenset({EventKind.PAUSE_REQUESTED, EventKind.PAUSE_WITHDRAWN})


def can_transition(current: str, to: str) -> bool:
    return to in TRANSITIONS.get(current, frozenset())


def allowed_actions(current: str) -> frozenset[str]:
    return ACTIONS.get(current, frozenset())
