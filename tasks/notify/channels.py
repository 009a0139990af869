"""Sending one notification: email through Django's mail framework, or a signed JSON POST.

Each target kind is a `Channel` class registered with `@register`, as provider kinds and tools
are: it says what a target's address must be, how the address is shown, whether the target may
be signed, and how one message is sent. `send()` looks the channel up by the target's kind, and
the models' `kind` and `channel` fields take their choices from the registry (`channel_choices`,
a callable, so the migrations name the function and not the list): a new channel is one class.

No database access here: delivery calls `send()` outside any transaction. A failed send raises
`DeliveryFailed` with a stable code; nothing else escapes for the errors a peer can cause.

A webhook is hostile like any page a tool fetches: its host must resolve to public addresses
(or ones `ACTHELM_NOTIFY_ALLOW_ADDRESSES` names), the connection goes to exactly the addresses
checked, one deadline covers the whole send (a receiver that trickles bytes is cut off at
`ACTHELM_NOTIFY_TIMEOUT_SECONDS`), at most `MAX_RESPONSE_BYTES` of the answer are read, and only
its status code is kept.
"""

import email.policy
import enum
import hashlib
import hmac
import ipaddress
import json
import smtplib
import time
from collections.abc import Mapping
from dataclasses import dataclass
from email.message import EmailMessage as PyEmailMessage
from email.policy import Policy
from typing import TYPE_CHECKING, ClassVar
from urllib.parse import urlsplit

import httpx
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.mail import EmailMessage, mailers
from django.core.validators import EmailValidator, URLValidator

from core.credentials import CredentialRefused, credential_for
from core.egress import (
    EgressError,
    Guard,
    PinnedTransport,
    ResolveError,
    address_allowed_by,
    address_refusal,
    checked_addresses,
    ip_literal,
)
from core.exceptions import ActhelmError, ErrorCode

if TYPE_CHECKING:
    from tasks.notify.models import NotificationTarget

SIGNATURE_HEADER = "X-Acthelm-Signature"
TIMESTAMP_HEADER = "X-Acthelm-Timestamp"
# A receiver refuses a signed request whose timestamp is further than this from its clock
# (docs/operations.md), so a captured request cannot be replayed later.
SIGNATURE_TOLERANCE_SECONDS = 300
USER_AGENT = "Acthelm-Notify/1"
MAX_RESPONSE_BYTES = 4096


class DeliveryCode(enum.StrEnum):
    """Why a send failed, kept on the notification and its target (`last_error_code`): data for
    the operator, not an HTTP answer, so a registry of its own beside `core.exceptions.ErrorCode`.
    Besides these a code is a receiver's HTTP status (`http_code`), Slack's error name
    (`slack_code`) or a refused credential's code (`core.credentials`)."""

    INVALID_TARGET = "invalid_target"
    TIMEOUT = "timeout"
    CONNECTION_FAILED = "connection_failed"
    ADDRESS_NOT_ALLOWED = "address_not_allowed"
    SECRET_MISSING = "secret_missing"
    SMTP_REFUSED = "smtp_refused"
    SMTP_ERROR = "smtp_error"
    SLACK_BAD_ANSWER = "slack_bad_answer"
    TARGET_REMOVED = "target_removed"


def http_code(status: int) -> str:
    """The delivery code of a receiver's answer that is not a 2xx: `http_503`."""
    return f"http_{status}"


def slack_code(error: str) -> str:
    """The delivery code of Slack's refusal, its stable error name: `slack_channel_not_found`."""
    return f"slack_{error}"


class DeliveryFailed(ActhelmError):
    """A send that failed; `code` is its delivery code (above), what the outbox keeps."""

    error = ErrorCode.DELIVERY_FAILED

    def __init__(self, message: str, *, code: str) -> None:
        super().__init__(message)
        self.code = code


@dataclass(frozen=True)
class Message:
    idempotency_key: str
    event_kind: str
    subject: str
    text: str
    url: str
    payload: Mapping[str, object]  # the JSON a webhook's body carries


