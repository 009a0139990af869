"""The scorecard page: how each connection/model did over a period, with a small chart per model."""

from django.http import HttpResponse
from django.shortcuts import render
from django.views.decorators.http import require_GET

from agents.permissions import VIEW_AGENTRUN
from agents.scorecard import (
    DEFAULT_PERIOD,
    PERIODS,
    ModelScore,
    Scorecard,
    model_scorecard,
    scorecard_window,
)
from console.http import AuthenticatedHttpRequest
from console.shared import console_view
from core.exceptions import InvalidInput

# The chart's bars: (field, label, CSS class).
BARS = [
    ("approvals", "approved", "good"),
    ("rejections", "rejected", "bad"),
    ("closed", "closed", "good"),  # by a person or the policy
    ("reopened", "reopened", "bad"),
    ("limit_failures", "limits", "bad"),
    ("loops", "loops", "bad"),
]
CHART_HEIGHT = 60
BAR_WIDTH = 28
# Wide enough that the labels under neighbouring bars ("approved", "rejected") do not overlap.
BAR_GAP = 18


def chart(score: ModelScore, scale: int) -> dict[str, object]:
    """Server-side geometry of one model's bar chart; `scale` is the largest count on the page,
    so every model's chart uses the same scale."""
    bars = []
    for i, (field, label, tone) in enumerate(BARS):
        value = getattr(score, field)
        height = round(CHART_HEIGHT * value / scale) if scale else 0
        bars.append(
            {
                "label": label,
                "value": value,
                "tone": tone,
                "x": i * (BAR_WIDTH + BAR_GAP),
                "y": CHART_HEIGHT - height,
                "height": height,
                "text_x": i * (BAR_WIDTH + BAR_GAP) + BAR_WIDTH // 2,
            }
        )
    return {
        "bars": bars,
        "width": len(BARS) * (BAR_WIDTH + BAR_GAP) - BAR_GAP,
        "height": CHART_HEIGHT,
        "bar_width": BAR_WIDTH,
        # Room on each side for the first and last labels, which are wider than their bars.
        "pad": BAR_GAP // 2,
    }


COST_BAR_WIDTH = 14
COST_BAR_GAP = 4
COST_FORMATS = {"hour": "H:i", "day": "M j", "week": "M j"}


def cost_chart(card: Scorecard) -> dict[str, object]:
    """Server-side geometry of the cost-over-time chart: one bar per bucket, on one scale."""
    top = max((b.cost for b in card.cost_series if b.cost), default=0)
    bars = []
    for i, bucket in enumerate(card.cost_series):
        height = round(CHART_HEIGHT * bucket.cost / top) if top and bucket.cost else 0
        if bucket.cost is None:
            text = "unknown"
        else:
            text = f"${bucket.cost:,.4f}" + (" (partial)" if bucket.partial else "")
        bars.append(
            {
                "bucket": bucket,
                "x": i * (COST_BAR_WIDTH + COST_BAR_GAP),
                "y": CHART_HEIGHT - height,
                "height": height,
                "text": text,
            }
        )
    return {
        "bars": bars,
        "width": max(1, len(bars) * (COST_BAR_WIDTH + COST_BAR_GAP) - COST_BAR_GAP),
        "height": CHART_HEIGHT,
        "bar_width": COST_BAR_WIDTH,
        "top": f"${top:,.4f}",
        "format": COST_FORMATS[card.cost_bucket],
        "partial": any(b.partial or b.cost is None for b in card.cost_series),
    }


@require_GET
@console_view(VIEW_AGENTRUN)
def scorecard(request: AuthenticatedHttpRequest) -> HttpResponse:
    period = request.GET.get("period") or DEFAULT_PERIOD
    since = (request.GET.get("since") or "").strip()
    error = None
    try:
        window = scorecard_window(period=period, since=since or None)
    except InvalidInput as exc:
        error = str(exc)
        period, since = DEFAULT_PERIOD, ""
        window = scorecard_window(period=period)
    card = model_scorecard(window=window)
    scale = max(
        (getattr(s, field) for s in card.models for field, _, _ in BARS),
        default=0,
    )
    context = {
        "card": card,
        "rows": [{"score": s, "chart": chart(s, scale)} for s in card.models],
        "cost_chart": cost_chart(card),
        "periods": list(PERIODS),
        "period": "" if since else period,
        "since": since,
        "error": error,
    }
    template = "console/scorecard.html"
    if request.htmx:
        template += "#scorecard"
    return render(request, template, context, status=400 if error else 200)
