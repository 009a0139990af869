"""The admin edits through the services (issue 13, item 16), driven with the real admin pages.

A connection's new URL, command or credential makes its models untested again; a task's tools,
policies, domains, limits, connection and model are checked like a new task's and each edit writes
an `edited` event; approvals and review decisions, the audit, cannot be deleted.
"""

import pytest
from django.urls import reverse

from agents.models import Model
from approvals.models import Approval, ReviewDecision
from tasks.models import Task, TaskEvent
from tests.factories import (
    ApprovalFactory,
    ConnectionFactory,
    ModelFactory,
    ReviewDecisionFactory,
    TaskFactory,
)

pytestmark = pytest.mark.django_db


def _form_data(response) -> dict:
    """What the browser would post back unchanged: the page's form and its inline formsets."""
    data = {}

    def add(form):
        for name in form.fields:
            bound = form[name]
            value = bound.value()
            key = bound.html_name
            if isinstance(value, bool):
                if value:
                    data[key] = "on"
            elif value is None:
                data[key] = ""
            elif isinstance(value, list | tuple):
                data[key] = [str(v) for v in value]
            else:
                data[key] = str(value)

    add(response.context["adminform"].form)
    for inline in response.context["inline_admin_formsets"]:
        formset = inline.formset
        for name in formset.management_form.fields:
            value = formset.management_form[name].value()
            data[formset.management_form[name].html_name] = "" if value is None else str(value)
        for form in formset.forms:
            add(form)
    return data


def _edit(client, url, **changes):
    data = _form_data(client.get(url))
    data.update(changes)
    return client.post(url, data)


# -- connections and models ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("base_url", "http://127.0.0.1:9999/v1"),
        ("credential_env", "ACTHELM_KEY_OTHER"),
        ("kind", "anthropic"),
    ],
)
def test_changing_what_a_model_was_tested_against_untests_it(admin_client, field, value):
    conn = ConnectionFactory(credential_env="ACTHELM_KEY_ONE")
    model = ModelFactory(connection=conn, test_status="passed", streams=False)
    url = reverse("admin:agents_connection_change", args=[conn.pk])
    response = _edit(admin_client, url, **{field: value})
    assert response.status_code == 302, response.content.decode()[:2000]
    model.refresh_from_db()
    assert getattr(model.connection, field) == value
    assert model.test_status == "untested" and f"connection's {field} changed" in model.test_message
    assert model.streams is None  # what the old server did says nothing of the new one


def test_changing_a_cli_command_untests_its_models(admin_client):
    conn = ConnectionFactory(kind="cli", base_url="", command=["llm", "-m", "a"])
    model = ModelFactory(connection=conn, supports_tools=False, test_status="passed")
    url = reverse("admin:agents_connection_change", args=[conn.pk])
    response = _edit(admin_client, url, command='["llm", "-m", "b"]')
    assert response.status_code == 302
    model.refresh_from_db()
    assert model.connection.command == ["llm", "-m", "b"] and model.test_status == "untested"


def test_changing_only_the_priority_keeps_the_test(admin_client):
    conn = ConnectionFactory()
    model = ModelFactory(connection=conn, test_status="passed")
    url = reverse("admin:agents_connection_change", args=[conn.pk])
    assert _edit(admin_client, url, priority="7").status_code == 302
    model.refresh_from_db()
    assert model.connection.priority == 7 and model.test_status == "passed"


def test_a_connection_edit_is_validated_like_a_new_one(admin_client):
    conn = ConnectionFactory()
    model = ModelFactory(connection=conn, test_status="passed")
    url = reverse("admin:agents_connection_change", args=[conn.pk])
    response = _edit(admin_client, url, credential_env="DATABASE_URL")
    assert response.status_code == 200 and "can never be a credential" in response.content.decode()
    response = _edit(admin_client, url, timeout_seconds="inf")
    assert response.status_code == 200
    model.refresh_from_db()
    assert model.connection.credential_env == "" and model.test_status == "passed"


def test_turning_on_tool_support_in_the_inline_untests_the_model(admin_client):
    conn = ConnectionFactory()
    model = ModelFactory(connection=conn, supports_tools=False, test_status="passed")
    url = reverse("admin:agents_connection_change", args=[conn.pk])
    response = _edit(admin_client, url, **{"models-0-supports_tools": "on"})
    assert response.status_code == 302
    model.refresh_from_db()
    assert model.supports_tools and model.test_status == "untested"


