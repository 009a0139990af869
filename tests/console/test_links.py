"""A notification's decision link: behind login (the login page returns to it), the inbox's card
and buttons for that one decision; a decision through it is recorded `via: email_link`. A link
that expired, was altered, or whose operation was decided or changed decides nothing and says
so."""

import time

import pytest
from django.core import signing
from django.urls import reverse

from agents.actions.decisions import approval_approve
from approvals.models import Approval
from approvals.states import ApprovalStatus, ReviewChoice
from core.actors import Actor
from tasks.models import Task, TaskEvent
from tasks.notify.links import LinkKind, decision_link
from tasks.states import EventKind, TaskStatus
from tasks.transitions import transition
from tests.console.scenes import pending_approval, pending_review
from tests.factories import TaskFactory, UserFactory

pytestmark = pytest.mark.django_db

PERMS = ["approvals.decide_approval", "tasks.view_task"]


@pytest.fixture(autouse=True)
def base_url(settings):
    settings.ACTHELM_BASE_URL = "https://acthelm.example.org"


@pytest.fixture
def alice(client):
    user = UserFactory(username="alice", perms=PERMS)
    client.force_login(user)
    return user


def path_of(link: str) -> str:
    return link.removeprefix("https://acthelm.example.org")


def approval_link(approval, arguments_hash=None) -> str:
    bound = approval.arguments_hash if arguments_hash is None else arguments_hash
    return path_of(decision_link(LinkKind.APPROVAL, approval.pk, bound))


def post_from_link(client, approval, link, action="approve", arguments_hash=None):
    kind, token = link.strip("/").split("/")[-2:]
    return client.post(
        reverse(f"approvals:{action}", args=[approval.pk]),
        {
            "arguments_hash": arguments_hash or approval.arguments_hash,
            "decision_link": f"{kind}/{token}",
        },
    )


def test_a_signed_out_person_is_sent_to_the_login_page_which_returns_to_the_link(client):
    approval = pending_approval()
    link = approval_link(approval)
    response = client.get(link)
    assert response.status_code == 302
    assert response["Location"] == f"/admin/login/?next={link.replace(':', '%3A')}"


def test_the_link_shows_the_inbox_card_and_approving_from_it_records_the_door(client, alice):
    approval = pending_approval(url="https://example.org/q3.txt")
    link = approval_link(approval)
    page = client.get(link)
    assert page.status_code == 200
    html = page.content.decode()
    assert f'id="approval-{approval.pk}"' in html
    assert '<code class="tool">fetch_url</code>' in html
    assert "Sends an HTTP GET request to https://example.org/q3.txt" in html
    assert f'name="arguments_hash" value="{approval.arguments_hash}"' in html
    assert 'data-action="approve"' in html and 'data-action="deny"' in html
    assert 'name="decision_link"' in html

    response = post_from_link(client, approval, link)
    assert response.status_code == 302 and response["Location"] == link
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED and approval.decided_by == alice
    event = TaskEvent.objects.get(task_id=approval.task_id, kind=EventKind.APPROVED)
    assert event.data["via"] == "email_link" and event.actor_user == alice
    assert event.data["arguments_hash"] == approval.arguments_hash
    assert Task.objects.get(pk=approval.task_id).status == TaskStatus.READY
    # The link now says who decided, and offers nothing to decide.
    again = client.get(link)
    assert again.status_code == 409
    text = again.content.decode()
    assert "already decided: Approved by alice" in text and 'data-action="approve"' not in text


def test_a_console_decision_is_recorded_via_console(client, alice):
    approval = pending_approval()
    client.post(
        reverse("approvals:approve", args=[approval.pk]),
        {"arguments_hash": approval.arguments_hash},
    )
    event = TaskEvent.objects.get(task_id=approval.task_id, kind=EventKind.APPROVED)
    assert event.data["via"] == "console"


