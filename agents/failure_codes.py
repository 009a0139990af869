"""The failure codes: why a run ended without an answer, or a task failed.

One definition for the providers (which stay free of Django, so they take their codes from here
rather than from `agents.states`), the engine and the rows (`agents.states` re-exports it).
"""

import enum


class FailureCode(enum.StrEnum):
    """Why a run ended without an answer, or a task failed: the run's `error_code` and the task's
    `failure_code`. Its properties say what the end of a run makes of each
    (`agents.engine.verdict.decide`).
    A provider's codes are its `PROVIDER_*` members (`agents.catalogue.providers.base` takes them
    from here); a limit's is its row's `failure_code` in `tasks.limits` (a test holds it to this
    list)."""

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


# What each code means, in a person's words: the console shows these beside the code.
_WORDS: dict[FailureCode, str] = {
    FailureCode.PAUSED: "paused by a person",
    FailureCode.HANDED_BACK: "handed back to the queue (the worker stopped)",
    FailureCode.AWAITING_APPROVAL: "stopped for a person's approval",
    FailureCode.NEEDS_REVIEW: "stopped: an operation's outcome is unknown",
    FailureCode.CANCELLED: "cancelled by a person",
    FailureCode.WORKER_LOST: "the worker stopped answering (its lease expired)",
    FailureCode.SUPERVISOR_REJECTED: "the supervisor rejected the result",
    FailureCode.ERROR_LOOP: "the same error ended every attempt",
    FailureCode.HANDBACK_LOOP: "handed back again and again without an attempt ending",
    FailureCode.CONNECTION_MISSING: "the connection does not exist",
    FailureCode.CONNECTION_DISABLED: "the connection is disabled",
    FailureCode.MODEL_UNTESTED: "the model has not passed its test",
    FailureCode.MODEL_NOT_TOOL_CAPABLE: "the model cannot call tools",
    FailureCode.PROVIDER_COOLING_DOWN: "the connection is cooling down",
    FailureCode.STORAGE_REJECTED: "what the run produced could not be stored",
    FailureCode.INTERNAL_ERROR: "an internal error in the worker",
    FailureCode.PROVIDER_AUTH: "the provider refused the credential",
    FailureCode.PROVIDER_RATE_LIMITED: "the provider's rate limit",
    FailureCode.PROVIDER_QUOTA: "the provider's quota is used up",
    FailureCode.PROVIDER_SERVER_ERROR: "the provider had a server error",
    FailureCode.PROVIDER_TIMEOUT: "the model did not answer in time",
    FailureCode.PROVIDER_UNREACHABLE: "the provider could not be reached",
    FailureCode.PROVIDER_BAD_RESPONSE: "the model's answer could not be read",
    FailureCode.PROVIDER_BAD_REQUEST: "the provider refused the request",
    FailureCode.PROVIDER_CANCELLED: "the model request was cancelled",
    FailureCode.PROVIDER_CLI_FAILED: "the model's command failed",
    FailureCode.PROVIDER_OUTPUT_TOO_LARGE: "the model's answer was too large",
    FailureCode.PROVIDER_CONFIG: "the connection is misconfigured",
    FailureCode.LIMIT_STEPS: "the step limit was reached",
    FailureCode.LIMIT_RUNTIME: "the run-time limit was reached",
    FailureCode.LIMIT_TOKENS: "the token limit was reached",
    FailureCode.LIMIT_NETWORK: "the network-request limit was reached",
    FailureCode.LIMIT_MCP: "the MCP-call limit was reached",
    FailureCode.LIMIT_COST: "the cost budget was reached",
}


def failure_words(code: str) -> str:
    """A failure code in plain words; a code this list does not know is shown as it is."""
    known = FailureCode.known(code)
    return _WORDS.get(known, code) if known is not None else code
