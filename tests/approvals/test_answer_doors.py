"""Agent Inbox's answers through every door: the console's approval card (inbox and task page),
the CLI, the notification's link; each bound to the shown hash. (The API: tests/api/test_answers.py;
the service: tests/agents/test_decisions.py; the worker: tests/approvals/test_answers.py.)"""

import io
import json
from urllib.parse import urlsplit

import pytest
from django.core.management import CommandError, call_command
from django.db import transaction
from django.urls import reverse
from django.utils.html import escape

from agents.catalogue.tools import get_tool, operation_hash
from agents.models import ToolCall
from approvals.models import Approval
from approvals.states import ApprovalStatus
from core.actors import Actor
from tasks.models import Task, TaskEvent
from tasks.notify.models import Notification
from tasks.notify.states import TargetKind
from tasks.notify.targets import target_add
from tasks.states import EventKind, TaskStatus
from tasks.transitions import lock_task, set_status
from tests.console.scenes import pending_approval
from tests.factories import TaskFactory, UserFactory

pytestmark = pytest.mark.django_db

HTMX = {"HTTP_HX_REQUEST": "true"}
EDIT = {"url": "https://example.org/q4-report.csv"}


@pytest.fixture
def decider(client):
    client.force_login(
        UserFactory(
            username="decider",
            perms=["approvals.decide_approval", "tasks.view_task", "tasks.operate_task"],
        )
    )
    return client


def edit_hash(arguments: dict) -> str:
    return operation_hash("fetch_url", get_tool("fetch_url").parse(arguments))


def post_edit(client, approval, arguments: str, **extra):
    return client.post(
        reverse("approvals:approve", args=[approval.pk]),
        {"arguments_hash": approval.arguments_hash, "arguments": arguments, **extra},
        **HTMX,
    )


def test_the_card_offers_the_edit_prefilled_and_a_denial_message(decider):
    approval = pending_approval(url="https://example.org/q3-report.csv")
    page = decider.get("/approvals/").content.decode()
    card = page[page.index(f'id="approval-{approval.pk}"') :]
    assert 'data-action="approve-edited"' in card and 'data-action="deny-with-message"' in card
    # The edit starts from the proposal as JSON, and posts the proposal's hash.
    assert "&quot;url&quot;: &quot;https://example.org/q3-report.csv&quot;" in card
    assert f'value="{approval.arguments_hash}"' in card
    assert 'name="message"' in card


def test_an_edit_from_the_inbox_shows_the_new_hash(decider):
    approval = pending_approval()
    response = post_edit(decider, approval, json.dumps(EDIT))
    assert response.status_code == 200
    html = response.content.decode()
    new_hash = edit_hash(EDIT)
    assert "Approved with edited arguments" in html and new_hash in html
    assert "q4-report.csv" in html
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.APPROVED
    assert approval.edited_arguments_hash == new_hash
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.arguments_hash == new_hash and call.arguments["url"] == EDIT["url"]


@pytest.mark.parametrize(
    ("typed", "code"),
    [
        ('{"url": ', "invalid_arguments"),
        ('{"link": "https://example.org/"}', "invalid_arguments"),
        ('{"url": "http://10.0.0.7/admin"}', "url_address_not_allowed"),
    ],
)
def test_a_refused_edit_keeps_the_card_with_the_reason(decider, settings, typed, code):
    settings.ACTHELM_FETCH_ALLOW_PRIVATE = False
    approval = pending_approval()
    response = post_edit(decider, approval, typed)
    assert response.status_code == 400
    html = response.content.decode()
    assert "Nothing was decided." in html and f"[{code}]" in html
    # The card is back, open at the edit, with what the person typed.
    assert f'id="approval-{approval.pk}"' in html and "answer-edit" in html and " open>" in html
    assert f">{escape(typed)}</textarea>" in html
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.PENDING
    assert Task.objects.get(pk=approval.task_id).status == TaskStatus.AWAITING_APPROVAL


def test_an_edit_with_a_stale_hash_decides_nothing(decider):
    approval = pending_approval()
    response = decider.post(
        reverse("approvals:approve", args=[approval.pk]),
        {"arguments_hash": "0" * 64, "arguments": json.dumps(EDIT)},
        **HTMX,
    )
    assert response.status_code == 409 and "stale_decision" in response.content.decode()
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_deny_with_a_message_from_the_task_page(decider):
    approval = pending_approval()
    response = decider.post(
        reverse("approvals:deny", args=[approval.pk]),
        {
            "arguments_hash": approval.arguments_hash,
            "message": "use the report attached to the task instead",
            "task": approval.task_id,
        },
    )
    assert response.status_code == 302
    approval.refresh_from_db()
    assert approval.status == ApprovalStatus.DENIED
    assert approval.message == "use the report attached to the task instead"
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.result_for_model.startswith("denied by a person: use the report attached")
    page = decider.get(reverse("tasks:detail", args=[approval.task_id])).content.decode()
    # The transcript and the timeline say what the model was told.
    assert "use the report attached to the task instead" in page
    assert "Message to the model: use the report attached" in page