def test_renaming_a_model_on_its_own_page_untests_it(admin_client):
    model = ModelFactory(test_status="passed")
    url = reverse("admin:agents_model_change", args=[model.pk])
    assert _edit(admin_client, url, name="another-model").status_code == 302
    model.refresh_from_db()
    assert model.name == "another-model" and model.test_status == "untested"


# -- tasks -----------------------------------------------------------------------------------------


def _task_url(task):
    return reverse("admin:tasks_task_change", args=[task.pk])


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"tool_policies": '{"read_file": "ASK"}'}, "must be allow or ask"),
        ({"tools": "read_file,no_such_tool"}, "unknown tools"),
        ({"limit_turns": str(2**31)}, ""),
        ({"priority": str(2**31)}, ""),
        ({"tool_policies": '["ask"]'}, "tool policies must be an object"),
    ],
)
def test_a_bad_task_edit_is_a_form_error_and_changes_nothing(admin_client, changes, message):
    task = TaskFactory(status="paused", tools=["read_file"], tool_policies={})
    events = TaskEvent.objects.filter(task=task).count()
    response = _edit(admin_client, _task_url(task), **changes)
    assert response.status_code == 200
    assert "errornote" in response.content.decode() or "errorlist" in response.content.decode()
    assert message in response.content.decode()
    task.refresh_from_db()
    assert task.tool_policies == {} and task.tools == ["read_file"] and task.priority == 0
    assert TaskEvent.objects.filter(task=task).count() == events


def test_a_model_of_another_connection_is_refused(admin_client):
    task = TaskFactory(status="paused")
    model = ModelFactory()
    other = ConnectionFactory()
    response = _edit(admin_client, _task_url(task), connection=str(other.pk), model=str(model.pk))
    assert response.status_code == 200 and "does not belong to connection" in (
        response.content.decode()
    )
    task.refresh_from_db()
    assert task.model_id is None and task.connection_id is None


def test_a_good_task_edit_is_saved_with_an_edited_event_naming_the_person(admin_client):
    task = TaskFactory(status="paused", tools=["read_file"], tool_policies={})
    response = _edit(
        admin_client,
        _task_url(task),
        tools="read_file,fetch_url",
        tool_policies='{"fetch_url": "ask"}',
        allowed_domains="Example.COM.",
        limit_turns="40",
    )
    assert response.status_code == 302
    task.refresh_from_db()
    assert task.tools == ["read_file", "fetch_url"] and task.tool_policies == {"fetch_url": "ask"}
    assert task.allowed_domains == ["example.com"] and task.limit_turns == 40
    event = TaskEvent.objects.filter(task=task, kind="edited").get()
    assert event.actor_label == "admin" and event.actor_user.username == "admin"
    assert set(event.data["fields"]) == {"tools", "tool_policies", "allowed_domains", "limit_turns"}
    assert event.data["before"]["limit_turns"] == 24 and event.data["after"]["limit_turns"] == 40


# -- the audit -------------------------------------------------------------------------------------


def test_approvals_and_review_decisions_cannot_be_deleted_in_the_admin(admin_client):
    approval = ApprovalFactory()
    decision = ReviewDecisionFactory()
    for obj, name in ((approval, "approval"), (decision, "reviewdecision")):
        delete = reverse(f"admin:approvals_{name}_delete", args=[obj.pk])
        assert admin_client.get(delete).status_code == 403
        assert admin_client.post(delete, {"post": "yes"}).status_code == 403
        changelist = reverse(f"admin:approvals_{name}_changelist")
        page = admin_client.get(changelist).content.decode()
        assert "delete_selected" not in page
        admin_client.post(
            changelist, {"action": "delete_selected", "_selected_action": [obj.pk], "post": "yes"}
        )
    assert Approval.objects.filter(pk=approval.pk).exists()
    assert ReviewDecision.objects.filter(pk=decision.pk).exists()
    assert Task.objects.filter(pk=approval.task_id).exists()
    assert Model.objects.count() == 0


def test_a_connection_edit_logs_field_names_never_their_values(admin_client, caplog):
    conn = ConnectionFactory()
    url = reverse("admin:agents_connection_change", args=[conn.pk])
    with caplog.at_level("INFO", logger="acthelm.agents"):
        response = _edit(admin_client, url, base_url="https://user:hunter2@api.example.com/v1")
    assert response.status_code == 302
    [record] = [r for r in caplog.records if r.getMessage() == "connection.changed"]
    assert record.fields == ["base_url"]
    assert "hunter2" not in caplog.text and "hunter2" not in str(vars(record))
