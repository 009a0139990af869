"""Overruling the supervisor from the console and the admin: the task page shows the rejected
run (answer, artifacts previewed, failed checks marked task or default check), accepts it into
review with a reason, and the Change form edits a task then retries it now."""

import pytest
from django.urls import reverse

from tasks.models import Task, TaskEvent
from tasks.services import default_limits
from tasks.states import EventKind, TaskStatus
from tests.agents.rejections import rejected_task
from tests.factories import TaskFactory, UserFactory

pytestmark = pytest.mark.django_db

PERMS = ["tasks.view_task", "tasks.close_task", "tasks.operate_task", "tasks.change_task"]


@pytest.fixture
def boss(client):
    client.force_login(UserFactory(username="boss", perms=PERMS))
    return client


def detail(task) -> str:
    return reverse("tasks:detail", args=[task.pk])


@pytest.mark.parametrize("failed", [False, True], ids=["retry-scheduled", "failed"])
def test_the_task_page_shows_the_rejected_run_and_offers_accept(boss, failed):
    task = rejected_task(failed=failed)
    page = boss.get(detail(task)).content.decode()
    assert 'id="rejected-run"' in page and "Rejected by the supervisor" in page
    assert "The summary is in report.md" in page  # the run's answer
    assert "<li>one</li>" in page  # report.md previewed as Markdown, as review previews it
    assert "named_output=summary.md" in page and 'data-source="default check"' in page
    assert "answer_contains=four" in page and 'data-source="task check"' in page
    assert 'id="accept-form"' in page and reverse("tasks:accept", args=[task.pk]) in page
    assert reverse("tasks:edit", args=[task.pk]) in page


def test_accept_is_not_offered_without_a_rejected_run(boss):
    task = TaskFactory(status=TaskStatus.FAILED)
    page = boss.get(detail(task)).content.decode()
    assert 'id="accept-form"' not in page and 'id="rejected-run"' not in page


def test_accept_is_not_offered_again_after_a_reopen(boss):
    """Accepted, then reopened with feedback: the same run is not offered (nor taken) again."""
    task = rejected_task()
    boss.post(reverse("tasks:accept", args=[task.pk]), {"reason": "fine"})
    boss.post(reverse("tasks:reopen", args=[task.pk]), {"feedback": "Write summary.md"})
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.feedback == "Write summary.md"
    page = boss.get(detail(task)).content.decode()
    assert 'id="accept-form"' not in page
    boss.post(reverse("tasks:accept", args=[task.pk]), {"reason": "fine after all"})
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.feedback == "Write summary.md"
    assert TaskEvent.objects.filter(task=task, kind=EventKind.ACCEPTED).count() == 1


def test_accept_is_not_offered_without_the_close_permission(client):
    task = rejected_task()
    client.force_login(UserFactory(perms=["tasks.view_task", "tasks.operate_task"]))
    page = client.get(detail(task)).content.decode()
    assert 'id="rejected-run"' in page and 'id="accept-form"' not in page
    response = client.post(reverse("tasks:accept", args=[task.pk]), {"reason": "fine"})
    assert response.status_code == 403
    assert Task.objects.get(pk=task.pk).status == TaskStatus.READY


def test_accepting_from_the_page_lands_in_review_with_who_and_why(boss):
    task = rejected_task()
    response = boss.post(reverse("tasks:accept", args=[task.pk]), {"reason": "report.md is fine"})
    assert response.status_code == 302
    assert Task.objects.get(pk=task.pk).status == TaskStatus.REVIEW
    page = boss.get(detail(task)).content.decode()
    assert 'id="accepted-by"' in page and "boss" in page and "report.md is fine" in page
    assert "named_output=summary.md" in page  # the failed checks stay visible
    assert "Accepted by a person" in page  # the timeline
    assert 'id="accept-form"' not in page
    # The review queue lists it with that run's answer.
    review = boss.get(reverse("tasks:review")).content.decode()
    assert f"#{task.pk}" in review or task.title in review


def test_accepting_without_a_reason_changes_nothing(boss):
    task = rejected_task()
    response = boss.post(reverse("tasks:accept", args=[task.pk]), {"reason": " "})
    assert response.status_code == 400
    assert "invalid_input" in response.content.decode()
    assert Task.objects.get(pk=task.pk).status == TaskStatus.READY


def _edit_form(task, **more):
    data = {
        "instruction": task.instruction,
        "acceptance_checks": "",
        "tools": list(task.tools),
    }
    data |= {k: "" if v is None else str(v) for k, v in default_limits().items()}
    return data | more


