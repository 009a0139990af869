import pytest
from django.urls import reverse

from tasks.models import Goal, Task
from tasks.states import TaskStatus
from tests.factories import TaskFactory, UserFactory

pytestmark = pytest.mark.django_db

CHANGELIST = reverse("admin:tasks_task_changelist")


def _post_action(client, action, tasks, query=""):
    return client.post(
        CHANGELIST + query,
        {"action": action, "_selected_action": [t.pk for t in tasks]},
        follow=True,
    )


def test_task_list_filters_and_search(client, person):
    client.force_login(person)
    TaskFactory(title="Quarterly report", status=TaskStatus.REVIEW)
    TaskFactory(title="Other", status=TaskStatus.READY)
    response = client.get(CHANGELIST, {"status__exact": "review", "q": "Quarterly"})
    assert response.status_code == 200
    assert b"Quarterly report" in response.content and b"Other" not in response.content


def test_task_page_shows_the_timeline(client, person, actor):
    from agents.engine.run.intake import task_create

    client.force_login(person)
    task = task_create(actor=actor, title="T", instruction="I")
    response = client.get(reverse("admin:tasks_task_change", args=[task.pk]))
    assert response.status_code == 200
    assert b"created" in response.content


def test_close_is_offered_only_on_the_review_queue(client, person):
    client.force_login(person)
    TaskFactory(status=TaskStatus.REVIEW)
    page = client.get(CHANGELIST).content.decode()
    assert "close_tasks" not in page
    page = client.get(CHANGELIST, {"status__exact": "review"}).content.decode()
    assert "close_tasks" in page


def test_close_action_closes_review_tasks(client, person):
    client.force_login(person)
    review = TaskFactory(status=TaskStatus.REVIEW)
    _post_action(client, "close_tasks", [review], "?status__exact=review")
    assert Task.objects.get(pk=review.pk).status == TaskStatus.DONE


def test_close_action_refused_without_permission(client):
    viewer = UserFactory(username="viewer2", perms=["tasks.view_task"])
    client.force_login(viewer)
    review = TaskFactory(status=TaskStatus.REVIEW)
    page = client.get(CHANGELIST, {"status__exact": "review"}).content.decode()
    assert "close_tasks" not in page
    _post_action(client, "close_tasks", [review], "?status__exact=review")
    assert Task.objects.get(pk=review.pk).status == TaskStatus.REVIEW


@pytest.mark.parametrize(
    ("action", "start", "end"),
    [
        ("cancel_tasks", TaskStatus.READY, TaskStatus.CANCELLED),
        ("retry_tasks", TaskStatus.FAILED, TaskStatus.READY),
        ("pause_tasks", TaskStatus.READY, TaskStatus.PAUSED),
        ("resume_tasks", TaskStatus.PAUSED, TaskStatus.READY),
    ],
)
def test_operate_actions_call_the_services(client, person, action, start, end):
    client.force_login(person)
    task = TaskFactory(status=start)
    _post_action(client, action, [task])
    assert Task.objects.get(pk=task.pk).status == end


def test_reopen_action_on_the_review_queue(client, person):
    client.force_login(person)
    task = TaskFactory(status=TaskStatus.REVIEW)
    _post_action(client, "reopen_tasks", [task], "?status__exact=review")
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.feedback


def test_an_action_on_a_task_in_the_wrong_state_reports_and_changes_nothing(client, person):
    client.force_login(person)
    task = TaskFactory(status=TaskStatus.DONE)
    response = _post_action(client, "cancel_tasks", [task])
    assert b"transition_not_allowed" in response.content
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DONE


def test_operate_actions_refused_without_permission(client):
    viewer = UserFactory(username="viewer3", perms=["tasks.view_task"])
    client.force_login(viewer)
    task = TaskFactory(status=TaskStatus.READY)
    _post_action(client, "cancel_tasks", [task])
    assert Task.objects.get(pk=task.pk).status == TaskStatus.READY


def test_admin_requires_login(client):
    response = client.get(CHANGELIST)
    assert response.status_code == 302 and "/admin/login/" in response["Location"]


def test_close_on_the_page_of_a_task_in_review(client, person):
    client.force_login(person)
    review = TaskFactory(status=TaskStatus.REVIEW)
    url = reverse("admin:tasks_task_change", args=[review.pk])
    assert "close_tasks" in client.get(url).content.decode()
    client.post(url, {"CHANGE_FORM-action": "close_tasks", "_selected_action": [review.pk]})
    assert Task.objects.get(pk=review.pk).status == TaskStatus.DONE
    running = TaskFactory(status=TaskStatus.IN_PROGRESS)
    page = client.get(reverse("admin:tasks_task_change", args=[running.pk])).content.decode()
    assert "close_tasks" not in page


def test_saving_a_task_page_never_undoes_a_claim_made_after_it_was_loaded(client, person):
    from agents.engine.store import claim_next

    client.force_login(person)
    task = TaskFactory(status=TaskStatus.READY, priority=1)
    url = reverse("admin:tasks_task_change", args=[task.pk])
    form = client.get(url).context["adminform"].form
    data = {k: v for k, v in form.initial.items() if v is not None and k in form.fields}
    data.update(
        {
            "title": "Renamed",
            "instruction": task.instruction,
            "priority": 1,
            "tools": ",".join(task.tools),
            "tool_policies": "{}",
            "allowed_domains": "",
            "tags": "",
            "kind": task.kind,
            "origin": task.origin,
        }
    )
    claim_next(worker_id="w1")  # a worker claims it while the page is open
    client.post(url, data)
    task.refresh_from_db()
    assert task.status == TaskStatus.IN_PROGRESS and task.lease_owner == "w1"
    assert task.claim_count == 1 and task.title != "Renamed"


def test_the_admin_says_task_dependencies(client):
    client.force_login(UserFactory(username="root", is_superuser=True))
    task = TaskFactory(status=TaskStatus.READY)
    page = client.get(reverse("admin:tasks_task_change", args=[task.pk])).content.decode()
    assert "Task dependencies" in page and "dependencys" not in page


def test_a_goal_added_in_the_admin_goes_through_goal_create(client, caplog):
    """The admin's goal form calls the one `goal_create` every door calls: the goal records the
    person who created it and the creation is logged, as through the console, the API or the
    CLI (the form once saved the row directly, with no creator)."""
    keeper = UserFactory(username="keeper", perms=["tasks.add_goal", "tasks.view_goal"])
    client.force_login(keeper)
    with caplog.at_level("INFO", logger="acthelm.tasks"):
        response = client.post(
            reverse("admin:tasks_goal_add"),
            {"title": "Launch", "description": "soon", "active": "on"},
            follow=True,
        )
    assert response.status_code == 200
    goal = Goal.objects.get()
    assert (goal.title, goal.description, goal.active) == ("Launch", "soon", True)
    assert goal.created_by == keeper
    assert [r.getMessage() for r in caplog.records] == ["goal.created"]


def test_a_goal_deactivated_in_the_admin_goes_through_goal_deactivate(client, caplog):
    keeper = UserFactory(
        username="keeper", perms=["tasks.add_goal", "tasks.change_goal", "tasks.view_goal"]
    )
    goal = Goal.objects.create(title="Launch")
    client.force_login(keeper)
    with caplog.at_level("INFO", logger="acthelm.tasks"):
        client.post(
            reverse("admin:tasks_goal_change", args=[goal.pk]),
            {"title": "Launch", "description": ""},  # "active" unchecked
            follow=True,
        )
    goal.refresh_from_db()
    assert not goal.active
    assert [r.getMessage() for r in caplog.records] == ["goal.deactivated"]
