"""Overruling the supervisor through the API and `acthelm_task`: accept the rejected run into
review (POST /api/tasks/{id}/accept, `acthelm_task accept ID --reason`), change a task and retry
it (PATCH /api/tasks/{id}, `acthelm_task edit ID …`), each through the console's services."""

import json

import pytest

from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.agents.rejections import rejected_task
from tests.api.conftest import client_for, error_of
from tests.factories import TaskFactory, UserFactory


@pytest.mark.django_db
def test_the_task_document_carries_the_rejection(api):
    task = rejected_task()
    data = api.get(f"/api/tasks/{task.pk}").json()
    rejection = data["rejection"]
    assert rejection["run"] == 1 and rejection["accepted"] is None
    assert [(c["check"], c["source"]) for c in rejection["failed_checks"]] == [
        ("named_output=summary.md", "default check"),
        ("answer_contains=four", "task check"),
    ]


@pytest.mark.django_db
def test_accept_through_the_api(api):
    task = rejected_task(failed=True)
    response = api.post(f"/api/tasks/{task.pk}/accept", {"reason": "report.md will do"})
    assert response.status_code == 200, response.content
    assert response.json()["status"] == TaskStatus.REVIEW
    event = TaskEvent.objects.get(task=task, kind=EventKind.ACCEPTED)
    assert event.data["reason"] == "report.md will do" and event.actor_label == "founder"
    accepted = api.get(f"/api/tasks/{task.pk}").json()["rejection"]["accepted"]
    assert accepted["by"] == "founder" and accepted["reason"] == "report.md will do"


@pytest.mark.django_db
def test_accept_through_the_api_refuses_clearly(api):
    task = rejected_task()
    assert error_of(api.post(f"/api/tasks/{task.pk}/accept", {}))["field"] == "reason"
    never_rejected = TaskFactory(status=TaskStatus.FAILED)
    refused = api.post(f"/api/tasks/{never_rejected.pk}/accept", {"reason": "fine"})
    assert refused.status_code == 409 and error_of(refused)["code"] == "transition_not_allowed"
    operator = client_for("operator", ["tasks.view_task", "tasks.operate_task"])
    forbidden = operator.post(f"/api/tasks/{task.pk}/accept", {"reason": "fine"})
    assert forbidden.status_code == 403
    assert Task.objects.get(pk=task.pk).status == TaskStatus.READY


@pytest.mark.django_db
def test_a_reopen_is_not_undone_by_a_second_accept_through_the_api(api):
    task = rejected_task()
    assert api.post(f"/api/tasks/{task.pk}/accept", {"reason": "fine"}).status_code == 200
    reopened = api.post(f"/api/tasks/{task.pk}/reopen", {"feedback": "Write summary.md"})
    assert reopened.status_code == 200, reopened.content
    again = api.post(f"/api/tasks/{task.pk}/accept", {"reason": "fine after all"})
    assert again.status_code == 409 and error_of(again)["code"] == "transition_not_allowed"
    assert "already accepted by founder" in error_of(again)["message"]
    data = api.get(f"/api/tasks/{task.pk}").json()
    assert data["status"] == TaskStatus.READY
    assert Task.objects.get(pk=task.pk).feedback == "Write summary.md"
    assert TaskEvent.objects.filter(task=task, kind=EventKind.ACCEPTED).count() == 1


@pytest.mark.django_db
def test_edit_and_retry_through_the_api(api):
    task = rejected_task(failed=True)
    response = api.patch(
        f"/api/tasks/{task.pk}",
        {
            "instruction": "Write the bullets to report.md",
            "acceptance_checks": ["artifact=report.md"],
            "limits": {"limit_turns": 30},
            "retry": True,
        },
    )
    assert response.status_code == 200, response.content
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.limit_turns == 30
    assert task.acceptance_checks == [{"kind": "artifact", "value": "report.md"}]
    edited = TaskEvent.objects.get(task=task, kind=EventKind.EDITED)
    assert edited.data["after"]["instruction"] == "Write the bullets to report.md"


@pytest.mark.django_db
def test_edit_through_the_api_is_refused_under_a_worker_and_for_bad_input(api):
    running = TaskFactory(status=TaskStatus.IN_PROGRESS)
    refused = api.patch(f"/api/tasks/{running.pk}", {"instruction": "Other"})
    assert refused.status_code == 409 and "a worker holds it" in error_of(refused)["message"]
    task = rejected_task(failed=True)
    bad = api.patch(f"/api/tasks/{task.pk}", {"acceptance_checks": ["nonsense=1"]})
    assert bad.status_code == 400 and error_of(bad)["field"] == "acceptance_checks"
    unknown = api.patch(f"/api/tasks/{task.pk}", {"colour": "red"})
    assert unknown.status_code == 422
    assert api.patch("/api/tasks/999999", {"instruction": "x"}).status_code == 404


# --- acthelm_task ---------------------------------------------------------------------------


@pytest.fixture
def reviewer(transactional_db):
    return UserFactory(
        username="rev", perms=["tasks.view_task", "tasks.close_task", "tasks.operate_task"]
    )


def test_accept_from_the_cli(manage, reviewer):
    task = rejected_task()
    shown = manage("acthelm_task", "--user", "rev", "show", str(task.pk), check=True).stdout
    assert "rejected run 1:" in shown
    assert "failed default check: named_output=summary.md" in shown
    assert "failed task check: answer_contains=four" in shown
    missing = manage("acthelm_task", "--user", "rev", "accept", str(task.pk))
    assert missing.returncode != 0 and "--reason" in missing.stderr
    result = manage(
        "acthelm_task",
        "--user",
        "rev",
        "--json",
        "accept",
        str(task.pk),
        "--reason",
        "good enough",
        check=True,
    )
    assert json.loads(result.stdout)["status"] == TaskStatus.REVIEW
    event = TaskEvent.objects.get(task=task, kind=EventKind.ACCEPTED)
    assert event.data["reason"] == "good enough" and event.actor_label == "rev"
    shown = manage("acthelm_task", "--user", "rev", "show", str(task.pk), check=True).stdout
    assert "accepted into review by rev: good enough" in shown
    again = manage("acthelm_task", "--user", "rev", "accept", str(task.pk), "--reason", "x")
    assert again.returncode != 0 and "transition_not_allowed" in again.stderr


def test_edit_from_the_cli(manage, reviewer):
    task = rejected_task(failed=True)
    result = manage(
        "acthelm_task",
        "--user",
        "rev",
        "--json",
        "edit",
        str(task.pk),
        "--instruction",
        "Write the bullets to report.md",
        "--expect",
        "artifact=report.md",
        "--tool",
        "read_file",
        "--tool",
        "write_artifact",
        "--limit",
        "limit_turns=25",
        "--retry",
        check=True,
    )
    assert json.loads(result.stdout)["status"] == TaskStatus.READY
    task.refresh_from_db()
    assert task.instruction == "Write the bullets to report.md"
    assert task.acceptance_checks == [{"kind": "artifact", "value": "report.md"}]
    assert task.tools == ["read_file", "write_artifact"] and task.limit_turns == 25
    kinds = list(task.events.order_by("id").values_list("kind", flat=True))
    assert kinds[-2:] == [EventKind.EDITED, EventKind.RETRIED]
    nothing = manage("acthelm_task", "--user", "rev", "edit", str(task.pk))
    assert nothing.returncode != 0 and "say what to change" in nothing.stderr
    bad = manage("acthelm_task", "--user", "rev", "edit", str(task.pk), "--expect", "x=1")
    assert bad.returncode != 0 and "acceptance_check_invalid" in bad.stderr