def body_bytes(message: Message) -> bytes:
    """The exact bytes that are POSTed and signed: the same on every attempt."""
    body: dict[str, object] = {
        "id": message.idempotency_key,
        "idempotency_key": message.idempotency_key,
    }
    body.update(message.payload)
    body["text"] = message.text
    return json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def sign(secret: str, body: bytes, timestamp: str) -> str:
    """HMAC-SHA256 over `<timestamp>.<body>`: the signature covers when it was sent."""
    signed = timestamp.encode() + b"." + body
    return "sha256=" + hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()


class Channel:
    """One kind of notification target. Subclasses set `kind` and implement `send`; the
    class methods are the kind's rules, asked by the model's `clean()`, pages and the CLI."""

    kind: ClassVar[str] = ""
    #: The kind's name for people (forms, the admin); the kind itself when empty.
    label: ClassVar[str] = ""
    #: Whether a target of this kind may name a signing secret (`secret_env`).
    signed: ClassVar[bool] = False
    #: The help of the kind's `acthelm_notify add --<kind>` option.
    address_help: ClassVar[str] = ""
    #: Whether a target of this kind names a bot token (`token_env`).
    needs_token: ClassVar[bool] = False
    #: Whether an event with several open approvals is one message per approval (one outbox
    #: row each), so that each message carries its own buttons and is updated on its own.
    message_per_decision: ClassVar[bool] = False

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        """Why `address` may not be saved for this kind, or None."""
        return None

    @classmethod
    def credential_destination(cls, address: str) -> str:
        """Where the target's credentials go (ACTHELM_CREDENTIAL_DESTINATIONS checks it)."""
        return address

    @classmethod
    def credential_problems(cls, target: "NotificationTarget") -> dict[str, str]:
        """The kind's own rules for the target's credential fields: field → problem."""
        return {}

    @classmethod
    def shown_address(cls, address: str) -> str:
        """The address for pages and lists (the admin shows the whole address)."""
        return address

    @classmethod
    def send(cls, target: "NotificationTarget", message: Message) -> str:
        """Send `message` to `target`; return a short receipt, or raise DeliveryFailed."""
        raise NotImplementedError


_CHANNELS: dict[str, type[Channel]] = {}


def register(cls: type[Channel]) -> type[Channel]:
    """Class decorator: register a Channel subclass under its `kind`."""
    if not cls.kind:
        raise ValueError(f"{cls.__name__} has no kind")
    existing = _CHANNELS.get(cls.kind)
    if existing is not None and existing is not cls:
        raise ValueError(f"channel kind {cls.kind!r} already registered by {existing.__name__}")
    _CHANNELS[cls.kind] = cls
    return cls


def unregister(kind: str) -> None:
    """Forget a channel kind (tests that register a throwaway channel)."""
    _CHANNELS.pop(kind, None)


def find_channel(kind: str) -> type[Channel] | None:
    return _CHANNELS.get(kind)


def get_channel(kind: str) -> type[Channel]:
    channel = _CHANNELS.get(kind)
    if channel is None:
        raise DeliveryFailed(f"unknown target kind {kind!r}", code=DeliveryCode.INVALID_TARGET)
    return channel


def channel_kinds() -> list[str]:
    """The registered kinds, in the order they were registered."""
    return list(_CHANNELS)


def channel_choices() -> list[tuple[str, str]]:
    """The choices of `NotificationTarget.kind` and `Notification.channel`: the registered
    kinds with their labels."""
    return [(kind, channel.label or kind) for kind, channel in _CHANNELS.items()]


def send(target: "NotificationTarget", message: Message) -> str:
    """Send `message` to `target`; return a short receipt, or raise DeliveryFailed."""
    return get_channel(target.kind).send(target, message)


@register
class EmailChannel(Channel):
    kind = "email"
    label = "Email"
    address_help = "an email address"

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        try:
            EmailValidator()(address)
        except ValidationError:
            return "an email target needs an email address"
        return None

    @classmethod
    def send(cls, target: "NotificationTarget", message: Message) -> str:
        return _send_email(target, message)


# The longest line a message may carry (RFC 5322, 2.1.1: 998 characters without the CRLF).
MAX_MAIL_LINE_BYTES = 998


