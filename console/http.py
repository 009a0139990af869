"""The requests the console's views receive, as the type checker sees them.

Django's `HttpRequest` knows neither the `htmx` attribute that django-htmx's middleware sets nor
that a view behind `console.shared.login_required` only ever sees a signed-in person. These
classes say so; they are never instantiated (a view receives Django's own request object), so
they hold annotations only. The pattern is django-stubs' and django-htmx's own.
"""

from django.contrib.auth.models import User
from django.http import HttpRequest
from django_htmx.middleware import HtmxDetails


class HtmxHttpRequest(HttpRequest):
    """Any request: `django_htmx.middleware.HtmxMiddleware` (in MIDDLEWARE) sets `htmx`."""

    htmx: HtmxDetails


class AuthenticatedHttpRequest(HtmxHttpRequest):
    """A request of a signed-in person: what a view behind `login_required` or `console_view`
    receives."""

    user: User
