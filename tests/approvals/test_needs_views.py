"""What needs me (console.views.needs): the nav's counts of decisions, review and failed,
polled as a small fragment; one page listing each; evaluation tasks never counted."""

import re

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from tasks.states import TaskStatus
from tests.console.scenes import pending_approval, pending_review
from tests.factories import TaskFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def boss(client):
    client.force_login(
        UserFactory(
            perms=[
                "tasks.view_task",
                "approvals.decide_approval",
                "tasks.close_task",
                "agents.view_agentrun",  # the worker page's
            ]
        )
    )
    return client


def badge(html: str, name: str) -> str:
    match = re.search(rf'id="{name}"[^>]*>(\d+)</span>', html)
    assert match, name
    return match.group(1)


def test_every_page_shows_the_counts_and_polls_them(boss):
    pending_approval()
    pending_review()
    TaskFactory(status=TaskStatus.REVIEW)
    TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps")
    TaskFactory(status=TaskStatus.FAILED, is_evaluation=True)
    for url in ["/", "/approvals/", "/review/", "/needs-me/", "/workers/"]:
        html = boss.get(url).content.decode()
        assert badge(html, "pending-badge") == "2", url
        assert badge(html, "review-badge") == "1", url
        assert badge(html, "failed-badge") == "1", url
        assert badge(html, "needs-me-badge") == "4", url
        assert 'hx-get="/needs-me/counts/"' in html and "every 10s" in html


def test_the_counts_fragment_is_one_query_and_swaps_out_of_band(boss):
    TaskFactory(status=TaskStatus.FAILED)
    boss.get("/needs-me/counts/")  # the session and the user, once
    with CaptureQueriesContext(connection) as ctx:
        html = boss.get("/needs-me/counts/").content.decode()
    counting = [q for q in ctx.captured_queries if "count(" in q["sql"].lower()]
    assert len(counting) == 1
    assert 'id="failed-badge" hx-swap-oob="true"' in html and badge(html, "failed-badge") == "1"


def test_the_needs_me_page_lists_decisions_review_and_failures(boss):
    approval = pending_approval(url="https://example.org/q3.csv")
    review = TaskFactory(status=TaskStatus.REVIEW, title="Close me please")
    TaskFactory(status=TaskStatus.FAILED, title="Broke", failure_code="error_loop")
    html = boss.get("/needs-me/").content.decode()
    assert f"/approvals/#approval-{approval.pk}" in html and "q3.csv" in html
    assert "Close me please" in html and f"/tasks/{review.pk}/" in html
    assert "Broke" in html and "error_loop" in html
    fragment = boss.get("/needs-me/", headers={"HX-Request": "true"}).content.decode()
    assert fragment.lstrip().startswith('<div id="needs"')


def test_the_task_list_refreshes_itself_and_its_filters_carry_counts(boss):
    TaskFactory(status=TaskStatus.READY)
    TaskFactory(status=TaskStatus.READY)
    TaskFactory(status=TaskStatus.READY, is_evaluation=True)
    html = boss.get("/").content.decode()
    assert re.search(
        r'data-status="ready"><span[^>]*>Ready</span> <span class="count">2</span>', html
    )
    assert re.search(
        r'data-status="failed"><span[^>]*>Failed</span> <span class="count">0</span>', html
    )
    assert re.search(r'data-status="done"><span[^>]*>Done</span></a>', html)  # not counted
    assert 'id="task-rows" hx-get="/"' in html  # polls the page's own URL, filters and all
    rows = boss.get("/", headers={"HX-Request": "true"}).content.decode()
    assert rows.lstrip().startswith('<div id="task-rows"') and "<html" not in rows
    inbox = boss.get("/approvals/", headers={"HX-Request": "true"}).content.decode()
    assert inbox.lstrip().startswith('<div id="inbox-rows"')
    review = boss.get("/review/", headers={"HX-Request": "true"}).content.decode()
    assert review.lstrip().startswith('<div id="review-rows"')
