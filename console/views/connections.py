"""The console's connections page: connections with their health, models with their tests.

Adding and testing call agents.catalogue.connections (which check agents.manage_connections). A
credential is
only ever shown by the name of its environment variable.
"""

import json
import logging
import shlex
from datetime import datetime
from typing import TypedDict
from urllib.parse import urlsplit, urlunsplit

from django import forms
from django.contrib import messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.urls import reverse
from django.utils import timezone
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from agents.catalogue import connection_tests as tests
from agents.catalogue import connections as catalogue
from agents.catalogue.connection_rules import MAX_TIMEOUT_SECONDS, connection_kind_choices
from agents.catalogue.connections import ModelSpec
from agents.catalogue.providers import get_provider_class
from agents.models import Connection, ConnectionTest, Model
from agents.permissions import MANAGE_CONNECTIONS, VIEW_CONNECTIONS_PERMS
from agents.states import ConnectionTestPhase, CostTier
from console.http import AuthenticatedHttpRequest
from console.shared import login_required, show
from core.actors import Actor
from core.exceptions import ActhelmError, InvalidInput, NotPermitted
from core.numbers import INT32_MAX, INT32_MIN, whole_number

log = logging.getLogger("acthelm.console")

# How often the page asks for a running test's progress.
TEST_POLL_MS = 500


class ConnectionFields(TypedDict):
    """What `ConnectionForm` passes to `agents.catalogue.connections.connection_add`."""

    name: str
    kind: str
    base_url: str
    command: list[str]
    answer_field: str
    credential_env: str
    cost_tier: str
    priority: int
    timeout_seconds: float
    models: list[ModelSpec]


class ConnectionForm(forms.Form):
    name = forms.SlugField(max_length=100)
    kind = forms.ChoiceField(choices=connection_kind_choices)
    base_url = forms.URLField(required=False, max_length=500, assume_scheme="https")
    command = forms.CharField(
        required=False,
        help_text='For a model CLI: a JSON list (["llm", "-m", "x"]) or a shell-like line.',
    )
    answer_field = forms.CharField(required=False, max_length=200)
    credential_env = forms.CharField(
        required=False,
        max_length=100,
        label="Credential variable",
        help_text="The NAME of the environment variable that holds the key, never the key.",
    )
    cost_tier = forms.ChoiceField(choices=CostTier.choices, initial=CostTier.ZERO_COST)
    priority = forms.IntegerField(initial=0, min_value=INT32_MIN, max_value=INT32_MAX)
    timeout_seconds = forms.FloatField(initial=120, min_value=1, max_value=MAX_TIMEOUT_SECONDS)
    models = forms.CharField(
        widget=forms.Textarea(attrs={"rows": 3}),
        help_text="One model per line: name, optionally followed by its context window.",
    )
    no_tools = forms.BooleanField(required=False, label="These models cannot call tools")

    def clean_command(self) -> list[str]:
        raw = self.cleaned_data.get("command", "").strip()
        if not raw:
            return []
        if raw.startswith("["):
            try:
                value = json.loads(raw)
            except ValueError as exc:
                raise forms.ValidationError(f"not a JSON list: {exc}") from None
            if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
                raise forms.ValidationError("the command must be a list of strings")
            return value
        try:
            return shlex.split(raw)
        except ValueError as exc:
            raise forms.ValidationError(str(exc)) from None

    def clean_models(self) -> list[ModelSpec]:
        specs = []
        for line in self.cleaned_data.get("models", "").splitlines():
            parts = line.split()
            if not parts:
                continue
            spec: ModelSpec = {"name": parts[0]}
            if len(parts) > 1:
                try:
                    spec["context_window"] = whole_number(
                        parts[1].replace("_", "").replace(",", ""),
                        name="a context window",
                        minimum=1,
                        maximum=INT32_MAX,
                    )
                except InvalidInput as exc:
                    raise forms.ValidationError(
                        f"{parts[1]!r} is not a context window (a number of tokens): {exc}"
                    ) from None
            specs.append(spec)
        if not specs:
            raise forms.ValidationError("name at least one model")
        return specs

    def service_kwargs(self) -> ConnectionFields:
        data = self.cleaned_data
        tools = not data["no_tools"] and get_provider_class(data["kind"]).supports_tools
        return {
            "name": data["name"],
            "kind": data["kind"],
            "base_url": data.get("base_url") or "",
            "command": data["command"],
            "answer_field": data.get("answer_field") or "",
            "credential_env": (data.get("credential_env") or "").strip(),
            "cost_tier": data["cost_tier"],
            "priority": data.get("priority") or 0,
            "timeout_seconds": data.get("timeout_seconds") or 120,
            "models": [spec | {"supports_tools": tools} for spec in data["models"]],
        }


def display_url(url: str) -> str:
    """A base URL without any user:password part."""
    if not url:
        return ""
    parts = urlsplit(url)
    if "@" in parts.netloc:
        parts = parts._replace(netloc="…@" + parts.netloc.rsplit("@", 1)[1])
    return urlunsplit(parts._replace(query="", fragment=""))


