"""`acthelm_schedule`: add, list, show, pause, resume, run-now, remove, tick, with --json; and
several `tick` processes racing over the same due slots."""

import json
import subprocess
import sys
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from schedules.models import Schedule, ScheduleSlot
from schedules.services import schedule_create
from schedules.states import SlotOutcome
from tasks.models import Task
from tests.factories import ModelFactory, UserFactory


@pytest.fixture
def ops(db):
    return UserFactory(username="ops", is_superuser=True)


def run(*args):
    out = StringIO()
    call_command("acthelm_schedule", "--user", "ops", *args, stdout=out)
    return out.getvalue()


def test_the_whole_flow_as_json(ops):
    ModelFactory()
    added = json.loads(
        run(
            "--json",
            "add",
            "--name",
            "pricing",
            "--cron",
            "0 9 * * 1",
            "--timezone",
            "America/New_York",
            "--title",
            "Competitors' prices",
            "--instruction",
            "Check the pricing pages.",
            "--no-tools",
            "--overlap",
            "allow",
            "--catch-up",
            "none",
            "--ends-at",
            "2030-01-01T00:00-05:00",
        )
    )
    assert added["overlap"] == "allow" and added["catch_up"] == "none"
    assert added["tools"] == [] and added["next_runs"][0].endswith("-05:00")
    listed = json.loads(run("list", "--json"))
    assert [r["name"] for r in listed] == ["pricing"]
    assert "pricing" in run("list")
    assert json.loads(run("--json", "pause", "pricing"))["paused"] is True
    ran = json.loads(run("--json", "run-now", str(added["id"])))
    task = Task.objects.get(pk=ran["created"]["task_id"])
    assert task.tools == []
    assert json.loads(run("--json", "resume", "pricing"))["paused"] is False
    shown = json.loads(run("--json", "show", "pricing"))
    assert shown["slots"][0]["task_id"] == task.pk
    assert f"task #{task.pk}" in run("show", "pricing")
    assert json.loads(run("--json", "tick")) == {
        "schedules": 0,
        "created": 0,
        "skipped": 0,
        "failed": 0,
    }
    assert json.loads(run("--json", "remove", "pricing")) == {"deleted": added["id"]}
    assert not Schedule.objects.exists() and Task.objects.filter(pk=task.pk).exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--cron", "0 8 * * 8"], "invalid cron expression"),
        (["--cron", "0 8 * *"], "five fields"),
        (["--timezone", "Moon/Base"], "unknown time zone"),
        (["--ends-at", "next week"], "ISO 8601"),
    ],
)
def test_a_bad_rule_is_refused_with_a_clear_error(ops, args, message):
    base = ["add", "--name", "n", "--title", "t", "--instruction", "i", "--cron", "0 8 * * *"]
    with pytest.raises(CommandError, match=message):
        run(*base, *args)
    out = StringIO()
    with pytest.raises(CommandError):
        call_command("acthelm_schedule", "--user", "ops", "--json", *base, *args, stdout=out)
    error = json.loads(out.getvalue())
    assert error["ok"] is False and error["error"] == "invalid_input"
    assert not Schedule.objects.exists()


def test_an_unknown_schedule_is_named(ops):
    with pytest.raises(CommandError, match="schedule 'nope' does not exist"):
        run("pause", "nope")


@pytest.mark.django_db(transaction=True)
def test_racing_tick_processes_create_each_slot_once(worker_env):
    """Six `acthelm_schedule tick` processes at once over twelve due schedules: each due slot
    makes exactly one task."""
    ModelFactory()
    person = UserFactory(username="racer", is_superuser=True)
    from core.actors import Actor

    past = timezone.now() - timedelta(minutes=3)
    for n in range(12):
        schedule_create(
            actor=Actor.person(person),
            now=past,
            name=f"s{n}",
            cron="* * * * *",
            title=f"T{n}",
            instruction="Do it.",
            overlap="allow",
        )
    procs = [
        subprocess.Popen(
            [sys.executable, "manage.py", "acthelm_schedule", "--json", "tick"],
            env=worker_env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(6)
    ]
    reports = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        reports.append(json.loads(out))
    # Each schedule: its latest due slot created, the earlier ones recorded as missed.
    created = ScheduleSlot.objects.filter(outcome=SlotOutcome.CREATED)
    assert created.count() == Task.objects.count()
    per_schedule = {s.pk: created.filter(schedule=s).count() for s in Schedule.objects.all()}
    assert set(per_schedule.values()) == {1}, per_schedule
    assert sum(r["created"] for r in reports) == Task.objects.count()
    # A second round finds nothing new due (unless a minute turned meanwhile: at most one more
    # slot per schedule, never a repeated one).
    slots = list(ScheduleSlot.objects.values_list("schedule_id", "slot_at", "kind"))
    assert len(slots) == len(set(slots))
