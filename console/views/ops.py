"""Operations endpoints: /healthz, /metrics (Prometheus text) and the console's worker page.

Everything here reads PostgreSQL, the one source of truth shared by every worker process on every
host: any web instance reports the whole installation. The queries are aggregates that PostgreSQL
answers from the tables' indexes (tasks by status; held tasks, which are few, through the status
index too, since the lease has no index: the heartbeat rewrites it; started runs through their
partial index); no row is looped over in Python.
"""

import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal

from django.conf import settings
from django.contrib.postgres.aggregates import ArrayAgg
from django.db import Error as DatabaseError
from django.db import connection
from django.db.models import Case, Count, IntegerField, Max, Min, Q, Sum, Value, When
from django.db.models.functions import Now
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_GET

from agents.models import AgentRun, Connection, WorkerSeen
from agents.permissions import VIEW_AGENTRUN
from agents.states import RunStatus
from console.http import AuthenticatedHttpRequest
from console.shared import console_view
from tasks.models import Task, TaskEvent
from tasks.states import HELD, EventKind, TaskStatus

log = logging.getLogger("acthelm.ops")

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


# --- /healthz -----------------------------------------------------------------------------------


@never_cache
@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    """200 when PostgreSQL answers `SELECT 1`, 503 otherwise. No login: probes call it."""
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            cursor.fetchone()
    except DatabaseError as exc:
        log.warning("healthz.database_unreachable", extra={"error": exc.__class__.__name__})
        return JsonResponse({"status": "error", "database": "unreachable"}, status=503)
    return JsonResponse({"status": "ok", "database": "ok"})


# --- /metrics -----------------------------------------------------------------------------------


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


# What a sample's value may be: a count, a sum of seconds or tokens (None: no row was summed).
type SampleValue = int | float | Decimal | None


def _number(value: SampleValue) -> str:
    if value is None:
        return "0"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    return repr(float(value))


