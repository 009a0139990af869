"""Finding tasks (console.filters): the review page's filters on the tasks list, read from and
written back to the URL, so a filtered list is a bookmark."""

import datetime
import re
from datetime import timedelta

import pytest
from django.http import QueryDict
from django.utils import timezone

from console.filters import filter_query, task_filters
from tasks.models import Task
from tasks.states import TaskStatus
from tests.factories import AgentRunFactory, GoalFactory, ModelFactory, TaskFactory, UserFactory

pytestmark = pytest.mark.django_db


def _listed(html: str) -> set[int]:
    return {int(n) for n in re.findall(r'<td class="num"><a href="/tasks/(\d+)/">', html)}


@pytest.fixture
def viewer(client):
    client.force_login(UserFactory(perms=["tasks.view_task"]))
    return client


def test_filters_round_trip_through_a_query_string():
    query = QueryDict(
        "q=+quarterly+&tag=finance&goal=3&model=7&since=2026-11-01&until=2026-12-03"
        "&status=failed&junk=1"
    )
    filters = task_filters(query)
    assert filters == {
        "q": "quarterly",
        "tag": "finance",
        "goal": 3,
        "model": 7,
        "since": datetime.date(2026, 11, 1),
        "until": datetime.date(2026, 12, 3),
        "status": "failed",
    }
    assert task_filters(QueryDict(filter_query(filters))) == filters
    # What is not understood is dropped, not an error.
    bad = task_filters(QueryDict("goal=x&model=-2&since=yesterday&status=nonsense"))
    assert not any(bad.values())


def test_the_tasks_list_filters_by_text_tag_goal_model_date_and_state(viewer):
    goal = GoalFactory(title="Quarter close")
    model = ModelFactory(name="qwen-small")
    match = TaskFactory(
        title="Quarterly report",
        tags=["finance"],
        goal=goal,
        model=model,
        status=TaskStatus.FAILED,
    )
    by_answer = TaskFactory(title="Something else", tags=["finance"], goal=goal, model=model)
    AgentRunFactory(task=by_answer, answer="the quarterly numbers", number=1, claim_count=1)
    other_tag = TaskFactory(title="Quarterly draft", tags=["ops"], goal=goal, model=model)
    other_goal = TaskFactory(title="Quarterly plan", tags=["finance"], model=model)
    old = TaskFactory(title="Quarterly 2025", tags=["finance"], goal=goal, model=model)
    Task.objects.filter(pk=old.pk).update(updated_at=timezone.now() - timedelta(days=40))
    since = (timezone.now() - timedelta(days=7)).date().isoformat()
    params = {
        "q": "quarterly",
        "tag": "finance",
        "goal": goal.pk,
        "model": model.pk,
        "since": since,
    }
    html = viewer.get("/", params).content.decode()
    assert _listed(html) == {match.pk, by_answer.pk}
    assert other_tag.pk not in _listed(html) and other_goal.pk not in _listed(html)
    # The form shows what is filtered; the state links keep the other filters.
    assert 'name="q" value="quarterly"' in html and 'name="tag" value="finance"' in html
    assert f'<option value="{goal.pk}" selected>Quarter close</option>' in html
    assert f'value="{model.pk}" selected>' in html and f'value="{since}"' in html
    failed_link = re.search(r'href="\?([^"]*status=failed)"', html)
    assert failed_link and "q=quarterly" in failed_link.group(1)
    assert f"goal={goal.pk}" in failed_link.group(1)
    # A state narrows it further; the URL is the bookmark.
    narrowed = viewer.get("/?" + failed_link.group(1).replace("&amp;", "&")).content.decode()
    assert _listed(narrowed) == {match.pk}
    assert '<option value="failed" selected>' in narrowed


def test_the_pager_keeps_the_filters(viewer):
    tasks = [TaskFactory(title=f"Invoice {n}", tags=["billing"]) for n in range(52)]
    TaskFactory(title="Unrelated")
    html = viewer.get("/", {"tag": "billing"}).content.decode()
    older = re.search(r'href="\?([^"]*)" rel="next"', html)
    assert older and "tag=billing" in older.group(1)
    rest = viewer.get("/?" + older.group(1).replace("&amp;", "&")).content.decode()
    assert _listed(rest) == {t.pk for t in tasks[:2]}


def test_the_filter_form_swaps_the_rows_and_pushes_the_url(viewer):
    TaskFactory(title="Alpha")
    beta = TaskFactory(title="Beta")
    page = viewer.get("/").content.decode()
    form = page[page.index('<form class="card filters-form"') :]
    form = form[: form.index(">")]
    assert 'method="get"' in form and 'hx-push-url="true"' in form
    assert 'hx-target="#task-rows"' in form
    rows = viewer.get("/", {"q": "beta"}, HTTP_HX_REQUEST="true").content.decode()
    assert "<html" not in rows and rows.lstrip().startswith('<div id="task-rows"')
    assert _listed(rows) == {beta.pk}
    # The rows poll the filtered URL, not the unfiltered one.
    assert 'hx-get="/?q=beta"' in rows


def test_the_review_page_reads_the_same_filters(viewer):
    viewer.force_login(UserFactory(perms=["tasks.view_task", "tasks.close_task"]))
    found = TaskFactory(title="Quarterly report", status=TaskStatus.REVIEW, tags=["finance"])
    TaskFactory(title="Quarterly plan", status=TaskStatus.REVIEW, tags=["ops"])
    html = viewer.get("/review/", {"q": "quarterly", "tag": "finance"}).content.decode()
    assert re.findall(r'data-task="(\d+)"', html) == [str(found.pk)]
    assert 'name="status"' not in html  # every row is in review
