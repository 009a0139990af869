"""Creating, listing, revoking and checking API tokens: the admin, `acthelm_token` and the API's
authentication all call these.

A token is `acthelm_<prefix>_<secret>`: 8 hex characters of prefix (not secret; shown in lists)
and 43 characters of `secrets.token_urlsafe(32)` (256 bits). Only its SHA-256 is stored, and the
lookup is by that hash, so the database never holds anything that works as a token.
"""

import hashlib
import logging
import secrets
from dataclasses import dataclass
from datetime import timedelta
from typing import TypedDict

from django.contrib.auth.models import User
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.utils import timezone

from acthelm_site.api.models import ApiToken
from core.exceptions import (
    ActhelmError,
    ErrorCode,
    InvalidInput,
    NotFound,
    NotPermitted,
    TransitionNotAllowed,
)

log = logging.getLogger("acthelm.api")

TOKEN_PREFIX = "acthelm_"
# How stale last_used_at may be before a request writes it again.
LAST_USED_PRECISION = timedelta(seconds=60)


class TokenRefused(ActhelmError):
    """The request carries no token, a malformed or unknown one, or a revoked one (HTTP 401)."""

    error = ErrorCode.TOKEN_INVALID


class TokenNotFound(NotFound):
    error = ErrorCode.TOKEN_NOT_FOUND


@dataclass(frozen=True)
class NewToken:
    token: ApiToken
    # The token itself: shown once, never stored.
    secret: str
    # The live token of the same name that `replace` revoked, if there was one.
    replaced: ApiToken | None = None


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode()).hexdigest()


def token_holder_refusal(user: User) -> str | None:
    """Why `user` may not hold (or use) an API token: only active staff may — the people who may
    open the console; a token acts with its person's permissions, no more."""
    if not user.is_active:
        return f"{user.get_username()} is not an active user"
    if not user.is_staff:
        return f"{user.get_username()} is not staff: only staff users hold API tokens"
    return None


def token_create(
    *, user: User, name: str, created_by: User | None = None, replace: bool = False
) -> NewToken:
    """A new token for `user`; the returned secret is the only copy. `created_by` is the person
    creating it (None: an operator on the server, `acthelm_token`): only the person themselves
    or a superuser may create a token for a person. A person has one live token of a name;
    `replace` revokes that one in the same transaction (a token cannot be shown again, so a
    script that runs twice gets a new one and the old one stops working)."""
    name = (name or "").strip()
    if not name:
        raise InvalidInput("a token needs a name (what it is for)", field="name")
    if len(name) > 100:
        raise InvalidInput("a token name is at most 100 characters", field="name")
    holder_refusal = token_holder_refusal(user)
    if holder_refusal:
        raise InvalidInput(holder_refusal, code=ErrorCode.TOKEN_HOLDER_NOT_ELIGIBLE, field="user")
    if created_by is not None and created_by.pk != user.pk and not created_by.is_superuser:
        raise NotPermitted(
            f"{created_by.get_username()} may create tokens only for themselves; only a "
            f"superuser creates a token for {user.get_username()}"
        )
    for _ in range(5):
        prefix = secrets.token_hex(4)
        raw = f"{TOKEN_PREFIX}{prefix}_{secrets.token_urlsafe(32)}"
        replaced = None
        try:
            with transaction.atomic():
                if replace:
                    replaced = _revoke_live(user, name)
                token = ApiToken.objects.create(
                    user=user,
                    name=name,
                    prefix=prefix,
                    secret_hash=hash_token(raw),
                    created_by=created_by,
                )
        except IntegrityError:
            if ApiToken.objects.filter(user=user, name=name, revoked_at__isnull=True).exists():
                raise InvalidInput(
                    f"{user.get_username()} already has a live token named {name!r}", field="name"
                ) from None
            continue  # a prefix collision: draw again
        if replaced is not None:
            log.info("api.token_revoked", extra={"token": replaced.prefix, "user": user.pk})
        log.info(
            "api.token_created",
            extra={"token": token.prefix, "user": user.get_username(), "token_name": name},
        )
        return NewToken(token=token, secret=raw, replaced=replaced)
    raise TransitionNotAllowed("could not draw a unique token prefix; try again")


def _revoke_live(user: User, name: str) -> ApiToken | None:
    """Revoke `user`'s live token named `name`, locked first (in the caller's transaction)."""
    live = (
        ApiToken.objects.select_for_update()
        .filter(user=user, name=name, revoked_at__isnull=True)
        .first()
    )
    if live is not None:
        live.revoked_at = timezone.now()
        live.save(update_fields=["revoked_at"])
    return live


def token_find(ref: str) -> ApiToken:
    """A token by its prefix (with or without `acthelm_` and the trailing `_…`), as listed. Only
    by prefix: an all-digit prefix must never match another token's id."""
    text = str(ref).strip().removeprefix(TOKEN_PREFIX).split("_")[0]
    token = ApiToken.objects.select_related("user").filter(prefix=text).first() if text else None
    if token is None:
        raise TokenNotFound(f"no API token {ref!r}")
    return token


def token_revoke(*, token_id: int) -> ApiToken:
    """From now on the token is refused. Revoking twice is refused too (409)."""
    with transaction.atomic():
        token = ApiToken.objects.select_for_update().filter(pk=token_id).first()
        if token is None:
            raise TokenNotFound(f"no API token {token_id}")
        if token.revoked_at is not None:
            raise TransitionNotAllowed(f"token {token.display} was already revoked")
        token.revoked_at = timezone.now()
        token.save(update_fields=["revoked_at"])
    log.info("api.token_revoked", extra={"token": token.prefix, "user": token.user_id})
    return token


def token_authenticate(raw: str) -> ApiToken:
    """The live token for `raw`, its person active; records the use. Raises TokenRefused."""
    raw = (raw or "").strip()
    if not raw.startswith(TOKEN_PREFIX):
        raise TokenRefused("the bearer token is not an Acthelm API token")
    token = ApiToken.objects.select_related("user").filter(secret_hash=hash_token(raw)).first()
    if token is None:
        raise TokenRefused("unknown API token")
    if token.revoked_at is not None:
        raise TokenRefused("this API token was revoked", code=ErrorCode.TOKEN_REVOKED)
    if not token.user.is_active:
        raise TokenRefused("the token's person is inactive", code=ErrorCode.TOKEN_REVOKED)
    if not token.user.is_staff:  # lost staff status: the token stops working with it
        raise TokenRefused(
            "the token's person is not staff", code=ErrorCode.TOKEN_HOLDER_NOT_ALLOWED
        )
    now = timezone.now()
    if token.last_used_at is None or token.last_used_at < now - LAST_USED_PRECISION:
        ApiToken.objects.filter(pk=token.pk).filter(
            Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_PRECISION)
        ).update(last_used_at=now)
        token.last_used_at = now
    return token


class TokenDict(TypedDict):
    id: int
    user: str
    name: str
    prefix: str
    display: str
    created_at: str
    last_used_at: str | None
    revoked_at: str | None


def token_as_dict(token: ApiToken) -> TokenDict:
    return {
        "id": token.pk,
        "user": token.user.get_username(),
        "name": token.name,
        "prefix": token.prefix,
        "display": token.display,
        "created_at": token.created_at.isoformat(),
        "last_used_at": token.last_used_at.isoformat() if token.last_used_at else None,
        "revoked_at": token.revoked_at.isoformat() if token.revoked_at else None,
    }
