"""The API answers an approval as Agent Inbox does: approve with edited arguments (the response
names the edit's hash), deny with a message, cancel with a reason; each bound to the hash."""

import pytest

from agents.catalogue.tools import get_tool, operation_hash
from agents.models import ToolCall
from approvals.models import Approval
from approvals.states import ApprovalStatus
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.api.conftest import error_of
from tests.console.scenes import pending_approval

pytestmark = pytest.mark.django_db

EDIT = {"url": "https://example.org/q4-report.csv"}


def url(approval, verb: str) -> str:
    return f"/api/tasks/{approval.task_id}/approvals/{approval.pk}/{verb}"


def test_approve_with_edited_arguments_returns_the_new_hash(api):
    approval = pending_approval()
    response = api.post(
        url(approval, "approve"), {"arguments_hash": approval.arguments_hash, "arguments": EDIT}
    )
    assert response.status_code == 200, response.content
    data = response.json()
    new_hash = operation_hash("fetch_url", get_tool("fetch_url").parse(EDIT))
    assert data["status"] == TaskStatus.READY
    assert data["decision"]["status"] == ApprovalStatus.APPROVED
    assert data["decision"]["arguments_hash"] == approval.arguments_hash
    assert data["decision"]["edited_arguments_hash"] == new_hash
    assert data["decision"]["edited_arguments"]["url"] == EDIT["url"]
    assert ToolCall.objects.get(pk=approval.tool_call_id).arguments_hash == new_hash


@pytest.mark.parametrize(
    ("arguments", "code"),
    [
        ({"url": 5}, "invalid_arguments"),
        ({"url": "http://169.254.169.254/latest"}, "url_address_not_allowed"),
        ({"url": "gopher://example.org/"}, "url_scheme_not_allowed"),
    ],
)
def test_a_refused_edit_is_400_naming_why_and_decides_nothing(api, settings, arguments, code):
    settings.ACTHELM_FETCH_ALLOW_PRIVATE = False
    approval = pending_approval()
    response = api.post(
        url(approval, "approve"),
        {"arguments_hash": approval.arguments_hash, "arguments": arguments},
    )
    assert response.status_code == 400, response.content
    data = error_of(response)
    assert data["code"] == code and data["field"] == "arguments"
    assert "edited arguments" in data["message"]
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_an_edit_with_a_stale_hash_is_409(api):
    approval = pending_approval()
    response = api.post(url(approval, "approve"), {"arguments_hash": "0" * 64, "arguments": EDIT})
    assert response.status_code == 409 and error_of(response)["code"] == "stale_decision"
    assert ToolCall.objects.get(pk=approval.tool_call_id).arguments == approval.arguments


def test_deny_with_a_message(api):
    approval = pending_approval()
    response = api.post(
        url(approval, "deny"),
        {"arguments_hash": approval.arguments_hash, "message": "use notes.txt instead"},
    )
    assert response.status_code == 200, response.content
    assert response.json()["decision"]["message"] == "use notes.txt instead"
    call = ToolCall.objects.get(pk=approval.tool_call_id)
    assert call.result_for_model.startswith("denied by a person: use notes.txt instead")
    event = TaskEvent.objects.get(task_id=approval.task_id, kind=EventKind.DENIED)
    assert event.data["message"] == "use notes.txt instead"


def test_a_deny_message_is_bounded_and_deny_takes_no_arguments(api):
    approval = pending_approval()
    too_long = api.post(
        url(approval, "deny"), {"arguments_hash": approval.arguments_hash, "message": "x" * 2001}
    )
    assert too_long.status_code == 400 and error_of(too_long)["field"] == "message"
    unknown = api.post(
        url(approval, "deny"), {"arguments_hash": approval.arguments_hash, "arguments": EDIT}
    )
    assert unknown.status_code == 422 and error_of(unknown)["code"] == "unknown_field"
    assert Approval.objects.get(pk=approval.pk).status == ApprovalStatus.PENDING


def test_a_cancel_reason_reaches_the_settled_approvals(api):
    approval = pending_approval()
    response = api.post(f"/api/tasks/{approval.task_id}/cancel", {"reason": "out of scope"})
    assert response.status_code == 200, response.content
    approval.refresh_from_db()
    assert (approval.status, approval.message) == (ApprovalStatus.CANCELLED, "out of scope")
    assert Task.objects.get(pk=approval.task_id).status == TaskStatus.CANCELLED
