"""The registry of console actions: each entry is complete, and the page, the admin, the CLI, the
URLs and the API are derived from it (an entry added there appears in all of them)."""

import re

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.core.management import load_command_class
from django.urls import reverse

from acthelm_site.api import endpoints
from console.actions import REGISTRY, decision_actions, task_actions
from core.actors import Actor
from core.exceptions import NotPermitted
from tasks.models import Task
from tasks.states import Action, TaskStatus
from tests.factories import TaskFactory, UserFactory

pytestmark = pytest.mark.django_db

EVERY_PERM = [
    "tasks.view_task",
    "tasks.add_task",
    "tasks.close_task",
    "tasks.operate_task",
    "approvals.decide_approval",
]


def test_every_action_is_declared_once_with_its_permission_service_and_states():
    assert set(REGISTRY) == set(Action)
    for name, entry in REGISTRY.items():
        assert entry.name == name and entry.label == Action(name).label
        app, codename = entry.perm.split(".")
        assert Permission.objects.filter(content_type__app_label=app, codename=codename).exists()
        assert callable(entry.service)
        assert entry.states, f"{name} applies in no state"
        assert entry.success and entry.style in ("", "primary", "danger")
        assert entry.target in ("task", "approval", "review")
    assert {e.name for e in decision_actions("approval")} == {Action.APPROVE, Action.DENY}
    assert {e.name for e in decision_actions("review")} == {Action.RUN_AGAIN, Action.SKIP}


@pytest.mark.parametrize("entry", task_actions(), ids=lambda entry: str(entry.name))
def test_the_service_enforces_the_declared_permission(entry):
    """A person with every permission but the declared one is refused by the service itself."""
    others = [perm for perm in EVERY_PERM if perm != entry.perm]
    person = Actor.person(UserFactory(username=f"no-{entry.name}", perms=others))
    task = TaskFactory(status=sorted(entry.states)[0])
    inputs = {i.name: "because" for i in entry.inputs if i.required}
    with pytest.raises(NotPermitted):
        entry.call(actor=person, target_id=task.pk, **inputs)
    assert Task.objects.filter(pk=task.pk, status=task.status).exists()


def rejected_in(status):
    """A task whose newest run the supervisor rejected, then put in `status`."""
    from datetime import timedelta

    from django.utils import timezone

    from tasks.states import HELD
    from tests.agents.rejections import rejected_task

    task = rejected_task()
    lease = {}
    if status in HELD:
        lease = {"lease_owner": "w", "lease_expires_at": timezone.now() + timedelta(seconds=60)}
    Task.objects.filter(pk=task.pk).update(status=status, **lease)
    return task


@pytest.mark.parametrize("entry", task_actions(), ids=lambda entry: str(entry.name))
def test_the_task_page_renders_its_button_in_exactly_its_states(client, entry):
    client.force_login(UserFactory(username="boss", perms=EVERY_PERM))
    for status in TaskStatus:
        task = TaskFactory(status=status)
        if entry.name == Action.ACCEPT:  # it applies to a rejected run: the task has one
            task = rejected_in(status)
        page = client.get(reverse("tasks:detail", args=[task.pk])).content.decode()
        assert "{#" not in page and "{%" not in page  # no template comment or tag leaks
        shown = f'data-action="{entry.name}"' in page
        assert shown == (status in entry.states), (entry.name, status)
        if shown:
            assert f'action="{reverse(entry.url_name, args=[task.pk])}"' in page
            if entry.confirm:
                assert entry.confirm.format(pk=task.pk) in page


def test_the_page_offers_only_the_actions_of_the_declared_permission(client):
    client.force_login(
        UserFactory(username="operator", perms=["tasks.view_task", "tasks.operate_task"])
    )
    task = TaskFactory(status=TaskStatus.REVIEW)
    page = client.get(reverse("tasks:detail", args=[task.pk])).content.decode()
    offered = set(re.findall(r'data-action="(\w+)"', page))
    expected = {
        e.name
        for e in task_actions()
        if TaskStatus.REVIEW in e.states and e.perm == "tasks.operate_task"
    }
    assert offered == expected == {Action.CANCEL}


def test_each_entry_has_its_url_and_its_cli_subcommand():
    command = load_command_class("console", "acthelm_task")
    parser = command.create_parser("manage.py", "acthelm_task")
    subcommands = next(a for a in parser._actions if a.dest == "action").choices
    for entry in REGISTRY.values():
        assert entry.slug in subcommands, entry.name
        assert reverse(entry.url_name, args=[1]).rstrip("/").endswith(entry.slug)
        assert endpoints.ACTION_PERMS[entry.name] == entry.perm


def test_the_admin_actions_are_the_entries_that_declare_one(client, person):
    task_admin = admin.site._registry[Task]
    names = {getattr(a, "__name__", "") for a in task_admin.actions}
    assert names == {e.admin_name for e in task_actions() if e.admin}
    assert all(e.admin_done for e in task_actions() if e.admin)
    # Each is offered on a task's page exactly where the registry says.
    client.force_login(person)
    for status in TaskStatus:
        task = TaskFactory(status=status)
        page = client.get(reverse("admin:tasks_task_change", args=[task.pk])).content.decode()
        for entry in task_actions():
            if entry.admin:
                expected = not entry.admin_in_state_only or status in entry.states
                assert (f'value="{entry.admin_name}"' in page) == expected, (entry.name, status)