class WholeLinesEmail(EmailMessage):
    """A plain-text email whose lines are sent whole (8bit) when each fits in a mail line, so a
    decision link is one line in any mail reader and in the console backend's output (as
    quoted-printable, it is broken over lines ending in ``=``, and a pasted piece opens
    nothing). A longer line leaves the body to Django's encoding."""

    def message(self, *, policy: Policy | None = None) -> PyEmailMessage:
        msg = super().message(policy=policy or email.policy.default)
        body = str(self.body)
        if all(len(line.encode()) <= MAX_MAIL_LINE_BYTES for line in body.splitlines()):
            msg.set_content(body, subtype="plain", charset="utf-8", cte="8bit")
        return msg


def _send_email(target: "NotificationTarget", message: Message) -> str:
    domain = settings.ACTHELM_NOTIFY_MESSAGE_ID_DOMAIN
    email = WholeLinesEmail(
        subject=message.subject,
        body=f"{message.text}\n\n{message.url}\n",
        from_email=settings.DEFAULT_FROM_EMAIL,
        to=[target.address],
        headers={
            # The same Message-ID on every attempt: a mail system can drop the repeat.
            "Message-ID": f"<{message.idempotency_key}@{domain}>",
            "X-Acthelm-Idempotency-Key": message.idempotency_key,
            "X-Acthelm-Event": message.event_kind,
        },
    )
    try:
        # The timeout is the mailer's OPTIONS["timeout"] (ACTHELM_NOTIFY_TIMEOUT_SECONDS).
        sent = mailers.default.send_messages([email])
    except TimeoutError as exc:
        raise DeliveryFailed(
            f"the mail server did not answer: {exc}", code=DeliveryCode.TIMEOUT
        ) from None
    except smtplib.SMTPRecipientsRefused as exc:
        raise DeliveryFailed(f"recipient refused: {exc}", code=DeliveryCode.SMTP_REFUSED) from None
    except smtplib.SMTPException as exc:
        raise DeliveryFailed(f"SMTP error: {exc}", code=DeliveryCode.SMTP_ERROR) from None
    except OSError as exc:
        raise DeliveryFailed(
            f"cannot reach the mail server: {exc}", code=DeliveryCode.CONNECTION_FAILED
        ) from None
    if not sent:
        raise DeliveryFailed("the mail backend sent nothing", code=DeliveryCode.SMTP_ERROR)
    return "accepted by the mail server"


def webhook_host(address: str) -> tuple[str, int]:
    """The host (IDNA, lower case, no brackets or trailing dot) and port a webhook URL reaches."""
    try:
        url = httpx.URL(address)
        host = url.raw_host.decode("ascii").strip("[]").lower().rstrip(".")
    except (httpx.InvalidURL, UnicodeError, ValueError):
        raise DeliveryFailed(
            "the webhook URL is not valid", code=DeliveryCode.INVALID_TARGET
        ) from None
    if url.scheme not in ("http", "https") or not host:
        raise DeliveryFailed(
            "a webhook target needs an http(s) URL", code=DeliveryCode.INVALID_TARGET
        )
    return host, url.port or (443 if url.scheme == "https" else 80)


def webhook_address_refusal(address: str) -> str | None:
    """Why a webhook URL may not be saved, judged without DNS: an address written in the URL (in
    any spelling) or `localhost` that is not public and not allowed. A name that resolves inside
    is refused at each send instead."""
    try:
        host, _port = webhook_host(address)
    except DeliveryFailed as exc:
        return exc.message
    allowed = settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES
    if host == "localhost" or host.endswith(".localhost"):
        loopback = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
        if any(address_allowed_by(ip, allowed) for ip in loopback):
            return None
        return "localhost is not a public address (ACTHELM_NOTIFY_ALLOW_ADDRESSES may allow it)"
    ip = ip_literal(host)
    if ip is None:
        return None
    reason = address_refusal(ip)
    if reason and not address_allowed_by(ip, allowed):
        return (
            f"{host} is a {reason} address ({ip}); a webhook reaches public addresses only, "
            "unless ACTHELM_NOTIFY_ALLOW_ADDRESSES names it"
        )
    return None


