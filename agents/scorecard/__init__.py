"""The model scorecard: how each connection/model did over a period. Selectors only (reads).

Everything is aggregated in PostgreSQL: one grouped query over the runs started in the window,
one over the closing/reopening events recorded in it, then a little arithmetic per model.

What each number means:

- runs, tasks run: the attempts started in the window, and the distinct tasks they worked on.
- approvals, rejections: the supervisor's verdicts on those runs.
- closed by a person, reopened, closed by policy: `closed`, `reopened` and `auto_closed` events
  recorded in the window, each credited to the model of the task's newest run started before it.
- approved then closed / reopened: those closes (by a person or the policy) and reopens whose
  judged run (that same newest run) the supervisor had approved — how often "approved" held up
  with a person; unverified then closed / reopened likewise for runs no model supervisor checked.
- limit failures: runs that ended with a `limit_*` error, or that are their task's newest run while
  the task failed with a `limit_*` code; loops likewise with `error_loop`.
- average turns: model turns per finished run.
- evaluation tasks (`Task.is_evaluation`, created by `acthelm_eval run`) count nowhere here.
- cost: the sum of the stored cost of every model turn of the window's runs (the provider's
  reported cost, else the turn's tokens at the model's prices, cached input at its own price);
  for runs whose turns carry no cost (recorded before costs were stored), input and output
  tokens times the model's price per million tokens; None when neither is known (unknown is
  not free, but an unpriced turn on a zero-cost connection costs $0). When only some turns'
  costs are known, the cost is their sum, marked partial (`cost_partial`); so are the totals
  when a model's cost is partial or unknown. Cost per closed task divides the cost
  of the window's runs by the tasks closed in it (by a person or the policy). All in US dollars.
- cost over time (`cost_series`): the window's model-turn costs per hour (a window of a day),
  per day, or per week (windows longer than 92 days), each bucket partial when a turn in it has
  no known cost.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import date, datetime, time, timedelta
from decimal import Decimal
from typing import Any

from django.db.models import Count, Exists, OuterRef, Q, QuerySet, Subquery, Sum
from django.db.models.expressions import Combinable, NegatedExpression
from django.db.models.functions import Coalesce, Trunc
from django.utils import timezone

from agents.models import AgentRun, Model, Turn
from agents.states import CostTier, FailureCode, Role, RunStatus, Verdict
from core.exceptions import InvalidInput
from tasks.models import TaskEvent
from tasks.states import EventKind

PERIODS: dict[str, timedelta] = {
    "day": timedelta(days=1),
    "week": timedelta(days=7),
    "month": timedelta(days=30),
}
DEFAULT_PERIOD = "week"
MILLION = Decimal(1_000_000)
COST_PLACES = Decimal("0.000001")
CURRENCY = "USD"


@dataclass(frozen=True)
class Window:
    since: datetime
    until: datetime
    label: str


def scorecard_window(
    *,
    period: str | None = None,
    since: date | datetime | str | None = None,
    now: datetime | None = None,
) -> Window:
    """The last day/week/month up to now, or from `since` (a date or ISO date string) to now."""
    now = now or timezone.now()
    if since not in (None, ""):
        if isinstance(since, str):
            try:
                since = date.fromisoformat(since.strip())
            except ValueError:
                raise InvalidInput(f"since must be a date like 2025-01-31, not {since!r}") from None
        if not isinstance(since, datetime):
            since = datetime.combine(since, time.min, tzinfo=timezone.get_current_timezone())
        elif timezone.is_naive(since):
            since = timezone.make_aware(since)
        if since > now:
            raise InvalidInput("since lies in the future")
        return Window(since=since, until=now, label=f"since {since.date().isoformat()}")
    period = period or DEFAULT_PERIOD
    if period not in PERIODS:
        raise InvalidInput(f"period must be one of {', '.join(PERIODS)}, not {period!r}")
    return Window(since=now - PERIODS[period], until=now, label=f"last {period}")


@dataclass
class ModelScore:
    model_id: int | None
    connection: str
    model: str
    runs: int = 0
    tasks_run: int = 0
    finished_runs: int = 0
    failed_runs: int = 0
    approvals: int = 0
    rejections: int = 0
    closed_by_person: int = 0
    closed_by_policy: int = 0
    reopened: int = 0
    approved_closed: int = 0
    approved_reopened: int = 0
    unverified_closed: int = 0
    unverified_reopened: int = 0
    limit_failures: int = 0
    loops: int = 0
    model_turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    price_input_per_mtok: Decimal | None = None
    price_output_per_mtok: Decimal | None = None
    cost: Decimal | None = None
    # The cost is a sum over known costs only: some model turns' costs are unknown.
    cost_partial: bool = False
    # The stored turn costs of the runs, and how many model turns have none.
    stored_cost: Decimal | None = None
    unpriced_turns: int = 0

    @property
    def label(self) -> str:
        return f"{self.connection}/{self.model}"

    @property
    def closed(self) -> int:
        return self.closed_by_person + self.closed_by_policy

    @property
    def avg_turns(self) -> float | None:
        if not self.finished_runs:
            return None
        return round(self.model_turns / self.finished_runs, 2)

    @property
    def cost_per_closed_task(self) -> Decimal | None:
        cost = self.cost
        if cost is None or not self.closed:
            return None
        return (cost / self.closed).quantize(COST_PLACES)

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        for key in ("price_input_per_mtok", "price_output_per_mtok", "cost", "stored_cost"):
            data[key] = _number(data[key])
        data |= {
            "label": self.label,
            "closed": self.closed,
            "avg_turns": self.avg_turns,
            "cost_per_closed_task": _number(self.cost_per_closed_task),
        }
        return data


def _number(value: Decimal | None) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class CostBucket:
    start: datetime
    cost: Decimal | None  # None: no known cost in it
    partial: bool  # some turn in it has no known cost
    turns: int

    def as_dict(self) -> dict[str, Any]:
        return {
            "start": self.start.isoformat(),
            "cost": _number(self.cost),
            "partial": self.partial,
            "turns": self.turns,
        }


@dataclass
class Scorecard:
    window: Window
    models: list[ModelScore]
    totals: ModelScore
    cost_series: list[CostBucket] = field(default_factory=list)
    cost_bucket: str = "day"

    def as_dict(self) -> dict[str, Any]:
        return {
            "since": self.window.since.isoformat(),
            "until": self.window.until.isoformat(),
            "period": self.window.label,
            "currency": CURRENCY,
            "models": [m.as_dict() for m in self.models],
            "totals": self.totals.as_dict(),
            "cost_bucket": self.cost_bucket,
            "cost_series": [b.as_dict() for b in self.cost_series],
        }


def _is_newest_run() -> NegatedExpression[Combinable]:
    return ~Exists(AgentRun.objects.filter(task=OuterRef("task"), number__gt=OuterRef("number")))


def _run_aggregates() -> dict[str, Count | Coalesce]:
    newest = Q(_is_newest_run())
    limit_codes, loop = sorted(FailureCode.limits()), FailureCode.ERROR_LOOP
    return {
        "runs": Count("id"),
        "tasks_run": Count("task_id", distinct=True),
        "finished_runs": Count("id", filter=~Q(status=RunStatus.STARTED)),
        "failed_runs": Count("id", filter=Q(status=RunStatus.FAILED)),
        "approvals": Count("id", filter=Q(verdict=Verdict.APPROVED)),
        "rejections": Count("id", filter=Q(verdict=Verdict.REJECTED)),
        "limit_failures": Count(
            "id",
            filter=Q(error_code__in=limit_codes) | (Q(task__failure_code__in=limit_codes) & newest),
        ),
        "loops": Count("id", filter=Q(error_code=loop) | (Q(task__failure_code=loop) & newest)),
        "model_turns": Coalesce(Sum("model_turns", filter=~Q(status=RunStatus.STARTED)), 0),
        "input_tokens": Coalesce(Sum("input_tokens"), 0),
        "output_tokens": Coalesce(Sum("output_tokens"), 0),
    }


def _event_aggregates() -> dict[str, Count]:
    closed = Q(kind__in=[EventKind.CLOSED, EventKind.AUTO_CLOSED])
    reopened = Q(kind=EventKind.REOPENED)
    approved, unverified = Q(judged_verdict=Verdict.APPROVED), Q(judged_verdict=Verdict.UNVERIFIED)
    return {
        "closed_by_person": Count("id", filter=Q(kind=EventKind.CLOSED)),
        "closed_by_policy": Count("id", filter=Q(kind=EventKind.AUTO_CLOSED)),
        "reopened": Count("id", filter=reopened),
        "approved_closed": Count("id", filter=closed & approved),
        "approved_reopened": Count("id", filter=reopened & approved),
        "unverified_closed": Count("id", filter=closed & unverified),
        "unverified_reopened": Count("id", filter=reopened & unverified),
    }


def model_scorecard(*, window: Window) -> Scorecard:
    """Per connection/model numbers for the window, and the totals over all models."""
    # Real work only: the evaluation suite's tasks are measured on the evaluation page.
    runs = AgentRun.objects.filter(
        started_at__gte=window.since, started_at__lt=window.until, task__is_evaluation=False
    )
    # The model that did the work a close or reopen judged: the task's newest run before it.
    judged = AgentRun.objects.filter(
        task=OuterRef("task"), started_at__lte=OuterRef("created_at")
    ).order_by("-number")
    judged_model = judged.values("model_id")[:1]
    events = TaskEvent.objects.filter(
        kind__in=[EventKind.CLOSED, EventKind.AUTO_CLOSED, EventKind.REOPENED],
        created_at__gte=window.since,
        created_at__lt=window.until,
        task__is_evaluation=False,
    ).annotate(
        judged_model=Subquery(judged_model), judged_verdict=Subquery(judged.values("verdict")[:1])
    )

    rows: dict[int | None, dict[str, Any]] = {}
    _add_rows(rows, runs.values("model_id").annotate(**_run_aggregates()).order_by(), "model_id")
    _add_rows(
        rows,
        events.values("judged_model").annotate(**_event_aggregates()).order_by(),
        "judged_model",
    )

    # The stored cost of the window's model turns, per model (one grouped query).
    turn_rows = (
        Turn.objects.filter(run__in=runs.values("pk"), role=Role.ASSISTANT)
        .values("run__model_id")
        .annotate(stored_cost=Sum("cost"), unpriced_turns=Count("id", filter=Q(cost__isnull=True)))
        .order_by()
    )
    _add_rows(rows, turn_rows, "run__model_id")
    models = Model.objects.select_related("connection").in_bulk([k for k in rows if k is not None])
    scores = []
    for model_id, numbers in rows.items():
        model = models.get(model_id)
        if model is None:  # runs without a model, or whose model was deleted since
            score = ModelScore(model_id=None, connection="—", model="(no model)", **numbers)
        else:
            score = ModelScore(
                model_id=model_id,
                connection=model.connection.name,
                model=model.name,
                price_input_per_mtok=model.price_input_per_mtok,
                price_output_per_mtok=model.price_output_per_mtok,
                **numbers,
            )
            stored, unknown = numbers.get("stored_cost"), numbers.get("unpriced_turns")
            free = model.connection.cost_tier == CostTier.ZERO_COST
            estimate = token_cost(model, score.input_tokens, score.output_tokens)
            if stored is not None and not unknown:
                score.cost = stored.quantize(COST_PLACES)
            elif estimate is not None:
                score.cost = estimate
            elif free and (stored is not None or score.input_tokens or score.output_tokens):
                # Unpriced work on a zero-cost connection: its unknown turns cost $0.
                score.cost = (stored or Decimal(0)).quantize(COST_PLACES)
            elif stored is not None:
                score.cost, score.cost_partial = stored.quantize(COST_PLACES), True
        scores.append(score)
    scores.sort(key=lambda s: (s.model_id is None, s.connection, s.model))

    totals = ModelScore(
        model_id=None,
        connection="all",
        model="all models",
        **runs.aggregate(**_run_aggregates()),
        **events.aggregate(**_event_aggregates()),
    )
    # Prices differ per model: the total is the sum of the models' costs, and unknown when a
    # model that used tokens has no price.
    used = [s for s in scores if s.input_tokens or s.output_tokens or s.cost is not None]
    known = [s.cost for s in used if s.cost is not None]
    if known:
        totals.cost = sum(known, Decimal(0)).quantize(COST_PLACES)
        totals.cost_partial = any(s.cost is None or s.cost_partial for s in used)
    bucket, series = cost_over_time(window, runs)
    return Scorecard(
        window=window, models=scores, totals=totals, cost_series=series, cost_bucket=bucket
    )


def _add_rows(
    rows: dict[int | None, dict[str, Any]], grouped: Iterable[Mapping[str, Any]], key: str
) -> None:
    """Merge one grouped query's numbers into `rows`, by the model id in column `key`."""
    for row in grouped:
        numbers = dict(row)
        rows.setdefault(numbers.pop(key), {}).update(numbers)


