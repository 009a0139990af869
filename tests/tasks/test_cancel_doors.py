"""A person's cancel is one call (`agents.actions.task.task_cancel`), whichever door it comes
through: the console, the admin, the CLI and the API each settle the same runs, calls in flight and
open decisions in the same transaction, and record the same `cancelled` event."""

import io
import json

import pytest
from django.core.management import call_command
from django.urls import reverse

from acthelm_site.api.tokens import token_create
from agents.actions import task as person_task
from agents.engine import store
from agents.models import AgentRun, ToolCall
from agents.states import RunStatus, ToolCallStatus
from approvals import services as approvals_services
from approvals.models import Approval, ReviewDecision
from tasks import services as ledger
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.api.conftest import ApiClient
from tests.factories import (
    AgentRunFactory,
    ApprovalFactory,
    ReviewDecisionFactory,
    TaskFactory,
    ToolCallFactory,
    TurnFactory,
    UserFactory,
)

pytestmark = pytest.mark.django_db

PERMS = ["tasks.view_task", "tasks.operate_task", "tasks.change_task"]


def _running_task() -> Task:
    """A task whose attempt is running, with a call in flight and two open decisions."""
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    run = AgentRunFactory(task=task)
    turn = TurnFactory(run=run, task=task)
    ToolCallFactory(turn=turn, status=ToolCallStatus.RUNNING)
    ApprovalFactory(tool_call=ToolCallFactory(turn=turn, status=ToolCallStatus.AWAITING_APPROVAL))
    ReviewDecisionFactory(tool_call=ToolCallFactory(turn=turn, status=ToolCallStatus.UNKNOWN))
    return task


def _by_console(client, person, task):
    client.force_login(person)
    response = client.post(reverse("tasks:cancel", args=[task.pk]), {"reason": "not needed"})
    assert response.status_code == 302


def _by_admin(client, person, task):
    client.force_login(person)
    response = client.post(
        reverse("admin:tasks_task_changelist"),
        {"action": "cancel_tasks", "_selected_action": [task.pk]},
    )
    assert response.status_code == 302


def _by_cli(client, person, task):
    out = io.StringIO()
    call_command(
        "acthelm_task", "--json", "--user", person.username, "cancel", str(task.pk),
        "--reason", "not needed", stdout=out,
    )  # fmt: skip
    assert json.loads(out.getvalue())["status"] == TaskStatus.CANCELLED


def _by_api(client, person, task):
    api = ApiClient(token_create(user=person, name="tests").secret)
    response = api.post(f"/api/tasks/{task.pk}/cancel", {"reason": "not needed"})
    assert response.status_code == 200, response.content


DOORS = {"console": _by_console, "admin": _by_admin, "cli": _by_cli, "api": _by_api}


def _what_a_cancel_did(task: Task) -> dict:
    event = TaskEvent.objects.get(task=task, kind=EventKind.CANCELLED)
    data = dict(event.data)
    # The admin asks for no reason (every other door passed the same one); the API's events name
    # the token that acted, as every API event does.
    data.pop("reason")
    data.pop("api_token", None)
    return {
        "status": Task.objects.get(pk=task.pk).status,
        "event": (event.actor_kind, event.from_status, event.to_status),
        "data": {
            "runs_cancelled": len(data.pop("runs_cancelled")),
            "calls_in_flight": len(data.pop("calls_in_flight")),
            **data,
        },
        "runs": sorted(AgentRun.objects.filter(task=task).values_list("status", "error_code")),
        "calls": sorted(ToolCall.objects.filter(task=task).values_list("status", "error_code")),
        "approvals": list(Approval.objects.filter(task=task).values_list("status", flat=True)),
        "reviews": list(ReviewDecision.objects.filter(task=task).values_list("choice", flat=True)),
    }


def test_a_cancel_from_each_door_does_the_same(client):
    person = UserFactory(username="operator", perms=PERMS)
    done = {}
    for door, cancel in DOORS.items():
        task = _running_task()
        cancel(client, person, task)
        done[door] = _what_a_cancel_did(task)
    assert done["console"] == {
        "status": TaskStatus.CANCELLED,
        "event": ("person", TaskStatus.IN_PROGRESS, TaskStatus.CANCELLED),
        "data": {
            "runs_cancelled": 1,
            "calls_in_flight": 1,
            "approvals_settled": 1,
            "reviews_settled": 1,
        },
        "runs": [(RunStatus.CANCELLED, "cancelled")],
        "calls": sorted(
            [
                (ToolCallStatus.UNKNOWN, "cancelled_in_flight"),
                (ToolCallStatus.AWAITING_APPROVAL, ""),
                (ToolCallStatus.UNKNOWN, ""),
            ]
        ),
        "approvals": ["cancelled"],
        "reviews": ["cancelled"],
    }
    for door in DOORS:
        assert done[door] == done["console"], door


def test_the_cancel_settles_the_runs_and_the_decisions_by_direct_calls():
    """No clean-up registered at start-up: the cancel action calls the run's store and the
    approvals directly, and the ledger keeps no registry of them."""
    assert person_task.settle_runs_for_cancel is store.settle_for_cancelled_task
    assert person_task.settle_decisions_for_cancel is approvals_services.settle_for_cancelled_task
    assert not hasattr(ledger, "settle_on_cancel") and not hasattr(ledger, "task_cancel")
