"""The model scorecard on a fixture set whose every number is known."""

import json
from datetime import timedelta
from decimal import Decimal
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.urls import include, path
from django.utils import timezone

from acthelm_site.urls import urlpatterns as site_urlpatterns
from agents.models import AgentRun
from agents.scorecard import model_scorecard, scorecard_window
from agents.states import RunStatus, Verdict
from core.exceptions import InvalidInput
from tasks.states import EventKind, TaskStatus
from tests.factories import (
    AgentRunFactory,
    ConnectionFactory,
    ModelFactory,
    TaskEventFactory,
    TaskFactory,
    UserFactory,
)

# The site's URLconf (whose owner adds the include) plus the page at /scorecard/.
urlpatterns = [path("scorecard/", include("console.urls.scorecard")), *site_urlpatterns]

pytestmark = [pytest.mark.django_db, pytest.mark.urls(__name__)]

OLD = timedelta(days=10)


def run(task, model, number, *, status=RunStatus.SUCCEEDED, turns=0, tokens=(0, 0), **fields):
    return AgentRunFactory(
        task=task,
        number=number,
        claim_count=number,
        connection=model.connection,
        model=model,
        status=status,
        finished_at=None if status == RunStatus.STARTED else timezone.now(),
        model_turns=turns,
        input_tokens=tokens[0],
        output_tokens=tokens[1],
        **fields,
    )


def old_event(task, kind):
    """Events are append-only (an UPDATE is refused), so an old one is inserted as such."""
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO tasks_taskevent (task_id, kind, actor_kind, actor_label, from_status, "
            "to_status, data, created_at) VALUES (%s, %s, 'person', 'founder', '', '', '{}', %s)",
            [task.pk, kind, timezone.now() - OLD],
        )


@pytest.fixture
def outcomes():
    """alpha/model-a (priced 2.00 in, 10.00 out per million) and beta/model-b (no price)."""
    a = ModelFactory(
        name="model-a",
        connection=ConnectionFactory(name="alpha"),
        price_input_per_mtok=Decimal("2.00"),
        price_output_per_mtok=Decimal("10.00"),
    )
    b = ModelFactory(name="model-b", connection=ConnectionFactory(name="beta", cost_tier="paid"))

    # alpha: approved and closed by a person
    t1 = TaskFactory(status=TaskStatus.DONE)
    run(t1, a, 1, verdict=Verdict.APPROVED, turns=4, tokens=(100_000, 20_000))
    TaskEventFactory(task=t1, kind=EventKind.CLOSED, actor_kind="person")
    # alpha: rejected once, approved, then reopened by a person
    t2 = TaskFactory(status=TaskStatus.READY)
    run(t2, a, 1, verdict=Verdict.REJECTED, turns=6, tokens=(50_000, 10_000))
    run(t2, a, 2, verdict=Verdict.APPROVED, turns=2, tokens=(30_000, 5_000))
    TaskEventFactory(task=t2, kind=EventKind.REOPENED, actor_kind="person")
    # alpha: stopped at the step limit (the run's code and the task's: counted once)
    t3 = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps")
    run(
        t3,
        a,
        1,
        status=RunStatus.FAILED,
        error_code="limit_steps",
        turns=24,
        tokens=(200_000, 40_000),
    )
    # alpha: the same error twice, reported as a loop on the task (its newest run counts)
    t4 = TaskFactory(status=TaskStatus.FAILED, failure_code="error_loop")
    run(
        t4,
        a,
        1,
        status=RunStatus.FAILED,
        error_code="provider_timeout",
        turns=1,
        tokens=(1_000, 100),
    )
    run(
        t4,
        a,
        2,
        status=RunStatus.FAILED,
        error_code="provider_timeout",
        turns=1,
        tokens=(1_000, 100),
    )
    # alpha: still running (its tokens count, its turns not in the average)
    t6 = TaskFactory(status=TaskStatus.IN_PROGRESS)
    run(t6, a, 1, status=RunStatus.STARTED, turns=3, tokens=(10_000, 1_000))
    # alpha, ten days ago: outside a week
    t5 = TaskFactory(status=TaskStatus.DONE)
    old = run(t5, a, 1, verdict=Verdict.APPROVED, turns=7, tokens=(1_000_000, 0))
    AgentRun.objects.filter(pk=old.pk).update(started_at=timezone.now() - OLD - timedelta(hours=1))
    old_event(t5, EventKind.CLOSED)

    # beta: approved and closed by the policy
    t7 = TaskFactory(status=TaskStatus.DONE)
    run(t7, b, 1, verdict=Verdict.APPROVED, turns=5, tokens=(40_000, 8_000))
    TaskEventFactory(task=t7, kind=EventKind.AUTO_CLOSED, actor_kind="worker")
    # beta: stopped at the token budget
    t8 = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_tokens")
    run(
        t8,
        b,
        1,
        status=RunStatus.FAILED,
        error_code="limit_tokens",
        turns=10,
        tokens=(60_000, 12_000),
    )
    return a, b


