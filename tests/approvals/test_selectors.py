"""What a person can still decide is defined once (approvals.selectors) and every reader uses it:
the console inbox, the nav count, the API's approvals list and the notifications (issue 21 item 7).
An evaluation task's operations, and operations of a task that no longer waits, are not in it."""

import pytest
from django.db import transaction

from approvals.notify import pending_approvals, pending_reviews
from approvals.selectors import (
    decidable_approvals,
    decidable_counts,
    decidable_reviews,
    open_operations,
)
from console.context_processors import pending_decisions_count
from core.actors import Actor
from tasks.notify.models import Notification
from tasks.notify.states import TargetKind
from tasks.notify.targets import target_add
from tasks.states import EventKind, TaskStatus
from tasks.transitions import lock_task, set_status
from tests.api.conftest import client_for
from tests.factories import ApprovalFactory, ReviewDecisionFactory, TaskFactory, UserFactory

pytestmark = pytest.mark.django_db


def _approval(status=TaskStatus.AWAITING_APPROVAL, evaluation=False):
    task = TaskFactory(status=status, is_evaluation=evaluation)
    return ApprovalFactory(tool_call__task=task, tool_call__turn__task=task)


def _review(status=TaskStatus.NEEDS_REVIEW, evaluation=False):
    task = TaskFactory(status=status, is_evaluation=evaluation)
    return ReviewDecisionFactory(tool_call__task=task, tool_call__turn__task=task)


@pytest.fixture
def mixed():
    """One decidable approval and review, and one of each that a person may not decide."""
    return {
        "approval": _approval(),
        "review": _review(),
        "eval_approval": _approval(evaluation=True),
        "eval_review": _review(evaluation=True),
        "stale_approval": _approval(status=TaskStatus.CANCELLED),
        "stale_review": _review(status=TaskStatus.READY),
    }


def test_decidable_leaves_out_evaluation_tasks_and_tasks_that_no_longer_wait(mixed):
    assert list(decidable_approvals()) == [mixed["approval"]]
    assert list(decidable_reviews()) == [mixed["review"]]
    assert decidable_counts() == (1, 1)
    assert pending_decisions_count() == 2
    assert {(r["kind"], r["id"]) for r in open_operations()} == {
        ("approval", mixed["approval"].pk),
        ("review", mixed["review"].pk),
    }


def test_the_notification_describers_use_it(mixed):
    assert [a["id"] for a in pending_approvals(mixed["approval"].task)] == [mixed["approval"].pk]
    assert pending_approvals(mixed["eval_approval"].task) == []
    assert [r["id"] for r in pending_reviews(mixed["review"].task)] == [mixed["review"].pk]
    assert pending_reviews(mixed["eval_review"].task) == []


def test_the_api_lists_only_what_a_person_can_decide(mixed):
    api = client_for("founder", ["approvals.decide_approval"])
    data = api.get("/api/approvals").json()
    assert [a["id"] for a in data["approvals"]] == [mixed["approval"].pk]
    assert [r["id"] for r in data["reviews"]] == [mixed["review"].pk]


def test_the_console_inbox_uses_it(client, mixed):
    client.force_login(UserFactory(perms=["approvals.decide_approval"]))
    html = client.get("/approvals/").content.decode()
    assert f'id="approval-{mixed["approval"].pk}"' in html
    assert f'id="review-{mixed["review"].pk}"' in html
    for other in ("eval_approval", "stale_approval"):
        assert f'id="approval-{mixed[other].pk}"' not in html
    for other in ("eval_review", "stale_review"):
        assert f'id="review-{mixed[other].pk}"' not in html


@pytest.mark.parametrize("evaluation", [False, True])
def test_no_notification_for_an_evaluation_task(settings, evaluation):
    settings.ACTHELM_BASE_URL = "https://acthelm.example.org"
    target_add(name="founder", kind=TargetKind.EMAIL, address="founder@example.org")
    task = TaskFactory(status=TaskStatus.IN_PROGRESS, is_evaluation=evaluation)
    ApprovalFactory(tool_call__task=task, tool_call__turn__task=task)
    with transaction.atomic():
        set_status(
            lock_task(task.pk),
            TaskStatus.AWAITING_APPROVAL,
            actor=Actor.worker("w"),
            kind=EventKind.APPROVAL_REQUESTED,
        )
    rows = list(Notification.objects.filter(task=task))
    if evaluation:
        assert rows == []
    else:
        [row] = rows
        assert len(row.payload["approvals"]) == 1
