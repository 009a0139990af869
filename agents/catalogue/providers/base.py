"""Provider-neutral message format, errors, the abstract ``Provider`` and the kind registry.

This package is deliberately Django-free: connection settings and credentials are passed
to the provider constructor as plain arguments.
"""

from __future__ import annotations

import abc
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from agents.catalogue.tools.base import non_finite_path
from agents.failure_codes import FailureCode
from core import fibers
from core.credentials import (
    CREDENTIAL_DESTINATION_NOT_ALLOWED,
    is_server_secret,
    redact,
    same_origin,
)

# The credential rule lives in core.credentials; re-exported here for the providers' users.
from core.credentials import credential_name_refusal as credential_name_refusal
from core.exceptions import ErrorCode

# --------------------------------------------------------------------------------------
# Stable error codes
# --------------------------------------------------------------------------------------

# A provider's error ends a run with its code, so the codes are FailureCode's (written once,
# there); the constants are the plain strings.
PROVIDER_AUTH = FailureCode.PROVIDER_AUTH.value
PROVIDER_RATE_LIMITED = FailureCode.PROVIDER_RATE_LIMITED.value
PROVIDER_QUOTA = FailureCode.PROVIDER_QUOTA.value
PROVIDER_SERVER_ERROR = FailureCode.PROVIDER_SERVER_ERROR.value
PROVIDER_TIMEOUT = FailureCode.PROVIDER_TIMEOUT.value
PROVIDER_UNREACHABLE = FailureCode.PROVIDER_UNREACHABLE.value
PROVIDER_BAD_RESPONSE = FailureCode.PROVIDER_BAD_RESPONSE.value
PROVIDER_BAD_REQUEST = FailureCode.PROVIDER_BAD_REQUEST.value
PROVIDER_CANCELLED = FailureCode.PROVIDER_CANCELLED.value
PROVIDER_CLI_FAILED = FailureCode.PROVIDER_CLI_FAILED.value
PROVIDER_OUTPUT_TOO_LARGE = FailureCode.PROVIDER_OUTPUT_TOO_LARGE.value
#: The connection's configuration is refused (a credential name or an executable that is not
#: allowed): no request was made. A person must fix the connection; retrying cannot help.
PROVIDER_CONFIG = FailureCode.PROVIDER_CONFIG.value

ALL_CODES = frozenset(
    {
        PROVIDER_AUTH,
        PROVIDER_RATE_LIMITED,
        PROVIDER_QUOTA,
        PROVIDER_SERVER_ERROR,
        PROVIDER_TIMEOUT,
        PROVIDER_UNREACHABLE,
        PROVIDER_BAD_RESPONSE,
        PROVIDER_BAD_REQUEST,
        PROVIDER_CANCELLED,
        PROVIDER_CLI_FAILED,
        PROVIDER_OUTPUT_TOO_LARGE,
        PROVIDER_CONFIG,
    }
)

#: Codes that say something about the provider account/connection health rather than
#: about one particular request.
HEALTH_CODES = frozenset({PROVIDER_AUTH, PROVIDER_RATE_LIMITED, PROVIDER_QUOTA})

#: Codes that no retry can cure: the request or the connection itself must change first.
PERMANENT_CODES = frozenset({PROVIDER_BAD_REQUEST, PROVIDER_CONFIG})

#: Codes for which retrying the same request later can reasonably succeed.
TRANSIENT_CODES = frozenset(
    {PROVIDER_RATE_LIMITED, PROVIDER_SERVER_ERROR, PROVIDER_TIMEOUT, PROVIDER_UNREACHABLE}
)


