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
  not free). Cost per closed task divides the cost
  of the window's runs by the tasks closed in it (by a person or the policy).
"""

from dataclasses import asdict, dataclass
from datetime import date, datetime, time, timedelta
from decimal import Decimal

from django.db.models import Count, Exists, OuterRef, Q, Subquery, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from agents.models import AgentRun, Model, Turn
from agents.states import Role, RunStatus, Verdict
from tasks.exceptions import InvalidInput
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


@dataclass(frozen=True)
class Window:
    since: datetime
    until: datetime
    label: str


def scorecard_window(
    *, period: str | None = None, since: date | datetime | str | None = None, now=None
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

    def as_dict(self) -> dict:
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


@dataclass
class Scorecard:
    window: Window
    models: list[ModelScore]
    totals: ModelScore

    def as_dict(self) -> dict:
        return {
            "since": self.window.since.isoformat(),
            "until": self.window.until.isoformat(),
            "period": self.window.label,
            "models": [m.as_dict() for m in self.models],
            "totals": self.totals.as_dict(),
        }


def _is_newest_run():
    return ~Exists(AgentRun.objects.filter(task=OuterRef("task"), number__gt=OuterRef("number")))


def _run_aggregates() -> dict:
    newest = Q(_is_newest_run())
    return {
        "runs": Count("id"),
        "tasks_run": Count("task_id", distinct=True),
        "finished_runs": Count("id", filter=~Q(status=RunStatus.STARTED)),
        "failed_runs": Count("id", filter=Q(status=RunStatus.FAILED)),
        "approvals": Count("id", filter=Q(verdict=Verdict.APPROVED)),
        "rejections": Count("id", filter=Q(verdict=Verdict.REJECTED)),
        "limit_failures": Count(
            "id",
            filter=Q(error_code__startswith="limit_")
            | (Q(task__failure_code__startswith="limit_") & newest),
        ),
        "loops": Count(
            "id", filter=Q(error_code="error_loop") | (Q(task__failure_code="error_loop") & newest)
        ),
        "model_turns": Coalesce(Sum("model_turns", filter=~Q(status=RunStatus.STARTED)), 0),
        "input_tokens": Coalesce(Sum("input_tokens"), 0),
        "output_tokens": Coalesce(Sum("output_tokens"), 0),
    }


def _event_aggregates() -> dict:
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

    rows: dict[int | None, dict] = {}
    for row in runs.values("model_id").annotate(**_run_aggregates()).order_by():
        rows.setdefault(row.pop("model_id"), {}).update(row)
    for row in events.values("judged_model").annotate(**_event_aggregates()).order_by():
        rows.setdefault(row.pop("judged_model"), {}).update(row)

    # The stored cost of the window's model turns, per model (one grouped query).
    turn_rows = (
        Turn.objects.filter(run__in=runs.values("pk"), role=Role.ASSISTANT)
        .values("run__model_id")
        .annotate(stored_cost=Sum("cost"), unpriced_turns=Count("id", filter=Q(cost__isnull=True)))
        .order_by()
    )
    for row in turn_rows:
        rows.setdefault(row.pop("run__model_id"), {}).update(row)
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
            if stored is not None and not unknown:
                score.cost = stored.quantize(COST_PLACES)
            else:
                score.cost = token_cost(model, score.input_tokens, score.output_tokens)
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
    used = [s for s in scores if s.input_tokens or s.output_tokens]
    if all(s.cost is not None for s in used):
        totals.cost = sum((s.cost for s in used), Decimal(0)).quantize(COST_PLACES)
    return Scorecard(window=window, models=scores, totals=totals)


def token_cost(model: Model, input_tokens: int, output_tokens: int) -> Decimal | None:
    """What the tokens cost at the model's prices per million; None when a price is missing."""
    if model.price_input_per_mtok is None or model.price_output_per_mtok is None:
        return None
    total = (
        input_tokens * model.price_input_per_mtok + output_tokens * model.price_output_per_mtok
    ) / MILLION
    return total.quantize(COST_PLACES)