def by_label(card):
    return {s.label: s for s in card.models}


def test_a_week_per_model(outcomes):
    card = model_scorecard(window=scorecard_window(period="week"))
    rows = by_label(card)
    assert list(rows) == ["alpha/model-a", "beta/model-b"]

    a = rows["alpha/model-a"]
    assert (a.runs, a.tasks_run, a.finished_runs, a.failed_runs) == (7, 5, 6, 3)
    assert (a.approvals, a.rejections) == (2, 1)
    assert (a.closed_by_person, a.closed_by_policy, a.reopened) == (1, 0, 1)
    assert (a.limit_failures, a.loops) == (1, 1)
    assert a.model_turns == 38 and a.avg_turns == 6.33
    assert (a.input_tokens, a.output_tokens) == (392_000, 76_200)
    # 392,000 × 2.00 / 1M + 76,200 × 10.00 / 1M
    assert a.cost == Decimal("1.546000")
    assert a.cost_per_closed_task == Decimal("1.546000")

    b = rows["beta/model-b"]
    assert (b.runs, b.tasks_run, b.finished_runs, b.failed_runs) == (2, 2, 2, 1)
    assert (b.approvals, b.rejections) == (1, 0)
    assert (b.closed_by_person, b.closed_by_policy, b.reopened) == (0, 1, 0)
    assert (b.limit_failures, b.loops) == (1, 0)
    assert b.avg_turns == 7.5
    assert (b.input_tokens, b.output_tokens) == (100_000, 20_000)
    assert b.cost is None and b.cost_per_closed_task is None

    t = card.totals
    assert (t.runs, t.tasks_run, t.approvals, t.rejections) == (9, 7, 3, 1)
    assert (t.closed_by_person, t.closed_by_policy, t.reopened) == (1, 1, 1)
    assert (t.limit_failures, t.loops, t.model_turns, t.finished_runs) == (2, 1, 53, 8)
    assert (t.input_tokens, t.output_tokens) == (492_000, 96_200)
    # beta used tokens and has no price: the total is alpha's known cost, marked partial.
    assert (t.cost, t.cost_partial) == (Decimal("1.546000"), True)


def test_since_a_date_includes_older_work(outcomes):
    since = (timezone.now() - OLD - timedelta(days=1)).date()
    a = by_label(model_scorecard(window=scorecard_window(since=since)))["alpha/model-a"]
    assert (a.runs, a.tasks_run, a.approvals, a.closed_by_person) == (8, 6, 3, 2)
    assert a.input_tokens == 1_392_000
    # (1,392,000 × 2 + 76,200 × 10) / 1M = 3.546 over 2 closed tasks
    assert a.cost == Decimal("3.546000") and a.cost_per_closed_task == Decimal("1.773000")


def test_a_day_sees_nothing_older(outcomes):
    AgentRun.objects.update(started_at=timezone.now() - timedelta(days=2))
    card = model_scorecard(window=scorecard_window(period="day"))
    # Only the closing/reopening events of today remain, credited to the models that did the work.
    rows = by_label(card)
    assert rows["alpha/model-a"].runs == 0
    assert (rows["alpha/model-a"].closed_by_person, rows["alpha/model-a"].reopened) == (1, 1)
    assert rows["beta/model-b"].closed_by_policy == 1


def test_totals_have_a_cost_when_every_model_is_priced():
    priced = [
        ModelFactory(price_input_per_mtok=Decimal("1"), price_output_per_mtok=Decimal("3")),
        ModelFactory(price_input_per_mtok=Decimal("0"), price_output_per_mtok=Decimal("0")),
    ]
    run(TaskFactory(), priced[0], 1, tokens=(500_000, 100_000))
    run(TaskFactory(), priced[1], 1, tokens=(900_000, 900_000))
    card = model_scorecard(window=scorecard_window(period="day"))
    assert {s.model_id: s.cost for s in card.models} == {
        priced[0].pk: Decimal("0.800000"),
        priced[1].pk: Decimal("0.000000"),
    }
    assert card.totals.cost == Decimal("0.800000")
    assert card.totals.cost_per_closed_task is None  # nothing closed


def test_aggregation_is_a_fixed_number_of_queries(outcomes, django_assert_max_num_queries):
    for i in range(30):
        run(TaskFactory(), outcomes[0], 1, tokens=(i, i))
    # runs, events, turn costs, models, 2 totals, the cost over time
    with django_assert_max_num_queries(7):
        model_scorecard(window=scorecard_window(period="week"))


