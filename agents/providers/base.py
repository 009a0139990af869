"""Provider-neutral message format, errors, the abstract ``Provider`` and the kind registry.

This package is deliberately Django-free: connection settings and credentials are passed
to the provider constructor as plain arguments.
"""

from __future__ import annotations

import abc
import threading
from decimal import Decimal
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

# --------------------------------------------------------------------------------------
# Stable error codes
# --------------------------------------------------------------------------------------

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
    }
)

#: Codes that say something about the provider account/connection health rather than
#: about one particular request.
HEALTH_CODES = frozenset({PROVIDER_AUTH, PROVIDER_RATE_LIMITED, PROVIDER_QUOTA})

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

    def __reduce__(self):  # keep status/retry_after when pickled (e.g. across processes)
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


# --------------------------------------------------------------------------------------
# Internal message format
# --------------------------------------------------------------------------------------


def _empty_object_schema() -> dict:
    return {"type": "object", "properties": {}}


class ToolSpec(BaseModel):
    """A tool offered to the model; ``parameters`` is a JSON schema (an object schema)."""

    model_config = ConfigDict(frozen=True)

    name: str
    description: str = ""
    parameters: dict = Field(default_factory=_empty_object_schema)


class ToolCallRequest(BaseModel):
    """A tool call requested by the model.

    ``arguments`` is None when the model's argument text did not parse as a JSON object;
    ``arguments_raw`` always holds the text the model sent.
    """

    model_config = ConfigDict(frozen=True)

    id: str
    name: str
    arguments: dict | None
    arguments_raw: str


class Message(BaseModel):
    model_config = ConfigDict(frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    tool_calls: list[ToolCallRequest] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None


StopReason = Literal["end", "tool_calls", "length", "content_filter", "refusal", "other"]


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


# --------------------------------------------------------------------------------------
# Provider base class
# --------------------------------------------------------------------------------------

DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
PROBE_PROMPT = "Reply with OK."


class Provider(abc.ABC):
    """Base class of all providers.

    A provider instance is cheap, holds no open connection and may be used from any thread;
    each ``complete()`` call opens and closes its own connection (or process).
    """

    kind: ClassVar[str] = ""
    supports_tools: ClassVar[bool] = True
    supports_cancel: ClassVar[bool] = True

    def __init__(
        self,
        *,
        base_url: str = "",
        command: list[str] | None = None,
        api_key: str | None = None,
        timeout: float = 120.0,
        answer_field: str = "",
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        extra_headers: dict | None = None,
        api_key_env: str | None = None,
    ) -> None:
        if timeout is None or timeout <= 0:
            raise ValueError("timeout must be a positive number of seconds")
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

    def __repr__(self) -> str:  # never show the key
        target = self.base_url or " ".join(self.command)
        return f"<{type(self).__name__} kind={self.kind!r} target={target!r}>"

    # -- helpers -----------------------------------------------------------------------

    def redact(self, text: str) -> str:
        """Remove the API key (and secret-looking extra header values) from ``text``."""
        if not text:
            return text
        secrets = [self.api_key] if self.api_key else []
        for name, value in self.extra_headers.items():
            if name.lower() in ("authorization", "x-api-key", "api-key") and value:
                secrets.append(value)
                secrets.append(value.split(" ", 1)[-1])
        for secret in sorted(set(secrets), key=len, reverse=True):
            if secret and len(secret) >= 4:
                text = text.replace(secret, "[redacted]")
        return text

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
    ) -> Completion:
        """Run one model turn. Raises ProviderError (never anything else for provider
        problems); raises ``provider_cancelled`` soon after ``cancel_event`` is set."""

    @abc.abstractmethod
    def probe(self, *, model: str, tools: bool) -> ProbeResult:
        """Make a real minimal request; never raises ProviderError (reports ok=False)."""


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


def build_provider(kind: str, **kwargs: Any) -> Provider:
    """Instantiate the provider registered for ``kind`` with the given settings."""
    return get_provider_class(kind)(**kwargs)