def test_the_task_page_shows_an_edit_on_the_transcript_and_the_timeline(decider):
    approval = pending_approval()
    decider.post(
        reverse("approvals:approve", args=[approval.pk]),
        {
            "arguments_hash": approval.arguments_hash,
            "arguments": json.dumps(EDIT),
            "task": approval.task_id,
        },
    )
    page = decider.get(reverse("tasks:detail", args=[approval.task_id])).content.decode()
    new_hash = edit_hash(EDIT)
    assert "with edited arguments" in page and new_hash[:14] in page
    assert f"Arguments edited by the person: hash {approval.arguments_hash[:12]}" in page


def test_the_cli_approves_an_edit_and_prints_the_new_hash(person):
    approval = pending_approval()
    out = io.StringIO()
    call_command(
        "acthelm_task", "--user", person.username, "approve", str(approval.task_id),
        str(approval.pk), "--hash", approval.arguments_hash, "--arguments", json.dumps(EDIT),
        stdout=out,
    )  # fmt: skip
    text = out.getvalue()
    assert f"runs with the edited arguments, hash {edit_hash(EDIT)}" in text
    assert f"task {approval.task_id}: ready" in text


def test_the_cli_json_answer_carries_the_decision(person):
    approval = pending_approval()
    out = io.StringIO()
    call_command(
        "acthelm_task", "--json", "--user", person.username, "deny", str(approval.task_id),
        str(approval.pk), "--hash", approval.arguments_hash, "--message", "not this one",
        stdout=out,
    )  # fmt: skip
    data = json.loads(out.getvalue())
    assert data["status"] == TaskStatus.READY
    assert data["decision"] == {
        "approval_id": approval.pk,
        "status": ApprovalStatus.DENIED,
        "arguments_hash": approval.arguments_hash,
        "edited_arguments": None,
        "edited_arguments_hash": "",
        "message": "not this one",
    }


@pytest.mark.parametrize(
    ("arguments", "words"),
    [("[]", "must be a JSON object"), ('{"url": "file:///etc/passwd"}', "url_scheme")],
)
def test_the_cli_refuses_an_invalid_edit_and_decides_nothing(person, arguments, words):
    approval = pending_approval()
    with pytest.raises(CommandError, match=words):
        call_command(
            "acthelm_task", "--user", person.username, "approve", str(approval.task_id),
            str(approval.pk), "--hash", approval.arguments_hash, "--arguments", arguments,
        )  # fmt: skip
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_the_notification_link_leads_to_the_card_with_every_answer(decider, settings):
    settings.ACTHELM_BASE_URL = "https://acthelm.example.org"
    target_add(name="founder", kind=TargetKind.EMAIL, address="founder@example.org")
    task = TaskFactory(status=TaskStatus.IN_PROGRESS, tools=["update_plan", "fetch_url"])
    approval = pending_approval(task=task)
    with transaction.atomic():
        set_status(
            lock_task(task.pk),
            TaskStatus.AWAITING_APPROVAL,
            actor=Actor.worker("w"),
            kind=EventKind.APPROVAL_REQUESTED,
        )
    # The notification's link is signed for this one approval and opens its card.
    link = urlsplit(Notification.objects.get(task=task).url)
    assert link.path.startswith("/decide/approval/")
    page = decider.get(link.path).content.decode()
    card = page[page.index(f'id="approval-{approval.pk}"') :]
    for answer in ("approve", "deny", "approve-edited", "deny-with-message"):
        assert f'data-action="{answer}"' in card
    # Every answer's form is bound to the link, so a decision from it is recorded as one.
    assert card.count('name="decision_link"') == 4


def test_a_cancel_from_the_console_form_carries_its_reason_to_the_approvals(decider):
    approval = pending_approval()
    page = decider.get(reverse("tasks:detail", args=[approval.task_id])).content.decode()
    assert 'class="action-form action-cancel"' in page and 'name="reason"' in page
    response = decider.post(
        reverse("tasks:cancel", args=[approval.task_id]), {"reason": "the report moved"}
    )
    assert response.status_code == 302
    approval.refresh_from_db()
    assert (approval.status, approval.message) == (ApprovalStatus.CANCELLED, "the report moved")
    event = TaskEvent.objects.get(task_id=approval.task_id, kind=EventKind.CANCELLED)
    assert event.data["reason"] == "the report moved"
    page = decider.get(reverse("tasks:detail", args=[approval.task_id])).content.decode()
    assert "Reason: the report moved" in page


def test_a_cancel_reason_is_bounded(decider):
    approval = pending_approval()
    response = decider.post(
        reverse("tasks:cancel", args=[approval.task_id]), {"reason": "x" * 501}, **HTMX
    )
    assert response.status_code == 400
    assert Task.objects.get(pk=approval.task_id).status == TaskStatus.AWAITING_APPROVAL