@register
class WebhookChannel(Channel):
    kind = "webhook"
    label = "Webhook (JSON POST)"
    signed = True
    address_help = "an http(s) URL that receives a JSON POST"

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        try:
            URLValidator(schemes=["http", "https"])(address)
        except ValidationError:
            return "a webhook target needs an http:// or https:// URL"
        return webhook_address_refusal(address)

    @classmethod
    def shown_address(cls, address: str) -> str:
        """A webhook URL's path is often its secret (Slack, Mattermost): only the scheme and
        host are shown."""
        parts = urlsplit(address)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
        return f"{parts.scheme}://{host}{port}/…"

    @classmethod
    def send(cls, target: "NotificationTarget", message: Message) -> str:
        return _send_webhook(target, message)


def _send_webhook(target: "NotificationTarget", message: Message) -> str:
    body = body_bytes(message)
    timestamp = str(int(time.time()))
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Idempotency-Key": message.idempotency_key,
        "X-Acthelm-Event": message.event_kind,
        TIMESTAMP_HEADER: timestamp,
    }
    if target.secret_env:
        # The one door: the name's rule and the operator's destinations for it, checked again
        # at each send (a row written before the rules signs nothing and sends nothing).
        try:
            secret = credential_for(target.secret_env, target.address) or ""
        except CredentialRefused as exc:
            raise DeliveryFailed(exc.message, code=exc.code) from None
        if not secret:
            raise DeliveryFailed(
                f"the environment variable {target.secret_env} is not set",
                code=DeliveryCode.SECRET_MISSING,
            )
        headers[SIGNATURE_HEADER] = sign(secret, body, timestamp)
    status, _answer = post(target.address, body, headers)
    if not 200 <= status < 300:
        # The status only: what an internal peer answers is not ours to store or show.
        raise DeliveryFailed(f"the receiver answered HTTP {status}", code=http_code(status))
    return f"HTTP {status}"


def post(url: str, body: bytes, headers: Mapping[str, str], *, keep: int = 0) -> tuple[int, bytes]:
    """POST `body` to `url` through the egress policy: the host must resolve to public addresses
    (or ones ACTHELM_NOTIFY_ALLOW_ADDRESSES names), the connection goes to exactly the addresses
    checked, no redirect is followed, and one deadline (ACTHELM_NOTIFY_TIMEOUT_SECONDS) covers
    the whole exchange. Returns the status and at most `keep` bytes of the answer."""
    timeout = settings.ACTHELM_NOTIFY_TIMEOUT_SECONDS
    deadline = time.monotonic() + timeout
    host, port = webhook_host(url)
    try:
        addresses = checked_addresses(
            host, port, timeout=timeout, allowed=settings.ACTHELM_NOTIFY_ALLOW_ADDRESSES
        )
    except ResolveError as exc:
        code = DeliveryCode.TIMEOUT if exc.code == "timeout" else DeliveryCode.CONNECTION_FAILED
        raise DeliveryFailed(exc.message, code=code) from None
    except EgressError as exc:
        raise DeliveryFailed(exc.message, code=DeliveryCode.ADDRESS_NOT_ALLOWED) from None
    guard = Guard(deadline, None)
    kept = bytearray()
    try:
        # No redirects: a POST that is redirected is not the POST that was signed for this URL.
        with (
            httpx.Client(
                transport=PinnedTransport(host, addresses, guard),
                follow_redirects=False,
                trust_env=False,
                timeout=timeout,
            ) as client,
            client.stream("POST", url, content=body, headers=dict(headers)) as response,
        ):
            status = response.status_code
            read = 0
            limit = max(keep, MAX_RESPONSE_BYTES)
            for chunk in response.iter_raw():  # drained a little; kept only up to `keep`
                read += len(chunk)
                if len(kept) < keep:
                    kept.extend(chunk[: keep - len(kept)])
                if read >= limit:
                    break
    except httpx.TimeoutException:
        raise DeliveryFailed(f"no answer within {timeout:g} s", code=DeliveryCode.TIMEOUT) from None
    except httpx.HTTPError as exc:
        raise DeliveryFailed(
            f"cannot reach the receiver: {exc.__class__.__name__}: {exc}",
            code=DeliveryCode.CONNECTION_FAILED,
        ) from None
    finally:
        guard.stop()
    return status, bytes(kept)
