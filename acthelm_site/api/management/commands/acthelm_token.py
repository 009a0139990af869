"""acthelm_token create|list|revoke — per-person API tokens. The token is printed once, at
creation; only its SHA-256 is stored."""

from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth import models as auth_models
from django.core.management.base import CommandError

from acthelm_site.api import tokens
from acthelm_site.api.models import ApiToken
from console.cli import ActionCommand, Actions, emit


class Command(ActionCommand):
    help = "Create, list and revoke API tokens (Authorization: Bearer <token> at /api/)."

    def add_actions(self, sub: Actions) -> None:
        create = sub.add_parser("create", help="create a token for a person (printed once)")
        create.add_argument("--user", required=True, help="the person the token acts as")
        create.add_argument("--name", required=True, help="what the token is for")
        create.add_argument(
            "--replace",
            action="store_true",
            help="revoke the person's live token of this name first (a token is shown only "
            "once: running again issues a new one, and the old one stops working)",
        )
        lst = sub.add_parser("list", help="list tokens (never the tokens themselves)")
        lst.add_argument("--user", help="only this person's tokens")
        lst.add_argument("--all", action="store_true", help="include revoked tokens")
        revoke = sub.add_parser("revoke", help="refuse a token from now on")
        revoke.add_argument("token", help="its prefix, e.g. acthelm_1a2b3c4d_… (as listed)")

    def _user(self, username: str) -> auth_models.User:
        User = get_user_model()
        try:
            return User.objects.get(username=username)
        except User.DoesNotExist:
            raise CommandError(f"no user named {username!r}") from None

    def do_create(self, opts: dict[str, Any]) -> None:
        as_json = opts["json"]
        new = tokens.token_create(
            user=self._user(opts["user"]), name=opts["name"], replace=opts["replace"]
        )
        replaced = new.replaced.display if new.replaced else None
        data = tokens.token_as_dict(new.token) | {"token": new.secret, "replaced": replaced}
        text = (
            (f"token {replaced} ({new.token.name}) revoked\n" if replaced else "")
            + f"API token {new.token.name!r} for {new.token.user.get_username()} "
            f"(shown only now; store it safely):\n{new.secret}"
        )
        emit(self, data, as_json=as_json, text=text)

    def do_list(self, opts: dict[str, Any]) -> None:
        as_json = opts["json"]
        qs = ApiToken.objects.select_related("user").order_by("-id")
        if opts["user"]:
            qs = qs.filter(user=self._user(opts["user"]))
        if not opts["all"]:
            qs = qs.filter(revoked_at__isnull=True)
        rows = [tokens.token_as_dict(t) for t in qs]
        text = "\n".join(
            f"{r['id']:<5} {r['display']:<22} {r['user']:<16} {r['name']:<20} "
            f"last used {r['last_used_at'] or 'never'}"
            + (f"  revoked {r['revoked_at']}" if r["revoked_at"] else "")
            for r in rows
        )
        emit(self, rows, as_json=as_json, text=text or "no tokens")

    def do_revoke(self, opts: dict[str, Any]) -> None:
        as_json = opts["json"]
        token = tokens.token_revoke(token_id=tokens.token_find(opts["token"]).pk)
        emit(
            self,
            tokens.token_as_dict(token),
            as_json=as_json,
            text=f"token {token.display} ({token.name}) revoked",
        )
