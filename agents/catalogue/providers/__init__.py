"""Model providers: one internal message format, three wire formats.

Usage::

    from agents.catalogue.providers import Message, build_provider

    provider = build_provider("openai_compatible", base_url="http://localhost:11434/v1")
    completion = provider.complete(
        model="qwen3", messages=[Message(role="user", content="Hi")], tools=[], max_tokens=256
    )

Django-free on purpose: settings and credentials are passed in as arguments.
"""

from . import anthropic, cli, openai_compat  # noqa: F401 - imported to register the kinds
from .anthropic import AnthropicProvider
from .base import (
    ALL_CODES,
    HEALTH_CODES,
    PROVIDER_AUTH,
    PROVIDER_BAD_REQUEST,
    PROVIDER_BAD_RESPONSE,
    PROVIDER_CANCELLED,
    PROVIDER_CLI_FAILED,
    PROVIDER_CONFIG,
    PROVIDER_OUTPUT_TOO_LARGE,
    PROVIDER_QUOTA,
    PROVIDER_RATE_LIMITED,
    PROVIDER_SERVER_ERROR,
    PROVIDER_TIMEOUT,
    PROVIDER_UNREACHABLE,
    TRANSIENT_CODES,
    Completion,
    Message,
    OnDelta,
    ProbeResult,
    Provider,
    ProviderError,
    ToolCallRequest,
    ToolSpec,
    UnknownProviderKind,
    build_provider,
    credential_name_refusal,
    get_provider_class,
    register,
    registered_kinds,
)
from .cli import CLIProvider
from .openai_compat import OpenAICompatibleProvider

__all__ = [
    "ALL_CODES",
    "HEALTH_CODES",
    "PROVIDER_AUTH",
    "PROVIDER_BAD_REQUEST",
    "PROVIDER_BAD_RESPONSE",
    "PROVIDER_CANCELLED",
    "PROVIDER_CLI_FAILED",
    "PROVIDER_CONFIG",
    "PROVIDER_OUTPUT_TOO_LARGE",
    "PROVIDER_QUOTA",
    "PROVIDER_RATE_LIMITED",
    "PROVIDER_SERVER_ERROR",
    "PROVIDER_TIMEOUT",
    "PROVIDER_UNREACHABLE",
    "TRANSIENT_CODES",
    "AnthropicProvider",
    "CLIProvider",
    "Completion",
    "Message",
    "OnDelta",
    "OpenAICompatibleProvider",
    "ProbeResult",
    "Provider",
    "ProviderError",
    "ToolCallRequest",
    "ToolSpec",
    "UnknownProviderKind",
    "build_provider",
    "credential_name_refusal",
    "get_provider_class",
    "register",
    "registered_kinds",
]