@pytest.mark.parametrize(
    "kwargs", [{"period": "year"}, {"since": "last tuesday"}, {"since": "2999-01-01"}]
)
def test_bad_windows_are_refused(kwargs):
    with pytest.raises(InvalidInput):
        scorecard_window(**kwargs)


# --- acthelm_task stats --------------------------------------------------------------------------


def test_stats_command_prints_the_scorecard_as_json(outcomes):
    out = StringIO()
    call_command("acthelm_task", "--json", "stats", "--period", "week", stdout=out)
    data = json.loads(out.getvalue())
    assert data["period"] == "last week"
    a = next(m for m in data["models"] if m["label"] == "alpha/model-a")
    assert (a["runs"], a["approvals"], a["closed_by_person"], a["reopened"]) == (7, 2, 1, 1)
    assert a["cost"] == 1.546 and a["avg_turns"] == 6.33
    assert data["totals"]["runs"] == 9 and data["totals"]["cost"] == 1.546
    assert data["totals"]["cost_partial"] is True and data["currency"] == "USD"


def test_stats_command_since_a_date_and_text_output(outcomes):
    since = (timezone.now() - OLD - timedelta(days=1)).date().isoformat()
    out = StringIO()
    call_command("acthelm_task", "stats", "--since", since, stdout=out)
    text = out.getvalue()
    assert f"since {since}" in text
    assert "alpha/model-a" in text and "cost 3.5460" in text


def test_stats_command_refuses_a_bad_date():
    with pytest.raises(CommandError, match="invalid_input"):
        call_command("acthelm_task", "stats", "--since", "31/01/2025", stdout=StringIO())


# --- the page ------------------------------------------------------------------------------------


@pytest.fixture
def viewer(client):
    user = UserFactory(username="analyst", perms=["agents.view_agentrun"])
    client.force_login(user)
    return user


def test_the_page_needs_a_login(client):
    response = client.get("/scorecard/")
    assert response.status_code == 302 and response["Location"].startswith("/admin/login/")


def test_the_page_needs_the_view_permission(client):
    client.force_login(UserFactory(username="nobody", perms=["tasks.view_task"]))
    assert client.get("/scorecard/").status_code == 403


def test_the_page_shows_each_model_with_a_chart(client, viewer, outcomes):
    response = client.get("/scorecard/?period=week")
    assert response.status_code == 200
    html = response.content.decode()
    assert "<h1>Model scorecard</h1>" in html
    assert 'data-model="alpha/model-a"' in html and 'data-model="beta/model-b"' in html
    assert "1.5460" in html  # alpha's cost
    assert html.count('<svg class="scorecard-chart"') == 2
    assert 'aria-label="approved 2, rejected 1, closed 1, reopened 1, limits 1, loops 1"' in html
    # The tallest bar on the page (alpha's two approvals) is the full chart height.
    assert '<rect class="good" x="0" y="0" width="28" height="60">' in html


def test_the_page_for_htmx_is_just_the_fragment(client, viewer, outcomes):
    response = client.get("/scorecard/?period=day", headers={"HX-Request": "true"})
    html = response.content.decode()
    assert response.status_code == 200
    assert html.lstrip().startswith('<section id="scorecard"') and "<html" not in html


def test_the_page_explains_a_bad_date(client, viewer):
    response = client.get("/scorecard/?since=yesterday")
    assert response.status_code == 400
    assert "since must be a date" in response.content.decode()


def test_stored_turn_costs_are_the_cost_when_every_turn_has_one():
    from tests.factories import TurnFactory

    model = ModelFactory(price_input_per_mtok=Decimal("1"), price_output_per_mtok=Decimal("3"))
    task = TaskFactory()
    r = run(task, model, 1, tokens=(500_000, 100_000))
    TurnFactory(task=task, run=r, index=1, role="assistant", cost=Decimal("0.25"))
    TurnFactory(task=task, run=r, index=2, role="assistant", cost=Decimal("0.05"))
    TurnFactory(task=task, run=r, index=3, role="user")  # no cost: not a model turn
    card = model_scorecard(window=scorecard_window(period="day"))
    assert card.models[0].cost == Decimal("0.300000")  # not 0.8 from the tokens
    assert card.totals.cost == Decimal("0.300000")
    # One model turn without a cost: the tokens at the prices again (unknown is not free).
    TurnFactory(task=task, run=r, index=4, role="assistant")
    card = model_scorecard(window=scorecard_window(period="day"))
    assert card.models[0].cost == Decimal("0.800000")


