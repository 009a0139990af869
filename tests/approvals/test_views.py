"""The approvals inbox: pending operations and needs_review decisions, decided by their hash."""

import re

import pytest
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from agents.states import ToolCallStatus
from approvals.models import Approval, ReviewDecision
from approvals.states import ApprovalStatus, ReviewChoice
from tasks.models import Task
from tasks.states import TaskStatus
from tests.console.scenes import pending_approval, pending_review
from tests.factories import ApprovalFactory, TaskFactory, ToolCallFactory, UserFactory

pytestmark = pytest.mark.django_db

INBOX = "/approvals/"
HTMX = {"HTTP_HX_REQUEST": "true"}


@pytest.fixture
def decider(client):
    client.force_login(
        UserFactory(username="decider", perms=["approvals.decide_approval", "tasks.view_task"])
    )
    return client


def approve_url(approval):
    return reverse("approvals:approve", args=[approval.pk])


def deny_url(approval):
    return reverse("approvals:deny", args=[approval.pk])


def task_status(obj) -> str:
    return Task.objects.values_list("status", flat=True).get(pk=obj.task_id)


def test_the_inbox_requires_login_and_a_permission(client):
    assert client.get(INBOX).status_code == 302
    client.force_login(UserFactory(username="plain", perms=["tasks.view_task"]))
    assert client.get(INBOX).status_code == 403


def test_the_inbox_shows_every_pending_operation_oldest_first(decider):
    newer = pending_approval(url="https://example.org/newer", age_minutes=2)
    older = pending_approval(url="https://example.org/older", age_minutes=90)
    decided = pending_approval(url="https://example.org/decided")
    Approval.objects.filter(pk=decided.pk).update(
        status=ApprovalStatus.APPROVED, decided_at=decided.created_at
    )
    page = decider.get(INBOX).content.decode()
    assert page.index("https://example.org/older") < page.index("https://example.org/newer")
    assert "https://example.org/decided" not in page
    card = page[page.index(f'id="approval-{older.pk}"') :]
    assert reverse("tasks:detail", args=[older.task_id]) in card
    assert "Fetch the quarterly report" in card
    assert '<code class="tool">fetch_url</code>' in card
    assert "Sends an HTTP GET request to https://example.org/older" in card
    assert "The domain is not in the task&#x27;s allowed list" in card
    assert "waiting 1\xa0hour, 30\xa0minutes" in card
    # The validated arguments, as pretty JSON, and the hash posted back with the decision.
    assert "{\n  &quot;url&quot;: &quot;https://example.org/older&quot;\n}" in card
    assert f'name="arguments_hash" value="{older.arguments_hash}"' in card
    assert newer.pk


def test_approve_queues_the_task(decider):
    approval = pending_approval()
    response = decider.post(approve_url(approval), {"arguments_hash": approval.arguments_hash})
    assert response.status_code == 302 and response["Location"] == INBOX
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.decided_by.username == "decider"
    assert task_status(approval) == TaskStatus.READY
    assert "Approved: fetch_url" in decider.get(INBOX).content.decode()


def test_deny_reports_a_failed_call_and_queues_the_task(decider):
    approval = pending_approval()
    decider.post(deny_url(approval), {"arguments_hash": approval.arguments_hash})
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.DENIED
    assert approval.tool_call.status == ToolCallStatus.DENIED
    assert task_status(approval) == TaskStatus.READY


@pytest.mark.parametrize("posted", ["", "0" * 64, "changed"])
def test_a_stale_hash_changes_nothing_and_says_so(decider, posted):
    approval = pending_approval()
    response = decider.post(approve_url(approval), {"arguments_hash": posted})
    assert response.status_code == 409
    page = response.content.decode()
    assert "Nothing was changed." in page and "stale_decision" in page
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert task_status(approval) == TaskStatus.AWAITING_APPROVAL


def test_a_decision_made_elsewhere_is_stale(decider):
    approval = pending_approval()
    decider.post(deny_url(approval), {"arguments_hash": approval.arguments_hash})
    again = decider.post(approve_url(approval), {"arguments_hash": approval.arguments_hash})
    assert again.status_code == 409 and "not awaiting approval" in again.content.decode()
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.DENIED


def test_htmx_decisions_replace_the_card_and_the_badge(decider):
    approval = pending_approval()
    other = pending_approval(url="https://example.org/other")
    response = decider.post(
        approve_url(approval), {"arguments_hash": approval.arguments_hash}, **HTMX
    )
    body = response.content.decode()
    assert response.status_code == 200
    assert f'id="approval-{approval.pk}"' in body and "Approved: fetch_url" in body
    assert re.search(r'id="pending-badge" hx-swap-oob="true"[^>]*>1</span>', body)
    stale = decider.post(deny_url(other), {"arguments_hash": "nope"}, **HTMX)
    assert stale.status_code == 409
    assert "Nothing was changed." in stale.content.decode()
    assert "<html" not in stale.content.decode()


