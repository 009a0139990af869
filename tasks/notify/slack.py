"""The Slack channel: a Block Kit message per awaiting approval, posted with `chat.postMessage`,
and the updates of a message a person decided from (its `response_url`).

A target of kind `slack` names a channel (its address), the bot token (`token_env`) and the
app's signing secret (`secret_env`, checked by the console's interactivity endpoint). Both
credentials belong to Slack: ACTHELM_CREDENTIAL_DESTINATIONS must allow them to the host of
`ACTHELM_SLACK_API_URL`. Every call goes through the outbox (deadline, retries) and the egress
policy (`channels.post`). The message is built at send time from the payload the outbox composed
in the event's transaction, so every attempt posts the same blocks.

A message's buttons carry `approval id + arguments hash` (`button_value`); the console decides
with that hash, so a button for an operation that changed decides nothing.
"""

import json
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict
from urllib.parse import unquote, urlsplit

from django.conf import settings

from core.credentials import CredentialRefused, credential_for
from tasks.notify.channels import (
    USER_AGENT,
    Channel,
    DeliveryCode,
    DeliveryFailed,
    Message,
    http_code,
    post,
    register,
    slack_code,
)

if TYPE_CHECKING:
    from tasks.notify.models import NotificationTarget

APPROVE_ACTION = "acthelm_approve"
DENY_ACTION = "acthelm_deny"
OPEN_ACTION = "acthelm_open"  # a link button: Slack tells the endpoint, which does nothing
#: The payload key of a queued update of a message a person decided from.
RESPONSE_KEY = "slack_response"
#: How much of Slack's answer to chat.postMessage is read (it echoes the message).
MAX_ANSWER_BYTES = 64 * 1024
_CHANNEL_RE = re.compile(r"[#@]?[A-Za-z0-9._-]{1,80}")
_SLACK_ERROR = re.compile(r"[a-z0-9_]{1,60}")
TEXT_LIMIT = 2900  # Slack refuses a text object over 3000 characters


class SlackResponse(TypedDict):
    """A queued update of a message (`Notification.payload[RESPONSE_KEY]`)."""

    response_url: str
    text: str
    replace_original: bool


def api_url(method: str) -> str:
    return settings.ACTHELM_SLACK_API_URL.rstrip("/") + "/" + method


def button_value(approval_id: int, arguments_hash: str) -> str:
    return json.dumps({"approval_id": approval_id, "arguments_hash": arguments_hash})


_DEFAULT_PORTS = {"https": 443, "http": 80}


def _url_parts(url: str) -> tuple[str, str, int, str] | None:
    """(scheme, host, port, path) of an http(s) URL with a host and no user info; None for
    anything else, or for a URL a client might read otherwise than `urlsplit` does (a space, a
    control character, a backslash, a ``.``/``..`` segment)."""
    if any(c <= " " or c in "\\\x7f" for c in url):
        return None
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:  # a port that is not a number, or out of range
        return None
    scheme = parts.scheme.lower()
    if scheme not in _DEFAULT_PORTS or not parts.hostname or "@" in parts.netloc:
        return None
    if any(unquote(seg) in (".", "..") for seg in parts.path.split("/")):
        return None
    return scheme, parts.hostname, port or _DEFAULT_PORTS[scheme], parts.path


def _under(path: str, prefix: str) -> bool:
    """`path` is `prefix` or below it, by whole segments (/respond admits /respond/1, never
    /responder)."""
    if prefix in ("", "/") or prefix.endswith("/"):
        return path.startswith(prefix or "/")
    return path == prefix or path.startswith(prefix + "/")


def response_url_allowed(url: str) -> bool:
    """A response_url is Slack's (ACTHELM_SLACK_RESPONSE_URL_PREFIXES): a signed request's, but
    the request's body is still a remote's words. Matched by scheme, host and port exactly, then
    by path, never as text: `https://hooks.slack.com` does not admit
    `https://hooks.slack.com.evil/` or `https://hooks.slack.com@evil/`."""
    parts = _url_parts(url)
    if parts is None:
        return False
    for prefix in settings.ACTHELM_SLACK_RESPONSE_URL_PREFIXES:
        allowed = _url_parts(prefix)
        if allowed is not None and parts[:3] == allowed[:3] and _under(parts[3], allowed[3]):
            return True
    return False