class ProviderError(Exception):
    """The single root of every error raised by a provider.

    ``code`` is one of the ``PROVIDER_*`` constants, ``message`` a human readable text that
    never contains the API key, ``status`` the HTTP status (or CLI exit code) if any, and
    ``retry_after`` the seconds a server asked us to wait (``Retry-After``), if any.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> None:
        self.code = code
        self.message = message
        self.status = status
        self.retry_after = retry_after
        super().__init__(code, message)

    @property
    def health(self) -> bool:
        """True when the error is about provider health (auth, rate limit, quota)."""
        return self.code in HEALTH_CODES

    @property
    def transient(self) -> bool:
        """True when retrying later may succeed (rate limit, 5xx, timeout, unreachable)."""
        return self.code in TRANSIENT_CODES

    def __reduce__(  # keep status/retry_after when pickled (e.g. across processes)
        self,
    ) -> tuple[Callable[..., ProviderError], tuple[str, str, int | None, float | None]]:
        return (
            _rebuild_provider_error,
            (self.code, self.message, self.status, self.retry_after),
        )

    def __str__(self) -> str:
        suffix = f" (status {self.status})" if self.status is not None else ""
        return f"{self.code}: {self.message}{suffix}"

    def __repr__(self) -> str:
        return (
            f"ProviderError(code={self.code!r}, message={self.message!r}, status={self.status!r})"
        )


def _rebuild_provider_error(
    code: str, message: str, status: int | None, retry_after: float | None
) -> ProviderError:
    return ProviderError(code, message, status=status, retry_after=retry_after)


#: What a streaming provider calls with each piece of a turn as it arrives: the kind
#: ("text", "tool_call") and its data (see `Provider.complete`).
type OnDelta = Callable[[str, dict[str, Any]], None]


@dataclass(frozen=True)
class SettingsProblem:
    """Why a connection's settings are refused: the text shown, and a stable code (None: the
    caller's default); a provider kind may name codes of its own, passed on as they are."""

    message: str
    code: str | None = None


def executable_refusal(command: list[str], allowed: list[str]) -> str | None:
    """Why ``command`` may not be started under the allow-list ``allowed`` (empty: any)."""
    allowed = [a for a in allowed if a]
    if not allowed or not command:
        return None
    program = command[0]
    if program in allowed:
        return None
    return f"the executable {program!r} is not allowed (allowed: {', '.join(allowed)})"


# --------------------------------------------------------------------------------------
# Internal message format
# --------------------------------------------------------------------------------------


def _empty_object_schema() -> dict[str, Any]:
    return {"type": "object", "properties": {}}


class ToolSpec(BaseModel):
    """A tool offered to the model; ``parameters`` is a JSON schema (an object schema)."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=_empty_object_schema)


class ToolCallRequest(BaseModel):
    """A tool call requested by the model.

    ``arguments`` is None when the model's argument text did not parse as a JSON object;
    ``arguments_raw`` always holds the text the model sent.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: dict[str, Any] | None
    arguments_raw: str

    @field_validator("arguments", mode="before")
    @classmethod
    def _finite_numbers_only(cls, value: Any) -> Any:
        """JSON has no NaN or Infinity, though Python's parser accepts them: arguments holding
        one are not valid JSON, so they count as unparsable (the loop refuses the call as
        ``invalid_arguments``) and no non-finite number ever reaches a jsonb column."""
        if value is not None and non_finite_path(value) is not None:
            return None
        return value


class Message(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCallRequest] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


StopReason = Literal["end", "tool_calls", "length", "content_filter", "refusal", "other"]


#: Guards every CancelEvent's callbacks (each holds it for a list operation): one lock, not
#: one per run.
_CALLBACKS_LOCK = threading.Lock()


class CancelEvent(fibers.Event):
    """A `threading.Event` that also calls back when it is set, so that a waiting request is
    woken by the cancel itself instead of polling for it (a thousand waiting agents polling ten
    times a second would cost a core). Callbacks run in the thread that sets the event. Light
    (`core.fibers.Event`): a run holds one for its whole life."""

    def __init__(self) -> None:
        super().__init__()
        self._callbacks: list[Callable[[], object]] | None = None

    def set(self) -> None:
        super().set()
        with _CALLBACKS_LOCK:
            callbacks, self._callbacks = self._callbacks, None
        for callback in callbacks or ():
            callback()

    def add_callback(self, callback: Callable[[], object]) -> None:
        """Call `callback()` once when the event is set (at once if it is)."""
        with _CALLBACKS_LOCK:
            if not self.is_set():
                if self._callbacks is None:
                    self._callbacks = []
                self._callbacks.append(callback)
                return
        callback()

    def remove_callback(self, callback: Callable[[], object]) -> None:
        with _CALLBACKS_LOCK:
            if self._callbacks and callback in self._callbacks:
                self._callbacks.remove(callback)


class Completion(BaseModel):
    model_config = ConfigDict(frozen=True)

    text: str
    tool_calls: list[ToolCallRequest] = Field(default_factory=list)
    stop_reason: StopReason
    raw_stop_reason: str = ""
    #: Every input token, cached ones included.
    input_tokens: int = 0
    #: Of ``input_tokens``: read from the provider's prompt cache (a cheaper price) ...
    cached_input_tokens: int = 0
    #: ... and written to it (Anthropic's cache_creation_input_tokens; a dearer price).
    cache_write_tokens: int = 0
    output_tokens: int = 0
    #: What the provider says the request cost, in US dollars (OpenRouter's usage.cost).
    reported_cost: Decimal | None = None
    model: str = ""

    @property
    def truncated_or_declined(self) -> bool:
        return self.stop_reason in ("length", "content_filter", "refusal")