def test_deciding_needs_the_permission(client):
    client.force_login(
        UserFactory(username="watcher", perms=["approvals.view_approval", "tasks.view_task"])
    )
    approval = pending_approval()
    page = client.get(INBOX).content.decode()
    assert "https://example.org/report.csv" in page and 'data-action="approve"' not in page
    response = client.post(approve_url(approval), {"arguments_hash": approval.arguments_hash})
    assert response.status_code == 403
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING


def test_csrf_is_enforced_on_decisions():
    client = Client(enforce_csrf_checks=True)
    client.force_login(UserFactory(username="csrf", perms=["approvals.decide_approval"]))
    approval = pending_approval()
    data = {"arguments_hash": approval.arguments_hash}
    assert client.post(approve_url(approval), data).status_code == 403
    assert client.post(approve_url(approval), data, **HTMX).status_code == 403
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    decision = pending_review()
    response = client.post(
        reverse("approvals:skip", args=[decision.pk]),
        {"arguments_hash": decision.tool_call.arguments_hash},
    )
    assert response.status_code == 403


def test_decisions_are_post_only(decider):
    approval = pending_approval()
    assert decider.get(approve_url(approval)).status_code == 405


def test_the_target_and_arguments_are_escaped(decider):
    evil = "https://example.org/<script>alert(1)</script>"
    pending_approval(url=evil)
    page = decider.get(INBOX).content.decode()
    assert "<script>alert(1)" not in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page


def test_inbox_query_count_does_not_grow(decider):
    pending_approval()
    pending_review()
    with CaptureQueriesContext(connection) as few:
        decider.get(INBOX)
    for n in range(30):
        pending_approval(url=f"https://example.org/{n}")
        pending_review(url=f"https://example.org/r{n}")
    with CaptureQueriesContext(connection) as many:
        page = decider.get(INBOX).content.decode()
    assert page.count('data-action="approve"') == 31
    assert len(few.captured_queries) == len(many.captured_queries) <= 8


# --- needs_review -----------------------------------------------------------------------------


def test_needs_review_decisions_are_listed_with_the_explanation(decider):
    decision = pending_review()
    page = decider.get(INBOX).content.decode()
    card = page[page.index(f'id="review-{decision.pk}"') :]
    assert (
        "The worker stopped while this operation was in flight; its outcome is unknown. "
        "Run again repeats it (for fetch_url: another GET); Skip tells the model the outcome "
        "is unknown."
    ) in card
    assert "https://example.org/data.json" in card
    assert f'value="{decision.tool_call.arguments_hash}"' in card


@pytest.mark.parametrize(
    ("name", "choice", "call_status"),
    [
        ("run_again", ReviewChoice.RUN_AGAIN, ToolCallStatus.APPROVED),
        ("skip", ReviewChoice.SKIP, ToolCallStatus.SKIPPED),
    ],
)
def test_run_again_or_skip(decider, name, choice, call_status):
    decision = pending_review()
    response = decider.post(
        reverse(f"approvals:{name}", args=[decision.pk]),
        {"arguments_hash": decision.tool_call.arguments_hash},
    )
    assert response.status_code == 302
    decision.refresh_from_db()
    assert decision.choice == choice
    decision.tool_call.refresh_from_db()
    assert decision.tool_call.status == call_status
    assert task_status(decision) == TaskStatus.READY


def test_a_stale_needs_review_decision_changes_nothing(decider):
    decision = pending_review()
    response = decider.post(
        reverse("approvals:run_again", args=[decision.pk]), {"arguments_hash": "0" * 64}
    )
    assert response.status_code == 409 and "Nothing was changed." in response.content.decode()
    assert ReviewDecision.objects.get(pk=decision.pk).choice == ReviewChoice.PENDING
    assert task_status(decision) == TaskStatus.NEEDS_REVIEW


def test_a_decision_from_the_task_page_returns_there(decider):
    approval = pending_approval()
    task_url = reverse("tasks:detail", args=[approval.task_id])
    response = decider.post(
        deny_url(approval), {"arguments_hash": approval.arguments_hash, "task": approval.task_id}
    )
    assert response.status_code == 302 and response["Location"] == task_url
    stale = decider.post(
        deny_url(approval), {"arguments_hash": approval.arguments_hash, "task": approval.task_id}
    )
    assert stale.status_code == 409
    assert (
        'id="live"' in stale.content.decode() and "Nothing was changed." in stale.content.decode()
    )


def test_a_write_artifact_approval_shows_the_file_it_would_become(decider):
    task = TaskFactory(status=TaskStatus.AWAITING_APPROVAL, tools=["write_artifact"])
    arguments = {
        "name": "report.md",
        "content": "# Quarterly report\n\n<script>alert(1)</script>\n",
        "content_type": "text/markdown",
    }
    call = ToolCallFactory(task=task, turn__task=task, tool="write_artifact", arguments=arguments)
    approval = ApprovalFactory(tool_call=call, target="report.md", reason="policy_ask")
    for url in ("/approvals/", f"/tasks/{task.pk}/"):
        card = decider.get(url).content.decode()
        card = card[card.index(f'id="approval-{approval.pk}"') :]
        assert "<h1>Quarterly report</h1>" in card, url
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in card and "<script>alert" not in card