def _render(
    request: AuthenticatedHttpRequest,
    *,
    form: ConnectionForm | None = None,
    error: ActhelmError | None = None,
    status: int = 200,
) -> HttpResponse:
    now = timezone.now()
    connections = list(Connection.objects.prefetch_related("models").order_by("-priority", "name"))
    newest_tests = {
        t.connection_id: t
        for t in ConnectionTest.objects.filter(connection__in=connections)
        .order_by("connection_id", "-id")
        .distinct("connection_id")
    }
    for test in newest_tests.values():
        _show_test(test, now)
    for conn in connections:
        show(
            conn,
            cooling=bool(conn.cooldown_until and conn.cooldown_until > now),
            url_shown=display_url(conn.base_url),
            # The executable only: arguments could carry something secret by mistake.
            program=conn.command[0] if conn.command else "",
            extra_args=max(0, len(conn.command) - 1),
            test=newest_tests.get(conn.pk),
        )
    can_manage = request.user.has_perm(MANAGE_CONNECTIONS)
    context = {
        "poll_ms": TEST_POLL_MS,
        "connections": connections,
        "can_manage": can_manage,
        "form": form if form is not None else (ConnectionForm() if can_manage else None),
        "error": error,
    }
    return render(request, "console/connections.html", context, status=status)


@require_GET
@login_required
def connections(request: AuthenticatedHttpRequest) -> HttpResponse:
    if not any(request.user.has_perm(perm) for perm in VIEW_CONNECTIONS_PERMS):
        raise PermissionDenied
    return _render(request)


@require_POST
@login_required
def connection_add(request: AuthenticatedHttpRequest) -> HttpResponse:
    if not request.user.has_perm(MANAGE_CONNECTIONS):
        raise PermissionDenied
    form = ConnectionForm(request.POST)
    if not form.is_valid():
        return _render(request, form=form, status=400)
    try:
        conn = catalogue.connection_add(actor=Actor.person(request.user), **form.service_kwargs())
    except NotPermitted:
        raise PermissionDenied from None
    except ActhelmError as exc:
        form.add_error(None, f"{exc.message} [{exc.code}]")
        return _render(request, form=form, status=exc.http_status)
    log.info("console.connection_added", extra={"connection": conn.name})
    messages.success(request, f"Connection {conn.name} added. Test it before tasks use it.")
    return redirect("agents:connections")


@require_POST
@login_required
def connection_test(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    """Start the connection's test in the background (agents.catalogue.connection_tests): the
    page shows its progress and stays usable; a second click while it runs starts nothing."""
    if not request.user.has_perm(MANAGE_CONNECTIONS):
        raise PermissionDenied
    conn = get_object_or_404(Connection, pk=pk)
    try:
        test, started = tests.connection_test_start(
            actor=Actor.person(request.user), connection_id=conn.pk
        )
    except NotPermitted:
        raise PermissionDenied from None
    except ActhelmError as exc:
        return _render(request, error=exc, status=exc.http_status)
    log.info("console.connection_test", extra={"connection": conn.name, "started": started})
    if request.htmx:
        return _test_progress(request, conn, test)
    return redirect(reverse("agents:connections") + f"#conn-{conn.pk}")


def _show_test(test: ConnectionTest, now: datetime) -> None:
    """What the page says of a test: its phase (timed out once past its deadline), whether it
    still runs, and how long its phase has lasted."""
    shown = tests.shown_phase(test, now)
    show(
        test,
        shown=shown,
        running=shown in (ConnectionTestPhase.CONNECTING, ConnectionTestPhase.WAITING),
        waited=max(0, round((now - test.phase_at).total_seconds())),
    )


def _test_progress(
    request: AuthenticatedHttpRequest, conn: Connection, test: ConnectionTest | None
) -> HttpResponse:
    if test is not None:
        _show_test(test, timezone.now())
    context = {"conn": conn, "test": test, "poll_ms": TEST_POLL_MS}
    return render(request, "console/_connection_test.html", context)


@require_GET
@login_required
def connection_test_progress(request: AuthenticatedHttpRequest, pk: int) -> HttpResponse:
    """The newest test of a connection: its phase while it runs (polled), its results after."""
    if not any(request.user.has_perm(perm) for perm in VIEW_CONNECTIONS_PERMS):
        raise PermissionDenied
    conn = get_object_or_404(Connection, pk=pk)
    return _test_progress(request, conn, tests.latest_test(conn.pk))


# --- Model prices ---------------------------------------------------------------------------


def _price_rows() -> list[dict[str, object]]:
    models = Model.objects.select_related("connection").order_by("connection__name", "name")
    return [
        {
            "model": m,
            "prices": [
                (field, label, getattr(m, field))
                for field, label in zip(
                    catalogue.PRICE_FIELDS,
                    ("input", "output", "cached input", "cache write"),
                    strict=True,
                )
            ],
        }
        for m in models
    ]


@require_http_methods(["GET", "POST"])
@login_required
def model_prices(request: AuthenticatedHttpRequest) -> HttpResponse:
    """Each model's prices in US dollars per million tokens; a person with the permission sets
    them (agents.catalogue.connections.model_set_prices)."""
    if not any(request.user.has_perm(perm) for perm in VIEW_CONNECTIONS_PERMS):
        raise PermissionDenied
    error, status = None, 200
    if request.method == "POST":
        if not request.user.has_perm(MANAGE_CONNECTIONS):
            raise PermissionDenied
        model_id = request.POST.get("model", "")
        try:
            model = catalogue.model_set_prices(
                actor=Actor.person(request.user),
                model_id=int(model_id) if model_id.isdigit() else 0,
                prices={f: request.POST.get(f, "") for f in catalogue.PRICE_FIELDS},
            )
        except NotPermitted:
            raise PermissionDenied from None
        except ActhelmError as exc:
            error, status = exc, exc.http_status
        else:
            log.info("console.model_prices_set", extra={"model": str(model)})
            messages.success(request, f"Prices of {model} saved (USD per million tokens).")
            return redirect(reverse("agents:model_prices") + f"#model-{model.pk}")
    context = {
        "rows": _price_rows(),
        "can_manage": request.user.has_perm(MANAGE_CONNECTIONS),
        "error": error,
    }
    return render(request, "console/model_prices.html", context, status=status)