class ProbeResult(BaseModel):
    model_config = ConfigDict(frozen=True)

    ok: bool
    message: str
    context_window: int | None = None
    supports_tools: bool | None = None
    #: The ProviderError code when the probe failed because of a provider error.
    error_code: str | None = None
    #: True when the request with the probe tool was accepted but the model did not call it.
    tool_ignored: bool = False
    #: Whether a streamed request was answered in pieces (True) or whole, or refused (False);
    #: None when the test could not tell (the model did not answer, or the kind never streams).
    streams: bool | None = None


#: The message a probe gives for a model that accepted the tool but never called it.
TOOL_IGNORED_MESSAGE = (
    "the model did not call the probe tool: recorded as NOT tool-capable "
    "(a person may override: acthelm_connection test --override-tools, or the admin action)"
)


def probe_answer_problem(answer: Completion) -> str | None:
    """Why a probe's plain answer fails the test (an empty answer proves nothing), or None."""
    if not answer.text.strip():
        reason = answer.raw_stop_reason or answer.stop_reason
        return f"the model answered with empty text (stop reason {reason})"
    return None


# --------------------------------------------------------------------------------------
# Provider base class
# --------------------------------------------------------------------------------------

DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
PROBE_PROMPT = "Reply with OK."
PING_TOOL = ToolSpec(
    name="ping",
    description="Health check. Call this tool when asked to ping.",
    parameters={"type": "object", "properties": {}, "additionalProperties": False},
)


