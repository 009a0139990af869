"""What the console's pages share: the login and permission decorators, and small parsing and
formatting helpers (the permissions are named by the apps that own them: `tasks.permissions`,
`approvals.permissions`, `agents.permissions`). (A refused action's HTTP status is the
error's own: `ActhelmError.http_status`.)"""

import contextlib
import json
from collections.abc import Callable
from functools import wraps
from typing import Concatenate, cast

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest
from django.http.response import HttpResponseBase
from django_htmx.http import HttpResponseClientRedirect

from approvals.models import Approval
from console.http import AuthenticatedHttpRequest, HtmxHttpRequest
from console.preview import proposed_file
from tasks.permissions import VIEW_TASK

OUTCOME_UNKNOWN = (
    "The worker stopped while this operation was in flight; its outcome is unknown. "
    "Run again repeats it (for fetch_url: another GET); Skip tells the model the outcome is "
    "unknown."
)


# A view behind the decorators below: it receives a signed-in person's request ...
type PersonView[**P] = Callable[Concatenate[AuthenticatedHttpRequest, P], HttpResponseBase]
# ... and what the URLconf calls instead: any request, the same URL arguments.
type AnyRequestView[**P] = Callable[Concatenate[HttpRequest, P], HttpResponseBase]


def login_required[**P](view: PersonView[P]) -> AnyRequestView[P]:
    """Django's login_required, except that an htmx request (a poll, an htmx action) whose
    session has ended sends the whole page to the login page instead of swapping it in."""

    @wraps(view)
    def check(request: HttpRequest, /, *args: P.args, **kwargs: P.kwargs) -> HttpResponseBase:
        # Every request carries `htmx` (django-htmx's middleware); past the check below, a
        # signed-in person.
        request = cast(HtmxHttpRequest, request)
        if request.user.is_authenticated:
            return view(cast(AuthenticatedHttpRequest, request), *args, **kwargs)
        if request.htmx:
            page = request.htmx.current_url_abs_path or request.get_full_path()
            return HttpResponseClientRedirect(redirect_to_login(page).url)
        return redirect_to_login(request.get_full_path())

    return check


def console_view[**P](
    perm: str = VIEW_TASK,
) -> Callable[[PersonView[P]], AnyRequestView[P]]:
    """Login first (anonymous people go to the login page), then the permission (403)."""

    def wrap(view: PersonView[P]) -> AnyRequestView[P]:
        @wraps(view)
        def check(
            request: AuthenticatedHttpRequest, /, *args: P.args, **kwargs: P.kwargs
        ) -> HttpResponseBase:
            if not request.user.has_perm(perm):
                raise PermissionDenied
            return view(request, *args, **kwargs)

        return login_required(check)

    return wrap


def positive_int(value: str | None) -> int | None:
    """A positive whole number from a query or form value, else None."""
    if value is None:
        return None
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def pretty_json(value: object) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def show(row: object, **values: object) -> None:
    """Attach to a row what its template shows beside its own fields (a preview, a number, a
    flag the page computed). No model declares these attributes: they are set here, by name."""
    for name, value in values.items():
        setattr(row, name, value)


# The approve-with-edits form: each top-level string argument (a file's content, a path) is its
# own text field named ARGUMENT_FIELD + its name; the rest stays JSON in `arguments`.
ARGUMENT_FIELD = "argument."
TEXT_ARGUMENT_CHARS = 2_000_000  # a field the form offers as text; past this, JSON as before


def edit_fields(arguments: object) -> tuple[list[tuple[str, str]], str]:
    """The approve-with-edits form's starting values: (name, text) for each string argument,
    and the other arguments as JSON ("" when there are none)."""
    if not isinstance(arguments, dict):
        return [], json.dumps(arguments, indent=2, ensure_ascii=False)
    texts = [
        (str(k), v)
        for k, v in arguments.items()
        if isinstance(v, str) and len(v) <= TEXT_ARGUMENT_CHARS
    ]
    named = {name for name, _ in texts}
    rest = {k: v for k, v in arguments.items() if k not in named}
    return texts, json.dumps(rest, indent=2, ensure_ascii=False) if rest else ""


def edited_arguments(posted_json: str | None, texts: dict[str, str]) -> str | None:
    """The arguments a person approves, as the JSON text `approval_approve` takes: the JSON
    field's object with each text field set (as typed; a browser's CRLF line ends back to
    LF). JSON that is not an object is passed on as it is, for the service to refuse."""
    if not texts:
        return posted_json
    try:
        rest = json.loads(posted_json) if posted_json and posted_json.strip() else {}
    except ValueError:
        return posted_json
    if not isinstance(rest, dict):
        return posted_json
    for name, text in texts.items():
        rest[name] = text.replace("\r\n", "\n")
    return json.dumps(rest, ensure_ascii=False)


def show_approval(approval: Approval, *, edited: str | None = None, as_text: bool = False) -> None:
    """What a pending approval's card shows beside its fields: the arguments to read, the edit
    form's starting values (the proposal, or what the person posted when it was refused: in
    text fields when they posted text fields, else their JSON exactly as typed), and the file a
    write would leave."""
    texts, rest = edit_fields(approval.arguments)
    if edited is not None:
        texts, rest = [], edited
        if as_text:
            with contextlib.suppress(ValueError):  # not JSON: shown as typed
                texts, rest = edit_fields(json.loads(edited))
    show(
        approval,
        arguments_pretty=pretty_json(approval.arguments),
        arguments_edit=rest,
        argument_texts=texts,
        proposed_file=proposed_file(approval.tool, approval.arguments),
        edit_open=edited is not None,
    )
