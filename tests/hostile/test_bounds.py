"""Numbers from people and commands are bounded (issue 13, item 17).

nan, infinity, negatives and values past PostgreSQL's 2**31 - 1 are a clear error (a CommandError
naming the problem, a form error, a stable code): never a 500, a DataError, or a limit that is
silently switched off. Every management command and console form that takes a number is here.
"""

from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client
from django.urls import reverse

from agents.models import Connection
from tasks.models import Task
from tests.factories import TaskFactory, UserFactory

pytestmark = pytest.mark.django_db

BIG = str(2**31)


@pytest.fixture
def ops(db):
    return UserFactory(username="ops", is_superuser=True)


def _refused(*args) -> str:
    with pytest.raises(CommandError) as refused:
        call_command(*args, stdout=StringIO(), stderr=StringIO())
    return str(refused.value)


@pytest.mark.parametrize("days", ["nan", "NaN", "inf", "-inf", "-1", "1e308", "abc"])
def test_prune_refuses_a_number_of_days_that_is_not_a_real_age(days):
    done = TaskFactory(status="done")
    message = _refused("acthelm_prune", "--older-than", days, "--yes")
    assert "--older-than" in message
    assert Task.objects.filter(pk=done.pk).exists()


@pytest.mark.parametrize("size", ["0", "-5", BIG])
def test_prune_refuses_a_batch_size_out_of_range(size):
    assert "--batch-size" in _refused("acthelm_prune", "--older-than", "30", "--batch-size", size)


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--priority", BIG], "number_out_of_range"),
        (["--priority", str(-(2**31) - 1)], "number_out_of_range"),
        (["--limit", f"limit_turns={BIG}"], "number_out_of_range"),
        (["--limit", "limit_runtime_seconds=nan"], "invalid_input"),
        (["--limit", "limit_turns=0"], "number_out_of_range"),
    ],
)
def test_task_create_refuses_numbers_out_of_range(ops, args, code):
    message = _refused("acthelm_task", "create", "--title", "T", "--instruction", "I", *args)
    assert f"[{code}]" in message
    assert not Task.objects.exists()


@pytest.mark.parametrize("value", [BIG, "inf", "-3"])
def test_task_limits_refuses_numbers_out_of_range(ops, value):
    task = TaskFactory(status="paused")
    message = _refused("acthelm_task", "limits", str(task.pk), "--limit", f"limit_turns={value}")
    assert "[number_out_of_range]" in message or "[invalid_input]" in message
    task.refresh_from_db()
    assert task.limit_turns == 24


@pytest.mark.parametrize("value", ["-1", "0", "100000"])
def test_task_list_and_pending_refuse_a_limit_out_of_range(ops, value):
    assert "--limit" in _refused("acthelm_task", "list", "--limit", value)
    assert "--limit" in _refused("acthelm_task", "pending", "--limit", value)


def test_a_task_id_past_the_column_is_task_not_found(ops):
    assert "[task_not_found]" in _refused("acthelm_task", "show", str(2**70))


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (["--timeout", "-5"], "number_out_of_range"),
        (["--timeout", "0"], "number_out_of_range"),
        (["--timeout", "inf"], "invalid_input"),
        (["--timeout", "nan"], "invalid_input"),
        (["--timeout", "1e12"], "number_out_of_range"),
        (["--priority", BIG], "number_out_of_range"),
        (["--context-window", "0"], "number_out_of_range"),
        (["--context-window", BIG], "number_out_of_range"),
    ],
)
def test_connection_add_refuses_numbers_out_of_range(ops, args, code):
    message = _refused(
        "acthelm_connection",
        "add",
        "c",
        "--kind",
        "openai_compatible",
        "--base-url",
        "http://127.0.0.1:9/v1",
        "--model",
        "m",
        *args,
    )
    assert f"[{code}]" in message
    assert not Connection.objects.exists()


@pytest.mark.parametrize("value", ["0", "-1", "100000"])
def test_the_worker_refuses_a_concurrency_out_of_range(value):
    assert "--concurrency" in _refused("acthelm_worker", "--concurrency", value)


# -- the console's forms --------------------------------------------------------------------


@pytest.fixture
def console(db):
    client = Client()
    client.force_login(UserFactory(username="boss", is_superuser=True))
    return client


@pytest.mark.parametrize(
    "changes",
    [{"priority": BIG}, {"priority": "nan"}, {"limit_turns": BIG}, {"limit_token_budget": "1e99"}],
)
def test_the_new_task_form_refuses_numbers_out_of_range(console, changes):
    data = {"title": "T", "instruction": "I", "priority": "0", "tools": ["read_file"]}
    from tasks.services import default_limits

    data |= {k: str(v) for k, v in default_limits().items()} | changes
    response = console.post(reverse("tasks:create"), data)
    assert response.status_code == 400
    assert not Task.objects.exists()


@pytest.mark.parametrize(
    "changes",
    [
        {"priority": BIG},
        {"timeout_seconds": "inf"},
        {"timeout_seconds": "nan"},
        {"timeout_seconds": "-1"},
        {"timeout_seconds": "1e12"},
        {"models": f"m {BIG}"},
        {"models": "m 0"},
    ],
)
def test_the_connection_form_refuses_numbers_out_of_range(console, changes):
    data = {
        "name": "c",
        "kind": "openai_compatible",
        "base_url": "http://127.0.0.1:9/v1",
        "cost_tier": "zero_cost",
        "priority": "0",
        "timeout_seconds": "60",
        "models": "m",
    } | changes
    response = console.post(reverse("agents:connection_add"), data)
    assert response.status_code == 400
    assert not Connection.objects.exists()


def test_raising_a_limit_on_retry_past_the_column_is_refused(console):
    task = TaskFactory(status="failed", failure_code="limit_turns")
    response = console.post(reverse("tasks:retry", args=[task.pk]), {"limit_value": BIG})
    assert response.status_code in (400, 409)
    task.refresh_from_db()
    assert task.status == "failed" and task.limit_turns == 24
