"""Credentials by name: the one rule for which environment variable may hold a credential, and the
one redaction helper for the words of providers and servers.

Platform layer (it imports no app), so every app uses the same rule: connections
(``credential_env``), MCP tool servers (``credential_env``) and webhook targets (``secret_env``).
Each checks it when a row is written and again when the row is used.

The rule, in order:

1. a name is an environment variable's name (letters, digits, ``_``; at most 100), never a value;
2. never one of the server's own variables (``SERVER_SECRET_PREFIXES``, case-insensitive):
   ``DJANGO_*``, ``DATABASE_*``, ``POSTGRES_*``, ``PG*``, ``AWS_*``, ``EMAIL_*``, ``OTEL_*`` and
   ``ACTHELM_*`` except ``ACTHELM_KEY_*`` — even when a person lists them as allowed;
3. it starts with a prefix of ``ACTHELM_CREDENTIAL_PREFIXES`` (``ACTHELM_KEY_`` and the well-known
   provider key names by default).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from urllib.parse import quote

from django.conf import settings

#: The stable code of a refused credential name (when written and when used).
CREDENTIAL_NOT_ALLOWED = "credential_not_allowed"
#: What a credential's value becomes in stored text.
REDACTED = "[redacted]"

ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
#: Names of the server's own secrets and configuration: never a credential.
SERVER_SECRET_PREFIXES = (
    "DJANGO_",
    "DATABASE_",
    "POSTGRES_",
    "PG",
    "AWS_",
    "EMAIL_",
    "OTEL_",
    "ACTHELM_",
)
#: The one namespace inside ``ACTHELM_`` that exists to hold credentials.
CREDENTIAL_NAMESPACE = "ACTHELM_KEY_"

#: A value shorter than this is not redacted (it would blank ordinary words).
MIN_SECRET_CHARS = 4
#: A piece of a value cut at the text's start or end is redacted from this length on.
MIN_PIECE_CHARS = 5


def is_server_secret(name: str) -> bool:
    upper = (name or "").upper()
    if upper.startswith(CREDENTIAL_NAMESPACE):
        return False
    return any(upper.startswith(prefix) for prefix in SERVER_SECRET_PREFIXES)


def credential_name_refusal(name: str, allowed_prefixes: Iterable[str]) -> str | None:
    """Why ``name`` may not name a credential under ``allowed_prefixes``; None when it may."""
    if not ENV_NAME_RE.fullmatch(name or ""):
        return (
            "the credential is the NAME of an environment variable (letters, digits, _), "
            "never the key itself"
        )
    if is_server_secret(name):
        return f"{name} holds one of the server's own secrets and can never be a credential"
    allowed = [p for p in allowed_prefixes if p]
    if not any(name.startswith(prefix) for prefix in allowed):
        return f"{name} does not start with an allowed credential prefix ({', '.join(allowed)})"
    return None


def credential_problem(name: str) -> str | None:
    """Why ``name`` may not name a credential here (ACTHELM_CREDENTIAL_PREFIXES); None for an
    empty name (no credential) or an allowed one."""
    if not name:
        return None
    return credential_name_refusal(name, list(settings.ACTHELM_CREDENTIAL_PREFIXES))


def _forms(secret: str) -> set[str]:
    """The value as it may appear in a peer's words: as is, JSON-escaped, URL-encoded."""
    forms = {secret, json.dumps(secret)[1:-1], json.dumps(secret, ensure_ascii=False)[1:-1]}
    forms.add(quote(secret, safe=""))
    return {f for f in forms if len(f) >= MIN_SECRET_CHARS}


def redact(text: str, secrets: Iterable[str | None]) -> str:
    """``text`` with every value of ``secrets`` replaced by ``[redacted]``.

    Also a piece of a value at the very start or end of ``text``: what a reader or a cut kept
    of a value (a stderr tail, a clipped error body) is part of the value all the same."""
    if not text:
        return text
    forms: set[str] = set()
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_CHARS:
            forms |= _forms(secret)
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, REDACTED)
    for form in sorted(forms, key=len, reverse=True):
        for size in range(len(form) - 1, MIN_PIECE_CHARS - 1, -1):
            if text.endswith(form[:size]):
                text = text[:-size] + REDACTED
                break
        for size in range(len(form) - 1, MIN_PIECE_CHARS - 1, -1):
            if text.startswith(form[-size:]):
                text = REDACTED + text[size:]
                break
    return text
