"""Run states and the vocabulary of connections, models, turns and tool calls. Pure."""

import enum

from django.db import models

from agents.catalogue.tools.recovery_class import RecoveryClass  # noqa: F401  (defined once, with the tools)


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


class ConnectionKind(models.TextChoices):
    OPENAI_COMPATIBLE = "openai_compatible", "OpenAI-compatible (OpenAI, Ollama, vLLM, llama.cpp)"
    ANTHROPIC = "anthropic", "Anthropic"
    CLI = "cli", "Model CLI"


class CostTier(models.TextChoices):
    ZERO_COST = "zero_cost", "Zero-cost"
    PAID = "paid", "Paid"


class ModelTestStatus(models.TextChoices):
    UNTESTED = "untested", "Not tested"
    PASSED = "passed", "Passed"
    FAILED = "failed", "Failed"


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
# Where a tool call may go from each state; agents.engine.transitions.set_call_status enforces it.
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


class FailureCode(enum.StrEnum):
    """Why a run ended without an answer, or a task failed: the run's `error_code` and the task's
    `failure_code`. Its properties say what the end of a run makes of each (`agents.engine.decide`).
    A provider's codes are `agents.catalogue.providers.base.ALL_CODES`; a limit's is its row's
    `failure_code` in `tasks.limits` (tests hold both to this list)."""

    # The run stopped without an attempt failing.
    PAUSED = "paused"
    HANDED_BACK = "handed_back"
    AWAITING_APPROVAL = "awaiting_approval"
    NEEDS_REVIEW = "needs_review"
    CANCELLED = "cancelled"
    WORKER_LOST = "worker_lost"
    # What the engine decides at the end of runs.
    SUPERVISOR_REJECTED = "supervisor_rejected"
    ERROR_LOOP = "error_loop"
    HANDBACK_LOOP = "handback_loop"
    # Before the first model turn: the task cannot run as it stands.
    CONNECTION_MISSING = "connection_missing"
    CONNECTION_DISABLED = "connection_disabled"
    MODEL_UNTESTED = "model_untested"
    MODEL_NOT_TOOL_CAPABLE = "model_not_tool_capable"
    PROVIDER_COOLING_DOWN = "provider_cooling_down"
    # The worker's own: what the run tried to store was refused, or a bug.
    STORAGE_REJECTED = "storage_rejected"
    INTERNAL_ERROR = "internal_error"
    # A provider's answer (agents.catalogue.providers.base).
    PROVIDER_AUTH = "provider_auth"
    PROVIDER_RATE_LIMITED = "provider_rate_limited"
    PROVIDER_QUOTA = "provider_quota"
    PROVIDER_SERVER_ERROR = "provider_server_error"
    PROVIDER_TIMEOUT = "provider_timeout"
    PROVIDER_UNREACHABLE = "provider_unreachable"
    PROVIDER_BAD_RESPONSE = "provider_bad_response"
    PROVIDER_BAD_REQUEST = "provider_bad_request"
    PROVIDER_CANCELLED = "provider_cancelled"
    PROVIDER_CLI_FAILED = "provider_cli_failed"
    PROVIDER_OUTPUT_TOO_LARGE = "provider_output_too_large"
    PROVIDER_CONFIG = "provider_config"
    # A cumulative limit was reached (tasks.limits).
    LIMIT_STEPS = "limit_steps"
    LIMIT_RUNTIME = "limit_runtime"
    LIMIT_TOKENS = "limit_tokens"
    LIMIT_NETWORK = "limit_network"
    LIMIT_MCP = "limit_mcp"
    LIMIT_COST = "limit_cost"

    @classmethod
    def known(cls, code: str) -> "FailureCode | None":
        """The member for `code`, or None for a code this list does not name (a newer
        provider's, say): such a code is a failed attempt like any other."""
        try:
            return cls(code)
        except ValueError:
            return None

    @property
    def is_final(self) -> bool:
        """Retrying cannot fix it: the task fails at once."""
        return self in _FINAL

    @property
    def is_attempt(self) -> bool:
        """A run that ended so counts as a failed attempt (the error loop compares these)."""
        return self not in _NOT_ATTEMPTS

    @property
    def is_limit(self) -> bool:
        """A cumulative limit was reached: the task fails at once, for a person to raise it."""
        return self.name.startswith("LIMIT_")

    @classmethod
    def not_attempts(cls) -> frozenset["FailureCode"]:
        return _NOT_ATTEMPTS

    @classmethod
    def limits(cls) -> frozenset["FailureCode"]:
        return frozenset(code for code in cls if code.is_limit)


_FINAL = frozenset(
    {
        FailureCode.CONNECTION_MISSING,
        FailureCode.CONNECTION_DISABLED,
        FailureCode.MODEL_UNTESTED,
        FailureCode.MODEL_NOT_TOOL_CAPABLE,
    }
)
_NOT_ATTEMPTS = frozenset(
    {
        FailureCode.WORKER_LOST,
        FailureCode.HANDED_BACK,
        FailureCode.PAUSED,
        FailureCode.AWAITING_APPROVAL,
        FailureCode.NEEDS_REVIEW,
        FailureCode.CANCELLED,
        FailureCode.PROVIDER_AUTH,
        FailureCode.PROVIDER_COOLING_DOWN,
    }
)
