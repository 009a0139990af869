"""What the console's pages share: the login and permission decorators, and small parsing and
formatting helpers (the permissions are named by the apps that own them: `tasks.permissions`,
`approvals.permissions`, `agents.permissions`). (A refused action's HTTP status is the
error's own: `ActhelmError.http_status`.)"""

import json
from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django_htmx.http import HttpResponseClientRedirect

from tasks.permissions import VIEW_TASK

OUTCOME_UNKNOWN = (
    "The worker stopped while this operation was in flight; its outcome is unknown. "
    "Run again repeats it (for fetch_url: another GET); Skip tells the model the outcome is "
    "unknown."
)


def login_required(view):
    """Django's login_required, except that an htmx request (a poll, an htmx action) whose
    session has ended sends the whole page to the login page instead of swapping it in."""

    @wraps(view)
    def check(request, *args, **kwargs):
        if request.user.is_authenticated:
            return view(request, *args, **kwargs)
        if request.htmx:
            page = request.htmx.current_url_abs_path or request.get_full_path()
            return HttpResponseClientRedirect(redirect_to_login(page).url)
        return redirect_to_login(request.get_full_path())

    return check


def console_view(perm: str = VIEW_TASK):
    """Login first (anonymous people go to the login page), then the permission (403)."""

    def wrap(view):
        @wraps(view)
        def check(request, *args, **kwargs):
            if not request.user.has_perm(perm):
                raise PermissionDenied
            return view(request, *args, **kwargs)

        return login_required(check)

    return wrap


def positive_int(value) -> int | None:
    """A positive whole number from a query or form value, else None."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return number if number > 0 else None


def pretty_json(value) -> str:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)