class Exposition:
    """Prometheus text exposition format 0.0.4: HELP and TYPE once per family, then samples."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str) -> None:
        help_text = help_text.replace("\\", "\\\\").replace("\n", "\\n")
        self.lines.append(f"# HELP {name} {help_text}")
        self.lines.append(f"# TYPE {name} {kind}")

    def sample(self, name: str, value: SampleValue, **labels: str) -> None:
        if labels:
            inner = ",".join(f'{k}="{_escape_label(str(v))}"' for k, v in labels.items())
            name = f"{name}{{{inner}}}"
        self.lines.append(f"{name} {_number(value)}")

    def render(self) -> str:
        return "\n".join(self.lines) + "\n"


# Timeline events counted as counters: (metric, help, kinds, label for the kind or None).
_EVENT_COUNTERS = (
    ("acthelm_claims_total", "Claims of a ready task by a worker.", [EventKind.CLAIMED], None),
    (
        "acthelm_recoveries_total",
        "Stale-run recoveries: runs found lost and tasks requeued.",
        [EventKind.LOST, EventKind.REQUEUED],
        "kind",
    ),
    (
        "acthelm_retries_total",
        "Retries scheduled after a failed attempt.",
        [EventKind.RETRY_SCHEDULED],
        None,
    ),
    (
        "acthelm_handed_back_total",
        "Tasks handed back to ready by a stopping worker (SIGTERM).",
        [EventKind.HANDED_BACK],
        None,
    ),
    (
        "acthelm_provider_cooldowns_total",
        "Quota, rate-limit or authentication errors that cooled a connection down.",
        [EventKind.PROVIDER_COOLDOWN],
        None,
    ),
    ("acthelm_task_failures_total", "Tasks that failed.", [EventKind.FAILED], None),
)


# The sums `metrics_text` takes of each model's runs.
type _ModelSum = Literal["runs", "turn_count", "active", "input_tokens", "output_tokens"]


def metrics_text() -> str:
    """The whole installation's metrics, from a handful of aggregate queries."""
    out = Exposition()

    by_state = dict(
        Task.objects.order_by().values("status").annotate(n=Count("id")).values_list("status", "n")
    )
    out.family("acthelm_tasks", "gauge", "Tasks in each state.")
    for state in TaskStatus.values:
        out.sample("acthelm_tasks", by_state.get(state, 0), state=state)

    held = Task.objects.filter(status__in=HELD).aggregate(
        live_workers=Count("lease_owner", distinct=True, filter=Q(lease_expires_at__gte=Now())),
        expired=Count("id", filter=Q(lease_expires_at__lt=Now())),
    )
    out.family(
        "acthelm_workers_live", "gauge", "Distinct workers holding a task whose lease is current."
    )
    out.sample("acthelm_workers_live", held["live_workers"])
    out.family(
        "acthelm_leases_expired",
        "gauge",
        "Held tasks whose lease expired (their worker is gone; recovery requeues them).",
    )
    out.sample("acthelm_leases_expired", held["expired"])

    started = AgentRun.objects.filter(status=RunStatus.STARTED).count()
    out.family("acthelm_runs_started", "gauge", "Runs in progress.")
    out.sample("acthelm_runs_started", started)

    kinds = [kind for _, _, group, _ in _EVENT_COUNTERS for kind in group]
    event_counts = dict(
        TaskEvent.objects.order_by()
        .filter(kind__in=kinds)
        .values("kind")
        .annotate(n=Count("id"))
        .values_list("kind", "n")
    )
    for name, help_text, group, label in _EVENT_COUNTERS:
        out.family(
            name, "counter", help_text + " Counted from the task timeline (all worker processes)."
        )
        if label:
            for kind in group:
                out.sample(name, event_counts.get(kind, 0), **{label: kind})
        else:
            out.sample(name, sum(event_counts.get(kind, 0) for kind in group))

    cooling = Connection.objects.order_by("name").annotate(
        cooling=Case(
            When(cooldown_until__gt=Now(), then=Value(1)),
            default=Value(0),
            output_field=IntegerField(),
        )
    )
    rows = list(cooling.values_list("name", "cooling"))
    out.family("acthelm_providers_cooling_down", "gauge", "Connections currently cooling down.")
    out.sample("acthelm_providers_cooling_down", sum(c for _, c in rows))
    out.family(
        "acthelm_provider_cooling_down",
        "gauge",
        "1 while the connection cools down after a quota, rate-limit or authentication error.",
    )
    for name, value in rows:
        out.sample("acthelm_provider_cooling_down", value, connection=name)

    by_model = (
        AgentRun.objects.order_by()
        .values("model__connection__name", "model__name")
        .annotate(
            runs=Count("id"),
            turn_count=Sum("model_turns"),
            active=Sum("active_seconds"),
            input_tokens=Sum("input_tokens"),
            output_tokens=Sum("output_tokens"),
        )
    )
    per_model = sorted(
        by_model, key=lambda r: (r["model__connection__name"] or "", r["model__name"] or "")
    )
    families = (
        ("acthelm_model_runs_total", "counter", "Runs per model."),
        (
            "acthelm_model_turn_seconds",
            "summary",
            "Active run seconds per model turn: _sum is the runs' active seconds (model calls and"
            " the tool calls between them), _count their model turns.",
        ),
        ("acthelm_model_input_tokens_total", "counter", "Input tokens per model, as reported."),
        ("acthelm_model_output_tokens_total", "counter", "Output tokens per model, as reported."),
    )
    # The sums of a model's runs that each family samples.
    samples: dict[str, list[tuple[str, _ModelSum]]] = {
        "acthelm_model_runs_total": [("acthelm_model_runs_total", "runs")],
        "acthelm_model_turn_seconds": [
            ("acthelm_model_turn_seconds_sum", "active"),
            ("acthelm_model_turn_seconds_count", "turn_count"),
        ],
        "acthelm_model_input_tokens_total": [("acthelm_model_input_tokens_total", "input_tokens")],
        "acthelm_model_output_tokens_total": [
            ("acthelm_model_output_tokens_total", "output_tokens")
        ],
    }
    for family, metric_type, help_text in families:
        out.family(family, metric_type, help_text)
        for row in per_model:
            labels = {
                "connection": row["model__connection__name"] or "",
                "model": row["model__name"] or "",
            }
            for sample_name, field in samples[family]:
                value = row[field] or 0
                out.sample(sample_name, float(value) if field == "active" else value, **labels)

    return out.render()


def _bearer_token_matches(request: HttpRequest, token: str) -> bool:
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return False
    return hmac.compare_digest(given.strip().encode(), token.encode())


@never_cache
@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    """Prometheus text, for a request with `Authorization: Bearer <ACTHELM_METRICS_TOKEN>`.

    404 while the token setting is empty (the endpoint is off), 403 for a missing or wrong token.
    """
    token = settings.ACTHELM_METRICS_TOKEN
    if not token:
        raise Http404("metrics are off: set ACTHELM_METRICS_TOKEN")
    if not _bearer_token_matches(request, token):
        log.warning("metrics.forbidden", extra={"remote_addr": request.META.get("REMOTE_ADDR")})
        return HttpResponse("forbidden\n", status=403, content_type="text/plain")
    return HttpResponse(metrics_text(), content_type=PROMETHEUS_CONTENT_TYPE)


# --- /workers/ ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class WorkerRow:
    worker_id: str
    host: str
    tasks_held: int
    task_ids: list[int]
    stale_tasks: int
    lease_expires_at: datetime | None
    runs_started: int
    last_heartbeat: datetime | None
    last_seen: datetime | None = None  # WorkerSeen: its maintenance loop's last pass
    started: datetime | None = None
    pid: int | None = None
    gone: bool = False  # not seen for WORKER_GONE_SECONDS and holding nothing

    @property
    def stale(self) -> bool:
        """A worker whose lease on some task ran out: it stopped renewing (dead or cut off)."""
        return self.stale_tasks > 0

    @property
    def busy(self) -> bool:
        return bool(self.tasks_held or self.runs_started)

    @property
    def idle(self) -> bool:
        return not self.busy and not self.gone


