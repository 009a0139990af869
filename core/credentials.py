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

And one rule for where a credential may go: ``ACTHELM_CREDENTIAL_DESTINATIONS`` binds each name to
the hosts (or local programs) the operator listed; a name with no entry goes nowhere.
``credential_for(name, destination)`` is the one door through which every caller (a connection's
provider, an MCP server, a webhook's signature) reads a credential's value for a destination: it
refuses a refused name (``credential_not_allowed``) and a destination not listed for the name
(``credential_destination_not_allowed``). ``credential_refusal`` is the same check without reading
the value, for the forms and services that save a row.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

import httpx
from django.conf import settings

from core.egress import IPAddress, ip_literal

#: The stable code of a refused credential name (when written and when used).
CREDENTIAL_NOT_ALLOWED = "credential_not_allowed"
#: The stable code of a credential refused for where it would go (when written and when used).
CREDENTIAL_DESTINATION_NOT_ALLOWED = "credential_destination_not_allowed"
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


# ------------------------------------------------------------------------------ destinations

#: Where the well-known provider keys may go without any setting: each provider's own API host.
#: An entry of ACTHELM_CREDENTIAL_DESTINATIONS for the same name replaces its default.
WELL_KNOWN_DESTINATIONS: dict[str, tuple[str, ...]] = {
    "OPENAI_API_KEY": ("api.openai.com",),
    "ANTHROPIC_API_KEY": ("api.anthropic.com",),
    "OPENROUTER_API_KEY": ("openrouter.ai",),
    "GEMINI_API_KEY": ("generativelanguage.googleapis.com",),
    "GOOGLE_API_KEY": ("generativelanguage.googleapis.com",),
    "MISTRAL_API_KEY": ("api.mistral.ai",),
    "GROQ_API_KEY": ("api.groq.com",),
    "DEEPSEEK_API_KEY": ("api.deepseek.com",),
    "TOGETHER_API_KEY": ("api.together.xyz", "api.together.ai"),
    "FIREWORKS_API_KEY": ("api.fireworks.ai",),
    "XAI_API_KEY": ("api.x.ai",),
}
#: A destination that is a local program (a model CLI, a stdio MCP server): ``exec:`` and the
#: command's first argument, exactly as written.
EXEC_PREFIX = "exec:"
_LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
_HOST_NAME_RE = re.compile(rf"(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*")


@dataclass(frozen=True)
class Destination:
    """One allowed destination: a host name, ``*.`` a domain (any name below it, not the domain
    itself), an address, or a local program; ``port`` None means any port."""

    kind: str  # "name" | "wildcard" | "ip" | "exec"
    value: str
    port: int | None = None
    ip: IPAddress | None = None

    def matches(self, host: str, ip: IPAddress | None, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        if self.kind == "ip":
            return ip is not None and ip == self.ip
        if ip is not None:
            return False  # a name never matches an address, nor the reverse
        if self.kind == "name":
            return host == self.value
        if self.kind == "wildcard":
            return host.endswith("." + self.value)
        return False


def parse_destination(text: str) -> Destination:
    """One entry of a credential's destination list; ValueError says why it is not one."""
    entry = text.strip()
    if entry.startswith(EXEC_PREFIX):
        program = entry[len(EXEC_PREFIX) :]
        if not program or any(c.isspace() for c in program):
            raise ValueError(f"{text!r}: exec: names one program (a command's first argument)")
        return Destination("exec", program)
    if "://" in entry or "/" in entry:
        raise ValueError(f"{text!r}: a host (api.example.com, host:port), not a URL")
    if entry in ("*", "") or entry.startswith("*:"):
        raise ValueError(
            f"{text!r}: list the hosts a credential may go to; a credential never goes anywhere"
        )
    host, port = entry, None
    if entry.startswith("["):  # [IPv6] or [IPv6]:port
        inside, sep, rest = entry[1:].partition("]")
        if not sep or (rest and not rest.startswith(":")):
            raise ValueError(f"{text!r}: an IPv6 address is written [::1] or [::1]:8080")
        host, port_text = inside, rest[1:] if rest else ""
        port = _port(text, port_text) if rest else None
        try:
            return Destination("ip", host, port, ipaddress.IPv6Address(host))
        except ValueError:
            raise ValueError(f"{text!r}: {host!r} is not an IPv6 address") from None
    if entry.count(":") == 1:
        host, port_text = entry.split(":")
        port = _port(text, port_text)
    elif ":" in entry:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets ([::1] or [::1]:8080)")
    host = host.lower().rstrip(".")
    if host.startswith("*."):
        domain = host[2:]
        if "*" in domain or not _HOST_NAME_RE.fullmatch(domain) or ip_literal(domain):
            raise ValueError(f"{text!r}: a wildcard is *. then a domain name (*.example.com)")
        return Destination("wildcard", domain, port)
    if "*" in host:
        raise ValueError(f"{text!r}: * is allowed only as the first label (*.example.com)")
    address = ip_literal(host)
    if address is not None:
        return Destination("ip", str(address), port, address)
    if not _HOST_NAME_RE.fullmatch(host):
        raise ValueError(f"{text!r}: not a host name")
    return Destination("name", host, port)


def _port(text: str, port_text: str) -> int:
    if not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{text!r}: the port is a number from 1 to 65535")
    return int(port_text)


def parse_destinations(raw: str) -> dict[str, tuple[str, ...]]:
    """ACTHELM_CREDENTIAL_DESTINATIONS as written in the environment:
    ``NAME=host1,host2;NAME2=*.example.com:443,exec:codex`` (entries separated by ``;`` or new
    lines; ``NAME=`` with nothing after it sends the name nowhere). ValueError says what is
    wrong, naming the entry."""
    out: dict[str, tuple[str, ...]] = {}
    for part in re.split(r"[;\n]", raw or ""):
        part = part.strip()
        if not part:
            continue
        name, sep, hosts = part.partition("=")
        name = name.strip()
        if not sep or not ENV_NAME_RE.fullmatch(name):
            raise ValueError(
                f"{part!r}: each entry is NAME=host[,host…] (NAME an environment variable's name)"
            )
        if name in out:
            raise ValueError(f"{name} is listed twice")
        items = [h.strip() for h in hosts.split(",") if h.strip()]
        for item in items:
            parse_destination(item)
        out[name] = tuple(items)
    return out


def destinations_problem(value: object) -> str | None:
    """Why a value of the ACTHELM_CREDENTIAL_DESTINATIONS setting is not a map of names to
    destination lists (the system check); None when it is."""
    if isinstance(value, str):
        try:
            parse_destinations(value)
        except ValueError as exc:
            return str(exc)
        return None
    if not isinstance(value, Mapping):
        return f"it must map credential names to lists of hosts (it is {type(value).__name__})"
    for name, items in value.items():
        if not isinstance(name, str) or not ENV_NAME_RE.fullmatch(name):
            return f"{name!r} is not an environment variable's name"
        if isinstance(items, str) or not isinstance(items, Iterable):
            return f"{name}: a list of hosts, not {items!r}"
        for item in items:
            try:
                parse_destination(str(item))
            except ValueError as exc:
                return f"{name}: {exc}"
    return None


def allowed_destinations(name: str) -> tuple[str, ...] | None:
    """The destinations the operator allows for ``name``; None when it has no entry."""
    table = getattr(settings, "ACTHELM_CREDENTIAL_DESTINATIONS", {}) or {}
    if isinstance(table, str):
        table = parse_destinations(table)
    items = table.get(name)
    return None if items is None else tuple(str(i) for i in items)


def _target(destination: str) -> tuple[str, IPAddress | None, int] | str:
    """``(host, address or None, port)`` of a URL as httpx will connect to it, or why there
    is none."""
    try:
        url = httpx.URL(destination)
    except (httpx.InvalidURL, TypeError, ValueError):
        return "not a valid URL"
    if url.scheme not in ("http", "https") or not url.raw_host:
        return "not an http(s) URL with a host"
    host = url.raw_host.decode("ascii", "replace").lower().rstrip(".")
    port = url.port or (443 if url.scheme == "https" else 80)
    return host, ip_literal(host), port


def shown_destination(destination: str) -> str:
    """A destination as an error message names it: a program, or host[:port] (never a path,
    which can be a secret, nor user:password)."""
    if destination.startswith(EXEC_PREFIX):
        return destination
    target = _target(destination)
    if isinstance(target, str):
        return "that URL"
    host, ip, port = target
    shown = f"[{host}]" if isinstance(ip, ipaddress.IPv6Address) else host
    return f"{shown}:{port}"


class CredentialRefused(Exception):
    """A credential refused by name (``credential_not_allowed``) or for where it would go
    (``credential_destination_not_allowed``); ``message`` is for people and holds no value."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __str__(self) -> str:
        return f"{self.message} [{self.code}]"


def credential_refusal(name: str, destination: str) -> CredentialRefused | None:
    """Why the credential ``name`` may not go to ``destination`` — a URL, or ``exec:PROGRAM``
    for a local program that gets it in its environment; None when it may (or when there is no
    credential). The one check behind every form, service and use: the name's rule first, then
    ACTHELM_CREDENTIAL_DESTINATIONS (a name without an entry goes nowhere)."""
    if not name:
        return None
    if problem := credential_problem(name):
        return CredentialRefused(CREDENTIAL_NOT_ALLOWED, problem)
    allowed = allowed_destinations(name)
    where = shown_destination(destination or "")
    hint = (
        f"ACTHELM_CREDENTIAL_DESTINATIONS does not list {name}: an operator lists where it may "
        f"go (for example {name}={where if not where.startswith('that') else 'api.example.com'})"
    )
    if allowed:
        hint = f"ACTHELM_CREDENTIAL_DESTINATIONS allows {name} only to {', '.join(allowed)}"
    refused = CredentialRefused(
        CREDENTIAL_DESTINATION_NOT_ALLOWED,
        f"the credential {name} may not be sent to {where}: {hint}",
    )
    if not allowed:
        return refused
    patterns = []
    for item in allowed:
        try:
            patterns.append(parse_destination(item))
        except ValueError:
            continue  # the system check reports it; an unreadable entry allows nothing
    if (destination or "").startswith(EXEC_PREFIX):
        program = destination[len(EXEC_PREFIX) :]
        if any(p.kind == "exec" and p.value == program for p in patterns):
            return None
        return refused
    target = _target(destination or "")
    if isinstance(target, str):
        return CredentialRefused(
            CREDENTIAL_DESTINATION_NOT_ALLOWED,
            f"the credential {name} is not sent: the destination is {target}",
        )
    host, ip, port = target
    if any(p.kind != "exec" and p.matches(host, ip, port) for p in patterns):
        return None
    return refused


def credential_for(name: str, destination: str) -> str | None:
    """The value of the credential ``name`` for a request to ``destination`` (a URL, or
    ``exec:PROGRAM``), read from the environment now; None without a name or when the variable
    is unset. Raises CredentialRefused, before reading the variable, when the name is refused or
    the destination is not one the operator allows for it: every use of a credential goes
    through here."""
    if refusal := credential_refusal(name, destination):
        raise refusal
    return os.environ.get(name) if name else None


def same_origin(url: str, base: str) -> bool:
    """Whether ``url`` goes to the same host and port as ``base`` (a request built on a base
    URL that already passed ``credential_for``)."""
    a, b = _target(url), _target(base)
    return not isinstance(a, str) and not isinstance(b, str) and a[0] == b[0] and a[2] == b[2]


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
