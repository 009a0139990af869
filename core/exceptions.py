"""Errors of Acthelm's services. Each carries a stable code that the console and the CLI show, and
the HTTP status the console and the API answer with (`http_status`, read, never looked up)."""


class ActhelmError(Exception):
    """Root of Acthelm's errors; raise a subclass."""

    code = "error"
    # A refusal conflicts with the current state unless a subclass says otherwise.
    http_status = 409
    # The input field the error is about, when there is one (shown by the API as "field").
    field: str | None = None

    def __init__(self, message: str, *, code: str | None = None, field: str | None = None):
        super().__init__(message)
        self.message = message
        if code:
            self.code = code
        if field:
            self.field = field

    def __str__(self) -> str:
        return self.message


class TransitionNotAllowed(ActhelmError, ValueError):
    code = "transition_not_allowed"


class NotFound(ActhelmError, LookupError):
    code = "not_found"
    http_status = 404


class TaskNotFound(NotFound):
    code = "task_not_found"


class GoalNotFound(NotFound):
    code = "goal_not_found"


class NotPermitted(ActhelmError, PermissionError):
    code = "permission_denied"
    http_status = 403


class InvalidInput(ActhelmError, ValueError):
    code = "invalid_input"
    http_status = 400


class DependencyCycle(InvalidInput):
    code = "dependency_cycle"


class LimitNotRaised(ActhelmError, ValueError):
    code = "limit_not_raised"


class StaleDecision(ActhelmError, ValueError):
    """The operation changed or was decided elsewhere; nothing was changed."""

    code = "stale_decision"


class ModelCheckFailed(ActhelmError, ValueError):
    code = "model_check_failed"


class AttemptLost(ActhelmError):
    """A worker's run no longer holds its task; the write was not made."""

    code = "attempt_lost"