def _bucket_kind(window: Window) -> str:
    span = window.until - window.since
    if span <= timedelta(days=1, hours=1):
        return "hour"
    return "day" if span <= timedelta(days=92) else "week"


def _bucket_start(moment: datetime, kind: str) -> datetime:
    moment = timezone.localtime(moment).replace(minute=0, second=0, microsecond=0)
    if kind == "hour":
        return moment
    moment = moment.replace(hour=0)
    return moment - timedelta(days=moment.weekday()) if kind == "week" else moment


def cost_over_time(window: Window, runs: QuerySet[AgentRun]) -> tuple[str, list[CostBucket]]:
    """The window's model-turn costs per hour, day or week (one grouped query), every bucket
    of the window present, empty ones at $0."""
    kind = _bucket_kind(window)
    rows = (
        Turn.objects.filter(run__in=runs.values("pk"), role=Role.ASSISTANT)
        .annotate(bucket=Trunc("created_at", kind, tzinfo=timezone.get_current_timezone()))
        .values("bucket")
        .annotate(
            total=Sum("cost"),
            turns=Count("id"),
            unknown=Count(
                "id",
                filter=Q(cost__isnull=True) & ~Q(run__connection__cost_tier=CostTier.ZERO_COST),
            ),
        )
        .order_by()
    )
    found = {_bucket_start(r["bucket"], kind): r for r in rows}
    step = {"hour": timedelta(hours=1), "day": timedelta(days=1), "week": timedelta(weeks=1)}
    series, start = [], _bucket_start(window.since, kind)
    while start <= window.until:
        row = found.get(start)
        if row is None:
            series.append(CostBucket(start=start, cost=Decimal(0), partial=False, turns=0))
        else:
            cost = row["total"]
            series.append(
                CostBucket(
                    start=start,
                    cost=None if cost is None and row["unknown"] else (cost or Decimal(0)),
                    partial=bool(row["unknown"]) and cost is not None,
                    turns=row["turns"],
                )
            )
        if kind == "hour":
            start += step[kind]
        else:  # past the next midnight, then back to it: a day is not always 24 hours
            start = _bucket_start(start + step[kind] + timedelta(hours=2), kind)
    return kind, series


def token_cost(model: Model, input_tokens: int, output_tokens: int) -> Decimal | None:
    """What the tokens cost at the model's prices per million; None when a price is missing."""
    if model.price_input_per_mtok is None or model.price_output_per_mtok is None:
        return None
    total = (
        input_tokens * model.price_input_per_mtok + output_tokens * model.price_output_per_mtok
    ) / MILLION
    return total.quantize(COST_PLACES)
