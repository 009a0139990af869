"""acthelm_token and acthelm_goal against the test database: as `manage.py` runs them, in this
process (the `manage` fixture); the refusals as real `manage.py` processes, for their exit status
and stderr as a shell sees them."""

import json

import pytest
from django.test import Client

from acthelm_site.api.models import ApiToken
from tasks.models import Goal
from tasks.states import TaskStatus
from tests.factories import TaskFactory, UserFactory


@pytest.fixture
def people(transactional_db):
    UserFactory(username="ops", is_superuser=True)
    return UserFactory(username="script", perms=["tasks.view_task"])


def test_token_create_list_revoke(manage, people):
    created = json.loads(
        manage(
            "acthelm_token", "--json", "create", "--user", "script", "--name", "ci", check=True
        ).stdout
    )
    secret = created["token"]
    assert secret.startswith("acthelm_") and created["user"] == "script"
    auth = {"Authorization": f"Bearer {secret}"}
    assert Client().get("/api/tasks", headers=auth).status_code == 200
    assert ApiToken.objects.get().last_used_at is not None

    listed = manage("acthelm_token", "list", check=True).stdout
    assert created["display"] in listed and "ci" in listed and secret not in listed
    rows = json.loads(manage("acthelm_token", "--json", "list", check=True).stdout)
    assert [r["id"] for r in rows] == [created["id"]] and "token" not in rows[0]

    revoked = manage("acthelm_token", "revoke", created["prefix"], check=True)
    assert "revoked" in revoked.stdout
    assert Client().get("/api/tasks", headers=auth).status_code == 401
    assert json.loads(manage("acthelm_token", "--json", "list").stdout) == []
    assert len(json.loads(manage("acthelm_token", "--json", "list", "--all").stdout)) == 1

    again = manage("acthelm_token", "--json", "revoke", created["prefix"])
    assert again.returncode != 0 and json.loads(again.stdout)["error"] == "transition_not_allowed"


def test_token_create_refuses_an_unknown_user_or_a_duplicate_name(manage_process, people):
    manage = manage_process
    unknown = manage("acthelm_token", "create", "--user", "ghost", "--name", "ci")
    assert unknown.returncode != 0 and "no user named 'ghost'" in unknown.stderr
    manage("acthelm_token", "create", "--user", "script", "--name", "ci", check=True)
    dup = manage("acthelm_token", "create", "--user", "script", "--name", "ci")
    assert dup.returncode != 0 and "invalid_input" in dup.stderr
    assert ApiToken.objects.count() == 1


def test_token_create_replace_runs_again_and_the_old_token_stops(manage, people):
    def create():
        out = manage(
            "acthelm_token", "--json", "create", "--user", "script", "--name", "laptop",
            "--replace", check=True,
        )  # fmt: skip
        return json.loads(out.stdout)

    first, second = create(), create()
    assert first["replaced"] is None and second["replaced"] == first["display"]
    assert first["token"] != second["token"]
    assert ApiToken.objects.get(prefix=first["prefix"]).revoked_at is not None
    assert ApiToken.objects.get(prefix=second["prefix"]).revoked_at is None
    text = manage(
        "acthelm_token", "create", "--user", "script", "--name", "laptop", "--replace",
        check=True,
    ).stdout  # fmt: skip
    assert f"token {second['display']} (laptop) revoked" in text


def test_goal_create_list_show_deactivate(manage, people):
    created = json.loads(
        manage(
            "acthelm_goal",
            "--json",
            "--user",
            "ops",
            "create",
            "--title",
            "Ship Q3",
            "--description",
            "Everything for the Q3 launch",
            check=True,
        ).stdout
    )
    goal = Goal.objects.get(pk=created["id"])
    assert goal.active and goal.created_by.username == "ops" and created["title"] == "Ship Q3"
    task = TaskFactory(goal=goal, status=TaskStatus.REVIEW)

    listed = manage("acthelm_goal", "list", "--active", check=True).stdout
    assert f"#{goal.pk}" in listed and "Ship Q3" in listed and "open 1" in listed
    shown = json.loads(manage("acthelm_goal", "--json", "show", str(goal.pk), check=True).stdout)
    assert [t["id"] for t in shown["tasks"]] == [task.pk] and shown["task_counts"] == {"review": 1}
    assert f"#{task.pk}" in manage("acthelm_goal", "show", str(goal.pk), check=True).stdout

    done = manage("acthelm_goal", "--user", "ops", "deactivate", str(goal.pk), check=True)
    assert "deactivated" in done.stdout
    goal.refresh_from_db()
    assert not goal.active
    assert json.loads(manage("acthelm_goal", "--json", "list", "--active").stdout) == []
    again = manage("acthelm_goal", "--json", "--user", "ops", "deactivate", str(goal.pk))
    assert again.returncode != 0 and json.loads(again.stdout)["error"] == "transition_not_allowed"


def test_goal_commands_refuse_bad_input_and_missing_permission(manage_process, people):
    manage = manage_process
    empty = manage("acthelm_goal", "--user", "ops", "create", "--title", "  ")
    assert empty.returncode != 0 and "invalid_input" in empty.stderr
    denied = manage("acthelm_goal", "--user", "script", "create", "--title", "G")
    assert denied.returncode != 0 and "permission_denied" in denied.stderr
    missing = manage("acthelm_goal", "--json", "show", "999999")
    assert missing.returncode != 0 and json.loads(missing.stdout)["error"] == "goal_not_found"
    assert not Goal.objects.exists()
