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

from django.conf import settings

from core.credentials import CredentialRefused, credential_for
from tasks.notify.channels import USER_AGENT, Channel, DeliveryFailed, Message, post, register

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


def response_url_allowed(url: str) -> bool:
    """A response_url is Slack's (ACTHELM_SLACK_RESPONSE_URL_PREFIXES): a signed request's, but
    the request's body is still a remote's words."""
    return any(url.startswith(prefix) for prefix in settings.ACTHELM_SLACK_RESPONSE_URL_PREFIXES)


def _clip(text: object, limit: int = TEXT_LIMIT) -> str:
    text = str(text)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _escape(text: object) -> str:
    """Slack's mrkdwn control characters, escaped as Slack documents."""
    return str(text).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _section(text: str) -> dict[str, Any]:
    return {"type": "section", "text": {"type": "mrkdwn", "text": _clip(text)}}


def approval_blocks(payload: Mapping[str, Any], approval: Mapping[str, Any]) -> list[Any]:
    """One approval's card: the facts the console's card shows, Approve / Deny, and the link."""
    task = payload.get("task") or {}
    title = _escape(_clip(task.get("title", ""), 150))
    facts = [
        f"*Approval needed* — task #{task.get('id')} “{title}”",
        f"*Tool:* `{_escape(approval.get('tool', ''))}`",
        f"*Target:* `{_escape(_clip(approval.get('target', ''), 500))}`",
        f"*Arguments:* `{_escape(approval.get('arguments', ''))}`",
        f"*Effect:* {_escape(_clip(approval.get('effect', ''), 500))}",
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
                {"type": "mrkdwn", "text": f"hash `{str(approval.get('arguments_hash'))[:16]}…`"}
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
        blocks.append(_section(f"*{_escape(message.subject)}*\n{_escape(message.text)}"))
    return {
        "channel": target.address,
        "text": _clip(message.subject),  # the notification's words where blocks are not shown
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
            code="secret_missing",
        )
    return token


def _json_headers() -> dict[str, str]:
    return {"Content-Type": "application/json; charset=utf-8", "User-Agent": USER_AGENT}


def _post_message(target: "NotificationTarget", message: Message) -> str:
    body = json.dumps(message_body(target, message), ensure_ascii=False).encode()
    headers = _json_headers() | {"Authorization": f"Bearer {_token(target)}"}
    status, answer = post(api_url("chat.postMessage"), body, headers, keep=MAX_ANSWER_BYTES)
    if not 200 <= status < 300:
        raise DeliveryFailed(f"Slack answered HTTP {status}", code=f"http_{status}")
    try:
        result = json.loads(answer)
    except ValueError:
        raise DeliveryFailed("Slack's answer is not JSON", code="slack_bad_answer") from None
    if not isinstance(result, dict) or result.get("ok") is not True:
        error = result.get("error") if isinstance(result, dict) else None
        code = error if isinstance(error, str) and _SLACK_ERROR.fullmatch(error) else "error"
        # Slack's error names are stable codes (invalid_auth, channel_not_found, …).
        raise DeliveryFailed(f"Slack refused the message: {code}", code=f"slack_{code}")
    return f"posted to {target.address}"


def _respond(response: Mapping[str, Any]) -> str:
    url = str(response.get("response_url", ""))
    if not response_url_allowed(url):
        raise DeliveryFailed("the response_url is not Slack's", code="invalid_target")
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
        raise DeliveryFailed(f"Slack answered HTTP {status}", code=f"http_{status}")
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