class Provider(abc.ABC):
    """Base class of all providers.

    A provider instance is cheap, holds no open connection and may be used from any thread;
    each ``complete()`` call opens and closes its own connection (or process).
    """

    kind: ClassVar[str] = ""
    #: The kind's name for people (forms, the admin, the CLI's help); the kind when empty.
    label: ClassVar[str] = ""
    #: `gen_ai.provider.name` on the kind's trace spans (OpenTelemetry's names); the kind when
    #: empty.
    telemetry_name: ClassVar[str] = ""
    supports_tools: ClassVar[bool] = True
    supports_cancel: ClassVar[bool] = True
    # The kind's rules, declared here as Django's task backends declare theirs
    # (`supports_defer`): `check_settings()`, the connection's provider arguments and the price
    # lookup ask the class, never a comparison with a kind's name.
    #: A connection of this kind must name the server's base URL.
    needs_base_url: ClassVar[bool] = True
    #: A connection of this kind runs a command (an argument list) under the executable allow-list.
    needs_command: ClassVar[bool] = False
    #: The genai-prices provider id the price table is searched by; None: by the base URL.
    price_provider_id: ClassVar[str | None] = None

    @classmethod
    def check_settings(
        cls, *, base_url: str, command: list[str] | None, allowed_executables: list[str]
    ) -> SettingsProblem | None:
        """Why a connection of this kind may not be saved with these settings, or None."""
        if cls.needs_command:
            if not command or not isinstance(command, list):
                return SettingsProblem(
                    f"a {cls.kind} connection needs a command (an argument list)"
                )
            if not all(isinstance(arg, str) and arg for arg in command):
                return SettingsProblem(f"a {cls.kind} command is a list of non-empty strings")
            problem = executable_refusal(list(command), list(allowed_executables))
            if problem:
                return SettingsProblem(problem, code=ErrorCode.EXECUTABLE_NOT_ALLOWED)
        if cls.needs_base_url and not base_url:
            return SettingsProblem(f"a {cls.kind} connection needs a base URL")
        return None

    @classmethod
    def connection_arguments(
        cls,
        *,
        base_url: str,
        command: list[str],
        answer_field: str,
        credential_env: str,
        allowed_executables: list[str],
    ) -> dict[str, Any]:
        """The constructor arguments a stored connection's settings give this kind (beside the
        timeout, key and configuration error every kind takes)."""
        return {"base_url": base_url}

    @classmethod
    def credential_destination(cls, *, base_url: str, command: list[str] | None) -> str:
        """Where a connection of this kind sends its credential: the URL its requests go to
        (``core.credentials.credential_for`` checks it against the operator's list)."""
        return (base_url or "").strip()

    def __init__(
        self,
        *,
        base_url: str = "",
        command: list[str] | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        answer_field: str = "",
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        extra_headers: dict[str, str] | None = None,
        api_key_env: str | None = None,
        config_error: str | None = None,
    ) -> None:
        if timeout is None or not math.isfinite(timeout) or timeout <= 0:
            raise ValueError("timeout must be a positive, finite number of seconds")
        if max_response_bytes <= 0:
            raise ValueError("max_response_bytes must be positive")
        self.base_url = (base_url or "").strip().rstrip("/")
        self.command = list(command) if command else []
        self.api_key = api_key or None
        self.timeout = float(timeout)
        self.answer_field = (answer_field or "").strip()
        self.max_response_bytes = int(max_response_bytes)
        self.extra_headers = {str(k): str(v) for k, v in (extra_headers or {}).items()}
        self.api_key_env = api_key_env or None
        # Set when the connection's configuration is refused: no request is ever sent.
        self.config_error = config_error or None
        # Set once the server refused the ``stream`` field (a 400 naming it): the instance's
        # later requests (a run's turns) are asked whole, not refused once each first.
        self.stream_refused = False
        if self.api_key_env and is_server_secret(self.api_key_env):
            self.config_error = f"the credential {self.api_key_env} is one of the server's secrets"

    def __repr__(self) -> str:  # never show the key
        target = self.base_url or " ".join(self.command)
        return f"<{type(self).__name__} kind={self.kind!r} target={target!r}>"

    # -- helpers -----------------------------------------------------------------------

    def redact(self, text: str) -> str:
        """Remove the API key (and secret-looking extra header values) from ``text``."""
        secrets = [self.api_key]
        for name, value in self.extra_headers.items():
            if name.lower() in ("authorization", "x-api-key", "api-key") and value:
                secrets.append(value)
                secrets.append(value.split(" ", 1)[-1])
        return redact(text, secrets)

    def check_config(self) -> None:
        """Refuse to send anything (a request, a key, a process) for a refused configuration."""
        if self.config_error:
            raise ProviderError(PROVIDER_CONFIG, self.config_error)

    def check_request_url(self, url: str) -> None:
        """The key was released for the base URL's host and port only: a request elsewhere
        (a URL not built on the base) is refused before anything is sent."""
        if self.api_key and not same_origin(url, self.base_url):
            raise ProviderError(
                PROVIDER_CONFIG,
                "refusing to send the credential to a host other than the connection's base URL "
                f"[{CREDENTIAL_DESTINATION_NOT_ALLOWED}]",
            )

    def error(
        self,
        code: str,
        message: str,
        *,
        status: int | None = None,
        retry_after: float | None = None,
    ) -> ProviderError:
        """Build a ProviderError whose message is guaranteed not to contain the key."""
        return ProviderError(code, self.redact(message), status=status, retry_after=retry_after)

    # -- API ---------------------------------------------------------------------------

    @abc.abstractmethod
    def complete(
        self,
        *,
        model: str,
        messages: list[Message],
        tools: list[ToolSpec],
        max_tokens: int,
        cancel_event: threading.Event | None = None,
        on_delta: OnDelta | None = None,
    ) -> Completion:
        """Run one model turn. Raises ProviderError (never anything else for provider
        problems); raises ``provider_cancelled`` soon after ``cancel_event`` is set.

        With ``on_delta``, a provider that can asks for a streamed answer and calls
        ``on_delta(kind, data)`` for each piece as it arrives — ``"text"`` ``{"text": …}`` (visible
        text only, never hidden reasoning) and ``"tool_call"`` ``{"index", "name",
        "arguments"}`` (fragments appended) — possibly from another thread than the caller's;
        what it raises is logged, never the turn's. The Completion returned is the same as
        without it; a stream cut off is a ProviderError as an interrupted request is."""

    @abc.abstractmethod
    def probe(self, *, model: str, tools: bool) -> ProbeResult:
        """Make a real minimal request; never raises ProviderError (reports ok=False)."""


#: A streamed request that failed with one of these may have failed because it was streamed: the
#: probe asks again for a whole answer before it judges the model.
_STREAM_SUSPECT = frozenset({PROVIDER_BAD_REQUEST, PROVIDER_BAD_RESPONSE, PROVIDER_SERVER_ERROR})


