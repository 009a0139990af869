"""Sending one notification: email through Django's mail framework, or a signed JSON POST.

No database access here: delivery calls `send()` outside any transaction. A failed send raises
`DeliveryFailed` with a stable code; nothing else escapes for the errors a peer can cause.
"""

import functools
import hashlib
import hmac
import json
import os
import smtplib
import ssl
from dataclasses import dataclass

import certifi
import httpx
from django.conf import settings
from django.core.mail import EmailMessage, mailers

from acthelm_site.credentials import CREDENTIAL_NOT_ALLOWED, credential_problem
from tasks.exceptions import ActhelmError
from tasks.notify.states import TargetKind

SIGNATURE_HEADER = "X-Acthelm-Signature"
USER_AGENT = "Acthelm-Notify/1"


class DeliveryFailed(ActhelmError):
    code = "delivery_failed"


@dataclass(frozen=True)
class Message:
    idempotency_key: str
    event_kind: str
    subject: str
    text: str
    url: str
    payload: dict


def body_bytes(message: Message) -> bytes:
    """The exact bytes that are POSTed and signed: the same on every attempt."""
    body = {"id": message.idempotency_key, "idempotency_key": message.idempotency_key}
    body.update(message.payload)
    body["text"] = message.text
    return json.dumps(body, sort_keys=True, ensure_ascii=False, separators=(",", ":")).encode()


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def send(target, message: Message) -> str:
    """Send `message` to `target`; return a short receipt, or raise DeliveryFailed."""
    if target.kind == TargetKind.EMAIL:
        return _send_email(target, message)
    if target.kind == TargetKind.WEBHOOK:
        return _send_webhook(target, message)
    raise DeliveryFailed(f"unknown target kind {target.kind!r}", code="invalid_target")


def _send_email(target, message: Message) -> str:
    domain = settings.ACTHELM_NOTIFY_MESSAGE_ID_DOMAIN
    email = EmailMessage(
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
        raise DeliveryFailed(f"the mail server did not answer: {exc}", code="timeout") from None
    except smtplib.SMTPRecipientsRefused as exc:
        raise DeliveryFailed(f"recipient refused: {exc}", code="smtp_refused") from None
    except smtplib.SMTPException as exc:
        raise DeliveryFailed(f"SMTP error: {exc}", code="smtp_error") from None
    except OSError as exc:
        raise DeliveryFailed(
            f"cannot reach the mail server: {exc}", code="connection_failed"
        ) from None
    if not sent:
        raise DeliveryFailed("the mail backend sent nothing", code="smtp_error")
    return "accepted by the mail server"


@functools.cache
def _tls_context() -> ssl.SSLContext:
    """Built once: httpx would build (and load the CA bundle into) a new one per request, which
    costs more CPU than the whole rest of a delivery."""
    return ssl.create_default_context(cafile=certifi.where())


def _send_webhook(target, message: Message) -> str:
    body = body_bytes(message)
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        "Idempotency-Key": message.idempotency_key,
        "X-Acthelm-Event": message.event_kind,
    }
    if refusal := credential_problem(target.secret_env):  # a row written before the rule
        raise DeliveryFailed(refusal, code=CREDENTIAL_NOT_ALLOWED)
    if target.secret_env:
        secret = os.environ.get(target.secret_env, "")
        if not secret:
            raise DeliveryFailed(
                f"the environment variable {target.secret_env} is not set", code="secret_missing"
            )
        headers[SIGNATURE_HEADER] = sign(secret, body)
    timeout = settings.ACTHELM_NOTIFY_TIMEOUT_SECONDS
    try:
        # No redirects: a POST that is redirected is not the POST that was signed for this URL.
        response = httpx.post(
            target.address,
            content=body,
            headers=headers,
            timeout=timeout,
            follow_redirects=False,
            verify=_tls_context(),
        )
    except httpx.TimeoutException:
        raise DeliveryFailed(f"no answer within {timeout:g} s", code="timeout") from None
    except httpx.HTTPError as exc:
        raise DeliveryFailed(
            f"cannot reach the receiver: {exc.__class__.__name__}: {exc}", code="connection_failed"
        ) from None
    if not 200 <= response.status_code < 300:
        raise DeliveryFailed(
            f"the receiver answered {response.status_code}: {response.text[:200]}",
            code=f"http_{response.status_code}",
        )
    return f"HTTP {response.status_code}"