def _clip(text: object, limit: int = TEXT_LIMIT) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def escape(text: object) -> str:
    """Slack's mrkdwn control characters, escaped as Slack documents (`<` would open a link or a
    mention, `&` an entity)."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def line(text: object, limit: int) -> str:
    """Words a person or a model wrote, as a message shows them: on one line (every run of
    whitespace one space, as the outbox's `clip`), escaped, at most `limit` characters of the
    escaped text (never cut inside an ``&amp;``). A title's newline cannot draw a line of its
    own, a fake ``*Tool:*`` above the real one; its ``<`` cannot make a link."""
    flat = escape(" ".join(str(text).split()))
    if len(flat) <= limit:
        return flat
    cut = flat[: limit - 1]
    entity = cut.rfind("&")
    if entity != -1 and ";" not in cut[entity:]:
        cut = cut[:entity]
    return cut + "…"


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _clip(text)}}


def approval_blocks(payload: Mapping[str, Any], approval: Mapping[str, Any]) -> list[Any]:
    """One approval's card: the facts the console's card shows, Approve / Deny, and the link."""
    task = payload.get("task") or {}
    # Each fact one line: what the task's author, a planning model or a tool wrote cannot
    # add a line (the card's total stays under TEXT_LIMIT).
    title = line(task.get("title", ""), 300)
    facts = [
        f"*Approval needed* — task #{line(task.get('id'), 20)} “{title}”",
        f"*Tool:* `{line(approval.get('tool', ''), 200)}`",
        f"*Target:* `{line(approval.get('target', ''), 800)}`",
        f"*Arguments:* `{line(approval.get('arguments', ''), 800)}`",
        f"*Effect:* {line(approval.get('effect', ''), 600)}",
    ]
    value = button_value(int(approval["id"]), str(approval.get("arguments_hash", "")))
    buttons: list[dict[str, Any]] = [
        {
            "type": "button",
            "action_id": APPROVE_ACTION,
            "style": "primary",
            "text": {"type": "plain_text", "text": "Approve"},
            "value": value,
        },
        {
            "type": "button",
            "action_id": DENY_ACTION,
            "style": "danger",
            "text": {"type": "plain_text", "text": "Deny"},
            "value": value,
        },
    ]
    if approval.get("link"):
        buttons.append(
            {
                "type": "button",
                "action_id": OPEN_ACTION,
                "text": {"type": "plain_text", "text": "Open in Acthelm"},
                "url": _clip(approval["link"], 3000),
            }
        )
    return [
        _section("\n".join(facts)),
        {
            "type": "context",
            "elements": [
                {"type": "mrkdwn", "text": f"hash `{line(approval.get('arguments_hash'), 17)}`"}
            ],
        },
        {"type": "actions", "block_id": f"approval-{approval['id']}", "elements": buttons},
    ]


def message_body(target: "NotificationTarget", message: Message) -> dict[str, Any]:
    """chat.postMessage's JSON: the approval's card, or the notification's text and link."""
    payload = message.payload
    approvals = payload.get("approvals")
    blocks: list[Any] = []
    if isinstance(approvals, list) and approvals:
        for approval in approvals:
            blocks.extend(approval_blocks(payload, approval))
    else:
        subject = line(message.subject, 400)
        blocks.append(_section(f"*{subject}*\n{line(message.text, TEXT_LIMIT - 410)}"))
    return {
        "channel": target.address,
        # The notification's words where blocks are not shown (mrkdwn too).
        "text": line(message.subject, TEXT_LIMIT),
        "blocks": blocks,
        "unfurl_links": False,
    }


def _token(target: "NotificationTarget") -> str:
    try:
        token = credential_for(target.token_env, settings.ACTHELM_SLACK_API_URL) or ""
    except CredentialRefused as exc:
        raise DeliveryFailed(exc.message, code=exc.code) from None
    if not token:
        raise DeliveryFailed(
            f"the environment variable {target.token_env or '(no token_env)'} is not set",
            code=DeliveryCode.SECRET_MISSING,
        )
    return token


def _json_headers() -> dict[str, str]:
    return {"Content-Type": "application/json; charset=utf-8", "User-Agent": USER_AGENT}


def _post_message(target: "NotificationTarget", message: Message) -> str:
    body = json.dumps(message_body(target, message), ensure_ascii=False).encode()
    headers = _json_headers() | {"Authorization": f"Bearer {_token(target)}"}
    status, answer = post(api_url("chat.postMessage"), body, headers, keep=MAX_ANSWER_BYTES)
    if not 200 <= status < 300:
        raise DeliveryFailed(f"Slack answered HTTP {status}", code=http_code(status))
    try:
        result = json.loads(answer)
    except ValueError:
        raise DeliveryFailed(
            "Slack's answer is not JSON", code=DeliveryCode.SLACK_BAD_ANSWER
        ) from None
    if not isinstance(result, dict) or result.get("ok") is not True:
        error = result.get("error") if isinstance(result, dict) else None
        name = error if isinstance(error, str) and _SLACK_ERROR.fullmatch(error) else "error"
        # Slack's error names are stable codes (invalid_auth, channel_not_found, …).
        raise DeliveryFailed(f"Slack refused the message: {name}", code=slack_code(name))
    return f"posted to {target.address}"


def _respond(response: Mapping[str, Any]) -> str:
    url = str(response.get("response_url", ""))
    if not response_url_allowed(url):
        raise DeliveryFailed("the response_url is not Slack's", code=DeliveryCode.INVALID_TARGET)
    body = {
        "text": _clip(response.get("text", "")),
        "replace_original": bool(response.get("replace_original")),
    }
    if body["replace_original"]:
        body["blocks"] = [_section(str(body["text"]))]
    else:
        body["response_type"] = "ephemeral"
    status, _answer = post(url, json.dumps(body, ensure_ascii=False).encode(), _json_headers())
    if not 200 <= status < 300:
        raise DeliveryFailed(f"Slack answered HTTP {status}", code=http_code(status))
    return f"message updated (HTTP {status})"


@register
class SlackChannel(Channel):
    kind = "slack"
    label = "Slack"
    signed = True  # secret_env: the app's signing secret (the console checks requests with it)
    needs_token = True
    message_per_decision = True
    address_help = "a Slack channel id (C0123…) the app's bot was invited to"

    @classmethod
    def address_problem(cls, address: str) -> str | None:
        if not _CHANNEL_RE.fullmatch(address):
            return "a Slack target needs a channel id (C0123ABCD) or name"
        return None

    @classmethod
    def credential_destination(cls, address: str) -> str:
        return str(settings.ACTHELM_SLACK_API_URL)

    @classmethod
    def credential_problems(cls, target: "NotificationTarget") -> dict[str, str]:
        problems = {}
        if not target.token_env:
            problems["token_env"] = "a Slack target names the bot token's environment variable"
        if not target.secret_env:
            problems["secret_env"] = (
                "a Slack target names the signing secret's environment variable "
                "(its buttons are refused without it)"
            )
        return problems

    @classmethod
    def send(cls, target: "NotificationTarget", message: Message) -> str:
        response = message.payload.get(RESPONSE_KEY)
        if isinstance(response, Mapping):
            return _respond(response)
        return _post_message(target, message)