def test_the_change_form_edits_and_retries_now(boss):
    task = rejected_task(failed=True)
    page = boss.get(reverse("tasks:edit", args=[task.pk])).content.decode()
    assert "Save and retry now" in page and task.instruction in page
    form = _edit_form(
        task,
        instruction="Summarise notes.txt and write the bullets to report.md",
        acceptance_checks="artifact=report.md",
        retry="1",
    )
    response = boss.post(reverse("tasks:edit", args=[task.pk]), form)
    assert response.status_code == 302, response.content.decode()
    task.refresh_from_db()
    assert task.status == TaskStatus.READY
    assert task.instruction.endswith("report.md")
    assert task.acceptance_checks == [{"kind": "artifact", "value": "report.md"}]
    edited = TaskEvent.objects.get(task=task, kind=EventKind.EDITED)
    assert set(edited.data["fields"]) == {"instruction", "acceptance_checks"}
    page = boss.get(detail(task)).content.decode()
    assert "Settings edited" in page and "→" in page


def test_the_change_form_refuses_a_bad_check_and_keeps_the_task(boss):
    task = rejected_task(failed=True)
    form = _edit_form(task, acceptance_checks="tool_ran=fetch_url")
    response = boss.post(reverse("tasks:edit", args=[task.pk]), form)
    assert response.status_code == 400
    assert "acceptance_check_invalid" in response.content.decode()
    assert Task.objects.get(pk=task.pk).acceptance_checks == []


def test_the_change_form_refuses_a_running_task(boss):
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    page = boss.get(reverse("tasks:edit", args=[task.pk])).content.decode()
    assert "pause it before changing it" in page
    response = boss.post(
        reverse("tasks:edit", args=[task.pk]), _edit_form(task, instruction="Other")
    )
    assert response.status_code == 409
    assert "a worker holds it" in response.content.decode()
    assert Task.objects.get(pk=task.pk).instruction == "Summarise the input files."


@pytest.mark.parametrize("status", [TaskStatus.DONE, TaskStatus.CANCELLED])
def test_a_closed_or_cancelled_task_offers_no_change_and_refuses_one(boss, status):
    task = TaskFactory(status=status)
    page = boss.get(detail(task)).content.decode()
    assert 'id="edit-task"' not in page
    response = boss.post(
        reverse("tasks:edit", args=[task.pk]), _edit_form(task, instruction="Other")
    )
    assert response.status_code == 409
    assert "a closed or cancelled task is not edited" in response.content.decode()
    assert Task.objects.get(pk=task.pk).instruction == "Summarise the input files."
    assert not TaskEvent.objects.filter(task=task, kind=EventKind.EDITED).exists()


# --- The admin -----------------------------------------------------------------------------

CHANGELIST = reverse("admin:tasks_task_changelist")


def test_the_admin_accept_action_asks_why_then_accepts(client, person):
    client.force_login(person)
    rejected, other = rejected_task(), TaskFactory(status=TaskStatus.FAILED)
    selected = {"action": "accept_tasks", "_selected_action": [rejected.pk, other.pk]}
    page = client.post(CHANGELIST, selected)
    assert page.status_code == 200 and 'name="reason"' in page.content.decode()
    assert Task.objects.get(pk=rejected.pk).status == TaskStatus.READY  # nothing yet
    missing = client.post(CHANGELIST, {**selected, "apply": "1", "reason": ""})
    assert "Fill in every field: reason" in missing.content.decode()
    done = client.post(CHANGELIST, {**selected, "apply": "1", "reason": "good enough"}, follow=True)
    text = done.content.decode()
    assert "Accepted into review: 1 task(s)." in text
    assert f"#{other.pk}" in text and "transition_not_allowed" in text
    assert Task.objects.get(pk=rejected.pk).status == TaskStatus.REVIEW
    event = TaskEvent.objects.get(task=rejected, kind=EventKind.ACCEPTED)
    assert event.data["reason"] == "good enough" and event.actor_label == "founder"


def test_the_admin_page_of_a_rejected_task_links_the_console_form(client, person):
    client.force_login(person)
    task = rejected_task()
    page = client.get(reverse("admin:tasks_task_change", args=[task.pk])).content.decode()
    assert 'id="accept-link"' in page and "accept_tasks" in page


def test_the_admin_accept_action_needs_the_close_permission(client):
    client.force_login(
        UserFactory(perms=["tasks.view_task", "tasks.change_task", "tasks.operate_task"])
    )
    rejected_task()
    assert "accept_tasks" not in client.get(CHANGELIST).content.decode()
