"""Errors of Acthelm's services and the one registry of their codes (`ErrorCode`).

Each error carries a stable code that the console, the CLI and the API show. A code is a member
of `ErrorCode`, and the member carries the HTTP status the console and the API answer with: the
status belongs to the code, read from here and nowhere else (`ActhelmError.http_status`).

Three kinds of codes are data, not HTTP answers, and keep their own registries: a run's failure
codes (`agents.failure_codes.FailureCode`), a tool call's codes the model sees
(`agents.catalogue.tools.base.ERROR_CODES`) and a notification's delivery codes
(`tasks.notify.channels.DeliveryCode`). When a person's request is refused for one of those
reasons (an edit the tool's check refuses, a credential refused for a connection), the error
passes that code on (`ActhelmError.passing`) and answers with its own member's status."""

import enum
from typing import Self


class ErrorCode(enum.StrEnum):
    """Every code an Acthelm error answers with, and its HTTP status (`ErrorCode.X.http_status`).
    The values are the wire values clients see: never change one."""

    _value_: str
    http_status: int

    def __new__(cls, value: str, http_status: int) -> Self:
        member = str.__new__(cls, value)
        member._value_ = value
        member.http_status = http_status
        return member

    # 400: bad input, `field` naming it when there is one.
    INVALID_INPUT = "invalid_input", 400
    DEPENDENCY_CYCLE = "dependency_cycle", 400
    NUMBER_OUT_OF_RANGE = "number_out_of_range", 400
    INVALID_ARGUMENTS = "invalid_arguments", 400
    TOOL_NOT_ALLOWED = "tool_not_allowed", 400
    EXECUTABLE_NOT_ALLOWED = "executable_not_allowed", 400
    NO_USABLE_MODEL = "no_usable_model", 400
    LIMIT_EXHAUSTED = "limit_exhausted", 400
    PROPOSAL_LIMIT = "proposal_limit", 400
    ACCEPTANCE_CHECK_INVALID = "acceptance_check_invalid", 400
    TEST_ON_WORKER = "test_on_worker", 400
    INVALID_TARGET = "invalid_target", 400
    TARGET_EXISTS = "target_exists", 400
    EVAL_CASE_INVALID = "eval_case_invalid", 400
    LINK_INVALID = "link_invalid", 400
    # A token may not be made for this person (not active staff): the input is refused.
    TOKEN_HOLDER_NOT_ELIGIBLE = "token_holder_not_eligible", 400
    # 401: the request's token is refused.
    TOKEN_MISSING = "token_missing", 401
    TOKEN_INVALID = "token_invalid", 401
    TOKEN_REVOKED = "token_revoked", 401
    # The token's person is no longer staff: the token stops working with it.
    TOKEN_HOLDER_NOT_ALLOWED = "token_holder_not_allowed", 401
    # 403
    PERMISSION_DENIED = "permission_denied", 403
    # 404
    NOT_FOUND = "not_found", 404
    TASK_NOT_FOUND = "task_not_found", 404
    GOAL_NOT_FOUND = "goal_not_found", 404
    CONNECTION_NOT_FOUND = "connection_not_found", 404
    SCHEDULE_NOT_FOUND = "schedule_not_found", 404
    TOKEN_NOT_FOUND = "token_not_found", 404
    TARGET_NOT_FOUND = "target_not_found", 404
    # 405, 410, 413, 422, 429, 500, 503: answered by the API (or its middleware, or a live
    # stream), or a link's age.
    METHOD_NOT_ALLOWED = "method_not_allowed", 405
    LINK_EXPIRED = "link_expired", 410
    BODY_TOO_LARGE = "body_too_large", 413
    UNKNOWN_FIELD = "unknown_field", 422
    THROTTLED = "throttled", 429
    SERVER_ERROR = "server_error", 500
    # 503: a task's live stream this server process cannot serve now (`tasks.livestream`).
    LIVE_UNAVAILABLE = "live_unavailable", 503
    TOO_MANY_VIEWERS = "too_many_viewers", 503
    # 409: the current state does not allow it (a refusal that names no other status).
    ERROR = "error", 409
    TRANSITION_NOT_ALLOWED = "transition_not_allowed", 409
    LIMIT_NOT_RAISED = "limit_not_raised", 409
    STALE_DECISION = "stale_decision", 409
    MODEL_CHECK_FAILED = "model_check_failed", 409
    ATTEMPT_LOST = "attempt_lost", 409
    DELIVERY_FAILED = "delivery_failed", 409
    EVAL_ERROR = "eval_error", 409
    EVAL_BAD_OPTION = "eval_bad_option", 409
    EVAL_NO_CASES = "eval_no_cases", 409
    EVAL_CONNECTION_MISSING = "eval_connection_missing", 409
    EVAL_MODEL_MISSING = "eval_model_missing", 409
    EVAL_MODEL_UNTESTED = "eval_model_untested", 409


class ActhelmError(Exception):
    """Root of Acthelm's errors; raise a subclass. `error` is the class's member of `ErrorCode`
    unless the raise names another (`code=`); `code` is what is shown, the member's value unless
    the error passes on a code of another registry (`passing`)."""

    error = ErrorCode.ERROR
    # The input field the error is about, when there is one (shown by the API as "field").
    field: str | None = None

    def __init__(self, message: str, *, code: ErrorCode | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.error = code
        self.code: str = self.error
        if field:
            self.field = field

    @classmethod
    def passing(cls, message: str, *, code: str | None, field: str | None = None) -> Self:
        """This error showing `code`, a code of another registry (a tool call's refusal, a
        credential's, a connection's settings'; None: this error's own), and answering with
        this error's status."""
        error = cls(message, field=field)
        if code:
            error.code = code
        return error

    @property
    def http_status(self) -> int:
        """The status the console and the API answer with: its code's, from the registry."""
        return self.error.http_status

    def __str__(self) -> str:
        return self.message


class TransitionNotAllowed(ActhelmError, ValueError):
    error = ErrorCode.TRANSITION_NOT_ALLOWED


class NotFound(ActhelmError, LookupError):
    error = ErrorCode.NOT_FOUND


class TaskNotFound(NotFound):
    error = ErrorCode.TASK_NOT_FOUND


class GoalNotFound(NotFound):
    error = ErrorCode.GOAL_NOT_FOUND


class NotPermitted(ActhelmError, PermissionError):
    error = ErrorCode.PERMISSION_DENIED


class InvalidInput(ActhelmError, ValueError):
    error = ErrorCode.INVALID_INPUT


class DependencyCycle(InvalidInput):
    error = ErrorCode.DEPENDENCY_CYCLE


class LimitNotRaised(ActhelmError, ValueError):
    error = ErrorCode.LIMIT_NOT_RAISED


class StaleDecision(ActhelmError, ValueError):
    """The operation changed or was decided elsewhere; nothing was changed."""

    error = ErrorCode.STALE_DECISION


class ModelCheckFailed(ActhelmError, ValueError):
    error = ErrorCode.MODEL_CHECK_FAILED


class AttemptLost(ActhelmError):
    """A worker's run no longer holds its task; the write was not made."""

    error = ErrorCode.ATTEMPT_LOST
