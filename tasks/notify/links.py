"""Signed, expiring links to one decision, for the messages the outbox sends.

A link names what it opens (`LinkKind`: an approval, a needs_review decision, a task in review),
its id and what it is bound to: an operation's arguments hash, or, for a task in review, the
event that put it there. It is signed with Django's signing under a salt per kind, so a link
for one purpose never opens another, and it expires after `ACTHELM_DECISION_LINK_SECONDS`.

A link only *finds* a decision: it never decides. The console's page behind it needs a signed-in
person and offers the inbox's buttons, which check the permission and the hash again.
"""

from dataclasses import dataclass
from enum import StrEnum
from urllib.parse import urlsplit

from django.conf import settings
from django.core import signing
from django.urls import Resolver404, resolve, reverse

from core.exceptions import ActhelmError, ErrorCode

SALT_PREFIX = "acthelm.decision-link."


class LinkKind(StrEnum):
    APPROVAL = "approval"
    REVIEW = "review"  # a needs_review decision on an operation of unknown outcome
    TASK = "task"  # a task in review: close it or reopen it


class LinkRefused(ActhelmError):
    """A decision link that opens nothing."""

    error = ErrorCode.LINK_INVALID


class LinkExpired(LinkRefused):
    error = ErrorCode.LINK_EXPIRED


@dataclass(frozen=True)
class LinkTarget:
    kind: LinkKind
    id: int
    bound_to: str  # the arguments hash; for a task, the id of the event that entered review


def _signer(kind: str) -> signing.TimestampSigner:
    return signing.TimestampSigner(salt=SALT_PREFIX + kind)


def link_token(kind: LinkKind, pk: int, bound_to: str) -> str:
    return _signer(kind).sign_object({"id": pk, "bound_to": bound_to}, compress=False)


def decision_link(kind: LinkKind, pk: int, bound_to: str) -> str:
    """The absolute URL of the console's page for this one decision."""
    path = reverse("decisions:link", args=[str(kind), link_token(kind, pk, bound_to)])
    return settings.ACTHELM_BASE_URL.rstrip("/") + path


def read_link(kind: str, token: str) -> LinkTarget:
    """What a link opens; LinkExpired past its age, LinkRefused when it was altered (or is for
    another kind)."""
    if kind not in LinkKind.__members__.values():
        raise LinkRefused("this link does not open a decision")
    try:
        value = _signer(kind).unsign_object(token, max_age=settings.ACTHELM_DECISION_LINK_SECONDS)
    except signing.SignatureExpired:
        raise LinkExpired(
            "this link has expired; open the decision from the approvals inbox"
        ) from None
    except signing.BadSignature:
        raise LinkRefused("this link is not valid: it was altered or cut short") from None
    if (
        not isinstance(value, dict)
        or not isinstance(value.get("id"), int)
        or not isinstance(value.get("bound_to"), str)
    ):
        raise LinkRefused("this link is not valid")
    return LinkTarget(LinkKind(kind), value["id"], value["bound_to"])


def link_parts(url: str) -> tuple[LinkKind, str] | None:
    """The kind and token of a decision link (``…/decide/<kind>/<token>/``), or None when `url`
    is not one (a task page, the inbox): read from its path, whatever host it names."""
    try:
        match = resolve(urlsplit(url).path)
    except Resolver404:
        return None
    kind = str(match.kwargs.get("kind", ""))
    if match.view_name != "decisions:link" or kind not in LinkKind.__members__.values():
        return None
    return LinkKind(kind), str(match.kwargs["token"])
