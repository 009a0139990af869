"""Run states and the vocabulary of connections, models, turns and tool calls. Pure."""

from enum import StrEnum

from django.db import models

from agents.catalogue.tools.recovery_class import RecoveryClass  # noqa: F401  (defined once, with the tools)
from agents.failure_codes import FailureCode as FailureCode  # defined once, free of Django


class RunStatus(models.TextChoices):
    STARTED = "started", "Started"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    CANCELLED = "cancelled", "Cancelled"


RUN_TRANSITIONS: dict[str, frozenset[str]] = {
    RunStatus.STARTED: frozenset({RunStatus.SUCCEEDED, RunStatus.FAILED, RunStatus.CANCELLED}),
    RunStatus.SUCCEEDED: frozenset(),
    RunStatus.FAILED: frozenset(),
    RunStatus.CANCELLED: frozenset(),
}


class RunState(models.TextChoices):
    """What a person reads for a run: its status, told apart by why it stopped where the status
    alone would mislead (a run that stopped for a pause or an approval is stored `cancelled`,
    and the task goes on)."""

    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    CANCELLED = "cancelled", "cancelled"
    PAUSED = "paused", "paused"
    HANDED_BACK = "handed_back", "handed back"
    AWAITING_APPROVAL = "awaiting_approval", "stopped for an approval"
    NEEDS_REVIEW = "needs_review", "stopped for a review"


# A stopped run's error code that names its state better than `cancelled`.
_STOPPED_FOR = {
    FailureCode.PAUSED: RunState.PAUSED,
    FailureCode.HANDED_BACK: RunState.HANDED_BACK,
    FailureCode.AWAITING_APPROVAL: RunState.AWAITING_APPROVAL,
    FailureCode.NEEDS_REVIEW: RunState.NEEDS_REVIEW,
}


def run_state(status: str, error_code: str) -> RunState:
    """A run's own state, from its status and, for a stopped run, the reason it stopped."""
    if status == RunStatus.STARTED:
        return RunState.RUNNING
    if status == RunStatus.CANCELLED:
        known = FailureCode.known(error_code)
        if known is not None and known in _STOPPED_FOR:
            return _STOPPED_FOR[known]
    return RunState(status)


class ConnectionKind(StrEnum):
    """The shipped provider kinds, for code that names one, in the order forms offer them.
    `Connection.kind` takes its choices from the registered providers
    (`connection_rules.connection_kind_choices`), so a new kind adds no member here and no
    migration."""

    OPENAI_COMPATIBLE = "openai_compatible"
    ANTHROPIC = "anthropic"
    CLI = "cli"


class CostTier(models.TextChoices):
    ZERO_COST = "zero_cost", "Zero-cost"
    PAID = "paid", "Paid"


class ModelTestStatus(models.TextChoices):
    UNTESTED = "untested", "Not tested"
    PASSED = "passed", "Passed"
    FAILED = "failed", "Failed"


class ConnectionTestPhase(models.TextChoices):
    """Where a connection's test started from the console stands (`ConnectionTest`)."""

    CONNECTING = "connecting", "connecting"
    WAITING = "waiting", "waiting for the model"
    FINISHED = "finished", "finished"
    FAILED = "failed", "failed"  # the test could not run to its end (see its message)
    TIMED_OUT = "timed_out", "timed out"  # past its deadline: its process is gone or stuck


class ToolServerTransport(models.TextChoices):
    STDIO = "stdio", "Local command (stdio)"
    HTTP = "http", "Streamable HTTP"


class Verdict(models.TextChoices):
    APPROVED = "approved", "Approved"
    REJECTED = "rejected", "Rejected"
    # In review, but the model supervisor that should have looked could not be asked.
    UNVERIFIED = "unverified", "Unverified"


class Role(models.TextChoices):
    SYSTEM = "system", "System"
    USER = "user", "User"
    ASSISTANT = "assistant", "Assistant"


class ToolCallStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    AWAITING_APPROVAL = "awaiting_approval", "Awaiting approval"
    APPROVED = "approved", "Approved, not yet run"
    RUNNING = "running", "Running"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed"
    REFUSED = "refused", "Refused"
    DENIED = "denied", "Denied by a person"
    UNKNOWN = "unknown", "Outcome unknown"
    SKIPPED = "skipped", "Skipped by a person"


# Tool-call states after which the model has been (or will be) given a result.
TOOL_CALL_DONE = frozenset(
    {
        ToolCallStatus.SUCCEEDED,
        ToolCallStatus.FAILED,
        ToolCallStatus.REFUSED,
        ToolCallStatus.DENIED,
        ToolCallStatus.SKIPPED,
    }
)


TC = ToolCallStatus
# Where a tool call may go from each state; agents.engine.store.runs.set_call_status
# enforces it.
TOOL_CALL_TRANSITIONS: dict[str, frozenset[str]] = {
    # PENDING/APPROVED -> SUCCEEDED/FAILED: a read-only or idempotent call runs without an
    # intent record; its result is written with the step (recovery runs it again if lost).
    TC.PENDING: frozenset({TC.AWAITING_APPROVAL, TC.RUNNING, TC.REFUSED, TC.SUCCEEDED, TC.FAILED}),
    TC.AWAITING_APPROVAL: frozenset({TC.APPROVED, TC.DENIED}),
    TC.APPROVED: frozenset({TC.RUNNING, TC.REFUSED, TC.SUCCEEDED, TC.FAILED}),
    # RUNNING -> RUNNING: a read-only or idempotent call run again after a crash.
    TC.RUNNING: frozenset({TC.SUCCEEDED, TC.FAILED, TC.RUNNING, TC.UNKNOWN, TC.REFUSED}),
    TC.UNKNOWN: frozenset({TC.APPROVED, TC.SKIPPED}),
    TC.SUCCEEDED: frozenset(),
    TC.FAILED: frozenset(),
    TC.REFUSED: frozenset(),
    TC.DENIED: frozenset(),
    TC.SKIPPED: frozenset(),
}