def worker_host(worker_id: str) -> str:
    """Worker ids look like "host:pid:n"; the host is the part before the first colon."""
    host, sep, _ = worker_id.partition(":")
    return host if sep else ""


# A worker process records itself every few seconds (agents.engine.runtime.seen); one not seen for
# this long is shown as gone, and one not seen for a day is not listed.
WORKER_GONE_SECONDS = 60
WORKER_FORGOTTEN = timedelta(days=1)


def live_workers() -> list[WorkerRow]:
    """Workers as the leases and started runs show them, and the processes that recorded
    themselves (`WorkerSeen`): an idle worker holds no lease but is seen."""
    leases = {
        row["lease_owner"]: row
        for row in Task.objects.order_by()
        .filter(status__in=HELD)
        .values("lease_owner")
        .annotate(
            tasks_held=Count("id"),
            stale_tasks=Count("id", filter=Q(lease_expires_at__lt=Now())),
            task_ids=ArrayAgg("id", order_by="id"),
            lease_latest=Max("lease_expires_at"),  # before the name below shadows the field
            lease_expires_at=Min("lease_expires_at"),
        )
    }
    runs = {
        row["worker_id"]: row
        for row in AgentRun.objects.order_by()
        .filter(status=RunStatus.STARTED)
        .values("worker_id")
        .annotate(
            runs_started=Count("id"),
            last_heartbeat=Max("heartbeat_at"),
            newest_start=Max("started_at"),
        )
    }
    now = timezone.now()
    seen = {
        row.worker_id: row
        for row in WorkerSeen.objects.filter(last_seen__gte=now - WORKER_FORGOTTEN).order_by()
    }
    gone_before = now - timedelta(seconds=WORKER_GONE_SECONDS)
    rows = []
    for worker_id in sorted(set(leases) | set(runs) | set(seen)):
        lease: Mapping[str, Any] = leases.get(worker_id, {})
        run: Mapping[str, Any] = runs.get(worker_id, {})
        me = seen.get(worker_id)
        rows.append(
            WorkerRow(
                worker_id=worker_id,
                host=(me.host if me and me.host else worker_host(worker_id)),
                tasks_held=lease.get("tasks_held", 0),
                task_ids=lease.get("task_ids") or [],
                stale_tasks=lease.get("stale_tasks", 0),
                lease_expires_at=lease.get("lease_expires_at"),
                runs_started=run.get("runs_started", 0),
                last_heartbeat=_last_heartbeat(lease, run),
                last_seen=me.last_seen if me else None,
                started=me.started if me else None,
                pid=me.pid if me else None,
                gone=bool(me and not lease and not run and me.last_seen < gone_before),
            )
        )
    return sorted(rows, key=lambda r: (not r.stale, r.gone, r.host, r.worker_id))


def _last_heartbeat(lease: Mapping[str, Any], run: Mapping[str, Any]) -> datetime | None:
    """Every heartbeat (and every step a worker records) renews the lease, and only the lease:
    its newest renewal is the worker's last sign of life — unless it is still the lease its
    newest claim set (no heartbeat yet). Runs of older versions carry `heartbeat_at`."""
    seen = [run.get("last_heartbeat")]
    if lease.get("lease_latest"):
        renewed = lease["lease_latest"] - timedelta(seconds=settings.ACTHELM_LEASE_SECONDS)
        if run.get("newest_start") is None or renewed > run["newest_start"]:
            seen.append(renewed)
    known = [t for t in seen if t is not None]
    return max(known) if known else None


# Who may see the worker page (every worker, the tasks it holds, its runs' heartbeats): who may
# see the runs, the permission of the console's other operational pages (the scorecard and the
# evaluation page). Staff status alone shows nothing here.
WORKERS_PERM = VIEW_AGENTRUN


@console_view(WORKERS_PERM)
@require_GET
def workers(request: AuthenticatedHttpRequest) -> HttpResponse:
    rows = live_workers()
    context = {
        "workers": rows,
        "stale_count": sum(1 for r in rows if r.stale),
        "busy_count": sum(1 for r in rows if r.busy),
        "idle_count": sum(1 for r in rows if r.idle),
        "gone_count": sum(1 for r in rows if r.gone),
        "gone_seconds": WORKER_GONE_SECONDS,
        "lease_seconds": settings.ACTHELM_LEASE_SECONDS,
        "heartbeat_seconds": settings.ACTHELM_HEARTBEAT_SECONDS,
    }
    template = "console/workers.html"
    if getattr(request, "htmx", False):
        template += "#workers"
    return render(request, template, context)


FAVICON = Path(__file__).resolve().parents[1] / "static" / "console" / "favicon.ico"


@require_GET
def favicon(request: HttpRequest) -> HttpResponse:
    """/favicon.ico, which browsers ask for whatever the page's <link rel="icon"> says: the
    console's icon, cached for a day, for anyone (it tells nothing)."""
    response = HttpResponse(FAVICON.read_bytes(), content_type="image/x-icon")
    response["Cache-Control"] = "public, max-age=86400"
    return response