def test_an_expired_link_says_so_and_decides_nothing(client, alice, settings, monkeypatch):
    approval = pending_approval()
    link = approval_link(approval)
    later = time.time() + settings.ACTHELM_DECISION_LINK_SECONDS + 5
    monkeypatch.setattr(signing.time, "time", lambda: later)
    page = client.get(link)
    assert page.status_code == 410 and "this link has expired" in page.content.decode()
    response = post_from_link(client, approval, link)
    assert response.status_code == 410
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_a_tampered_link_says_so_and_decides_nothing(client, alice):
    approval = pending_approval()
    other = pending_approval(url="https://example.org/other")
    link = approval_link(approval)
    token = link.strip("/").split("/")[-1]
    _payload, stamp, sig = token.split(":")
    # Another approval's id under the first one's signature; and the same token for another kind.
    forged_payload = signing.b64_encode(
        signing.JSONSerializer().dumps({"id": other.pk, "bound_to": other.arguments_hash})
    ).decode()
    for forged in (
        f"/decide/approval/{forged_payload}:{stamp}:{sig}/",
        f"/decide/review/{token}/",
        f"/decide/approval/{token[:-3]}/",
    ):
        page = client.get(forged)
        assert page.status_code == 400, forged
        assert "this link is not valid" in page.content.decode()
    response = post_from_link(client, other, f"/decide/approval/{forged_payload}:{stamp}:{sig}/")
    assert response.status_code == 400
    assert not Approval.objects.exclude(status=ApprovalStatus.PENDING).exists()


def test_a_link_whose_operation_changed_decides_nothing(client, alice):
    approval = pending_approval()
    link = approval_link(approval, arguments_hash="e" * 64)
    page = client.get(link)
    assert page.status_code == 409
    assert "changed since the message was sent" in page.content.decode()
    response = post_from_link(client, approval, link)
    assert response.status_code == 409
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_a_link_to_an_operation_decided_elsewhere_says_who(client, alice):
    approval = pending_approval()
    bob = UserFactory(username="bob", perms=PERMS)
    approval_approve(
        actor=Actor.person(bob), approval_id=approval.pk, arguments_hash=approval.arguments_hash
    )
    page = client.get(approval_link(approval))
    assert page.status_code == 409 and "Approved by bob" in page.content.decode()


def test_a_link_needs_a_person_who_may_see_decisions(client):
    approval = pending_approval()
    client.force_login(UserFactory(username="plain", perms=["tasks.view_task"]))
    assert client.get(approval_link(approval)).status_code == 403


def test_a_review_link_shows_run_again_or_skip(client, alice):
    decision = pending_review()
    link = path_of(decision_link(LinkKind.REVIEW, decision.pk, decision.tool_call.arguments_hash))
    html = client.get(link).content.decode()
    assert f'id="review-{decision.pk}"' in html and 'data-action="run_again"' in html
    kind, token = link.strip("/").split("/")[-2:]
    client.post(
        reverse("approvals:skip", args=[decision.pk]),
        {
            "arguments_hash": decision.tool_call.arguments_hash,
            "decision_link": f"{kind}/{token}",
        },
    )
    decision.refresh_from_db()
    assert decision.choice == ReviewChoice.SKIP
    event = TaskEvent.objects.get(task_id=decision.task_id, kind=EventKind.SKIPPED)
    assert event.data["via"] == "email_link"


def test_a_task_review_link_opens_the_task_until_it_leaves_that_review(client, alice):
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    transition(task.pk, TaskStatus.REVIEW, actor=Actor.worker("w"), kind=EventKind.SUBMITTED)
    entered = TaskEvent.objects.filter(task=task, to_status=TaskStatus.REVIEW).latest("id")
    link = path_of(decision_link(LinkKind.TASK, task.pk, str(entered.pk)))
    response = client.get(link)
    assert response.status_code == 302 and response["Location"] == f"/tasks/{task.pk}/"
    stale = path_of(decision_link(LinkKind.TASK, task.pk, str(entered.pk - 1)))
    assert client.get(stale).status_code == 409