def test_approved_runs_later_closed_or_reopened_and_unverified_ones_apart():
    model = ModelFactory()
    outcomes = [
        (Verdict.APPROVED, EventKind.CLOSED),
        (Verdict.APPROVED, EventKind.CLOSED),
        (Verdict.APPROVED, EventKind.REOPENED),
        (Verdict.UNVERIFIED, EventKind.REOPENED),
    ]
    for verdict, kind in outcomes:
        task = TaskFactory(status=TaskStatus.DONE, model=model)
        run(task, model, 1, verdict=verdict)
        TaskEventFactory(task=task, kind=kind)
    card = model_scorecard(window=scorecard_window(period="day"))
    (score,) = card.models
    assert (score.approved_closed, score.approved_reopened) == (2, 1)
    assert (score.unverified_closed, score.unverified_reopened) == (0, 1)
    assert (card.totals.approved_closed, card.totals.unverified_reopened) == (2, 1)
    assert score.as_dict()["approved_reopened"] == 1


# --- costs: zero-cost work, partial sums, the currency, over time (issue 24) ----------------------


def test_zero_cost_work_costs_nothing_and_a_sum_over_known_costs_is_partial():
    from tests.factories import TurnFactory

    free = ModelFactory(connection=ConnectionFactory(name="local", cost_tier="zero_cost"))
    paid = ModelFactory(connection=ConnectionFactory(name="hosted", cost_tier="paid"))
    run(TaskFactory(), free, 1, tokens=(1_000, 100))  # no turn rows, no prices
    task = TaskFactory()
    r = run(task, paid, 1, tokens=(2_000, 200))
    TurnFactory(task=task, run=r, index=1, role="assistant", cost=Decimal("0.25"))
    TurnFactory(task=task, run=r, index=2, role="assistant", cost=None)
    card = model_scorecard(window=scorecard_window(period="day"))
    rows = {s.connection: s for s in card.models}
    assert (rows["local"].cost, rows["local"].cost_partial) == (Decimal(0), False)
    assert (rows["hosted"].cost, rows["hosted"].cost_partial) == (Decimal("0.25"), True)
    assert (card.totals.cost, card.totals.cost_partial) == (Decimal("0.25"), True)
    data = card.as_dict()
    assert data["currency"] == "USD" and data["totals"]["cost_partial"] is True


def test_cost_over_time_has_every_bucket_of_the_window():
    from tests.factories import TurnFactory

    paid = ModelFactory(connection=ConnectionFactory(cost_tier="paid"))
    task = TaskFactory()
    r = run(task, paid, 1)
    TurnFactory(task=task, run=r, index=1, role="assistant", cost=Decimal("0.5"))
    TurnFactory(task=task, run=r, index=2, role="assistant", cost=Decimal("0.25"))
    old = TurnFactory(task=task, run=r, index=3, role="assistant", cost=None)
    from agents.models import Turn

    Turn.objects.filter(pk=old.pk).update(created_at=timezone.now() - timedelta(days=3))
    card = model_scorecard(window=scorecard_window(period="week"))
    assert card.cost_bucket == "day" and len(card.cost_series) in (7, 8)
    today, three_days_ago = card.cost_series[-1], card.cost_series[-4]
    assert (today.cost, today.partial, today.turns) == (Decimal("0.75"), False, 2)
    assert (three_days_ago.cost, three_days_ago.turns) == (None, 1)  # unknown, not free
    assert all(b.cost == 0 for b in card.cost_series[:-4])
    day = model_scorecard(window=scorecard_window(period="day"))
    assert day.cost_bucket == "hour" and len(day.cost_series) in (24, 25)


def test_the_page_shows_costs_in_dollars_partial_marks_and_the_cost_over_time(client, viewer):
    from tests.factories import TurnFactory

    paid = ModelFactory(connection=ConnectionFactory(name="hosted", cost_tier="paid"))
    task = TaskFactory()
    r = run(task, paid, 1, tokens=(10, 10))
    TurnFactory(task=task, run=r, index=1, role="assistant", cost=Decimal("0.5"))
    TurnFactory(task=task, run=r, index=2, role="assistant", cost=None)
    free = ModelFactory(connection=ConnectionFactory(name="local", cost_tier="zero_cost"))
    run(TaskFactory(), free, 1, tokens=(10, 10))
    html = client.get("/scorecard/?period=week").content.decode()
    assert "Cost (USD)" in html and "$0.5000" in html and ">partial</span>" in html
    local = html[html.index('data-model="local/') :]
    assert "$0.0000" in local[: local.index("</tr>")]  # zero-cost work is $0, not a blank
    assert "Cost over time (USD per day" in html and "$0.5000 (partial)" in html