def probe_by_chat(
    provider: Provider, *, model: str, tools: bool, context_window: int | None = None
) -> ProbeResult:
    """The model test of a chat provider: a real minimal request that must come back with a
    non-empty answer, then (when the model claims tools) a request offering the ``ping`` tool that
    the model must call — a model that accepts the tool but never calls it is recorded as not
    tool-capable. Never raises ProviderError.

    The first request asks for a streamed answer: whether it came in pieces is ``streams`` (a
    server that answers it whole, or refuses the ``stream`` field, streams not; the worker then
    asks it for whole answers). A streamed request that fails as a stream may (a 400, a broken
    or garbled stream) is asked again whole, and the model judged by that answer."""
    window = context_window
    pieces: list[str] = []
    plain = [Message(role="user", content=PROBE_PROMPT)]
    stream_note = "streamed answers work"
    try:
        answer = provider.complete(
            model=model,
            messages=plain,
            tools=[],
            max_tokens=16,
            on_delta=lambda kind, _data: pieces.append(kind),
        )
        streams = bool(pieces)
        if not streams:
            stream_note = (
                "a streamed request came back whole (or its stream field was refused): "
                "turns are asked whole"
            )
    except ProviderError as streamed_error:
        if streamed_error.code not in _STREAM_SUSPECT:
            return ProbeResult(
                ok=False,
                message=str(streamed_error),
                context_window=window,
                error_code=streamed_error.code,
            )
        try:
            answer = provider.complete(model=model, messages=plain, tools=[], max_tokens=16)
        except ProviderError as exc:
            return ProbeResult(
                ok=False, message=str(exc), context_window=window, error_code=exc.code
            )
        streams = False
        stream_note = f"a streamed request failed ({streamed_error}): turns are asked whole"
    problem = probe_answer_problem(answer)
    if problem:
        return ProbeResult(
            ok=False, message=problem, context_window=window, error_code=PROVIDER_BAD_RESPONSE
        )
    message = f"model answered ({answer.stop_reason}): {answer.text.strip()[:80]!r}"
    message += f"; {stream_note}"
    if not tools:
        return ProbeResult(ok=True, message=message, context_window=window, streams=streams)
    try:
        tool_answer = provider.complete(
            model=model,
            messages=[Message(role="user", content="Call the ping tool now.")],
            tools=[PING_TOOL],
            max_tokens=64,
        )
    except ProviderError as exc:
        return ProbeResult(
            ok=False,
            message=f"{message}; but the request with a tool failed: {exc}",
            context_window=window,
            supports_tools=False,
            error_code=exc.code,
            streams=streams,
        )
    if not any(call.name == PING_TOOL.name for call in tool_answer.tool_calls):
        return ProbeResult(
            ok=True,
            message=f"{message}; {TOOL_IGNORED_MESSAGE}",
            context_window=window,
            supports_tools=False,
            tool_ignored=True,
            streams=streams,
        )
    message += "; tool calling works (ping was called)"
    return ProbeResult(
        ok=True, message=message, context_window=window, supports_tools=True, streams=streams
    )


# --------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------


class UnknownProviderKind(KeyError, ValueError):
    """Raised by get_provider_class() for a kind nobody registered."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "unknown provider kind"


_REGISTRY: dict[str, type[Provider]] = {}


def register(cls: type[Provider]) -> type[Provider]:
    """Class decorator: register a Provider subclass under its ``kind``."""
    if not cls.kind:
        raise ValueError(f"{cls.__name__} has no kind")
    existing = _REGISTRY.get(cls.kind)
    if existing is not None and existing is not cls:
        raise ValueError(f"provider kind {cls.kind!r} already registered by {existing.__name__}")
    _REGISTRY[cls.kind] = cls
    return cls


def get_provider_class(kind: str) -> type[Provider]:
    try:
        return _REGISTRY[kind]
    except KeyError:
        known = ", ".join(sorted(_REGISTRY)) or "none"
        raise UnknownProviderKind(
            f"unknown provider kind {kind!r} (known kinds: {known})"
        ) from None


def registered_kinds() -> list[str]:
    return sorted(_REGISTRY)


def traced_name(kind: str) -> str:
    """`gen_ai.provider.name` for a connection of this kind: its class's `telemetry_name`, or
    the kind itself (also for a kind nobody registered)."""
    cls = _REGISTRY.get(kind)
    return (cls.telemetry_name if cls is not None else "") or kind


def unregister(kind: str) -> None:
    """Forget a provider kind (tests that register a throwaway kind)."""
    _REGISTRY.pop(kind, None)


def build_provider(kind: str, **kwargs: Any) -> Provider:
    """Instantiate the provider registered for ``kind`` with the given settings."""
    return get_provider_class(kind)(**kwargs)
