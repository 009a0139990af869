"""The tick and a person's actions on schedules, with a frozen clock (`now=`), on PostgreSQL."""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, transaction

from core.actors import Actor
from core.exceptions import InvalidInput, NotPermitted
from schedules import services
from schedules.models import Schedule, ScheduleSlot
from schedules.states import CatchUpPolicy, OverlapPolicy, SkipReason, SlotKind, SlotOutcome
from tasks.models import Task, TaskEvent
from tasks.states import TaskStatus

pytestmark = pytest.mark.django_db


def at(day, hour, minute=0, tz=UTC):
    return datetime(2026, 12, day, hour, minute, tzinfo=tz)


def slots_of(schedule):
    return list(
        ScheduleSlot.objects.filter(schedule=schedule)
        .order_by("slot_at", "id")
        .values_list("slot_at", "outcome", "reason", "count")
    )


def close(task):
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.DONE)


def test_a_due_slot_creates_one_ready_task_linked_to_its_schedule(make_schedule):
    schedule = make_schedule(at(1, 7))
    assert schedule.next_slot_at == at(1, 8)
    report = services.schedules_tick(now=at(1, 8, 0))
    assert report.created == 1
    slot = ScheduleSlot.objects.get(schedule=schedule)
    task = slot.task
    assert task is not None and task.status == TaskStatus.READY
    assert task.title == "Summarise yesterday's tickets · 2026-12-01 08:00"
    assert task.schedule_slot == slot
    created = TaskEvent.objects.get(task=task, kind="created")
    assert created.actor_label == f"schedule:{schedule.pk}"
    schedule.refresh_from_db()
    assert schedule.last_slot_at == at(1, 8) and schedule.next_slot_at == at(2, 8)
    # A second tick at the same moment finds nothing due.
    assert services.schedules_tick(now=at(1, 8, 1)).created == 0
    assert Task.objects.count() == 1


def test_nothing_is_created_before_the_first_slot(make_schedule):
    make_schedule(at(1, 8, 30))
    assert services.schedules_tick(now=at(1, 23)).schedules == 0
    assert Task.objects.count() == 0


def test_overlap_skip_the_default_records_the_skipped_slot_while_the_last_task_is_open(
    make_schedule,
):
    schedule = make_schedule(at(1, 7))
    services.schedules_tick(now=at(1, 8))
    services.schedules_tick(now=at(2, 8))
    first = ScheduleSlot.objects.get(schedule=schedule, outcome=SlotOutcome.CREATED).task
    skipped = ScheduleSlot.objects.get(schedule=schedule, outcome=SlotOutcome.SKIPPED)
    assert skipped.reason == SkipReason.OVERLAP and skipped.slot_at == at(2, 8)
    assert f"task #{first.pk} is ready" in skipped.detail
    # Review is not closed: still skipped.
    Task.objects.filter(pk=first.pk).update(status=TaskStatus.REVIEW)
    services.schedules_tick(now=at(3, 8))
    assert Task.objects.count() == 1
    close(first)
    services.schedules_tick(now=at(4, 8))
    assert Task.objects.count() == 2


def test_overlap_allow_creates_every_slot(make_schedule):
    make_schedule(at(1, 7), overlap=OverlapPolicy.ALLOW)
    for day in (1, 2, 3):
        services.schedules_tick(now=at(day, 8, 1))
    assert Task.objects.count() == 3


def test_catch_up_latest_runs_only_the_latest_missed_slot_and_records_the_others(make_schedule):
    schedule = make_schedule(at(1, 7))
    report = services.schedules_tick(now=at(5, 9))
    assert report.created == 1
    assert slots_of(schedule) == [
        (at(1, 8), SlotOutcome.SKIPPED, SkipReason.MISSED, 4),
        (at(5, 8), SlotOutcome.CREATED, "", 1),
    ]
    schedule.refresh_from_db()
    assert schedule.next_slot_at == at(6, 8)


def test_catch_up_none_runs_no_missed_slot(make_schedule):
    schedule = make_schedule(at(1, 7), catch_up=CatchUpPolicy.NONE)
    report = services.schedules_tick(now=at(5, 9))
    assert report.created == 0
    assert slots_of(schedule) == [(at(1, 8), SlotOutcome.SKIPPED, SkipReason.MISSED, 5)]
    # On time (within the grace), it runs.
    services.schedules_tick(now=at(6, 8, 1))
    assert Task.objects.count() == 1


def test_the_end_date_stops_the_schedule(make_schedule):
    schedule = make_schedule(at(1, 7), ends_at=at(2, 12), overlap=OverlapPolicy.ALLOW)
    services.schedules_tick(now=at(1, 8))
    services.schedules_tick(now=at(2, 8))
    schedule.refresh_from_db()
    assert schedule.next_slot_at is None
    services.schedules_tick(now=at(9, 8))
    assert Task.objects.count() == 2


def test_a_clock_that_jumps_back_never_repeats_a_slot(make_schedule):
    schedule = make_schedule(at(1, 7), overlap=OverlapPolicy.ALLOW)
    services.schedules_tick(now=at(1, 8, 5))
    # The clock goes back an hour, then forward again past the same slot.
    assert services.schedules_tick(now=at(1, 7, 5)).created == 0
    assert services.schedules_tick(now=at(1, 8, 0)).created == 0
    assert services.schedules_tick(now=at(1, 8, 5)).created == 0
    assert [s[0] for s in slots_of(schedule)] == [at(1, 8)]


def test_the_database_refuses_a_second_row_for_one_slot(make_schedule):
    schedule = make_schedule(at(1, 7))
    services.schedules_tick(now=at(1, 8))
    with pytest.raises(IntegrityError), transaction.atomic():
        ScheduleSlot.objects.create(
            schedule=schedule, slot_at=at(1, 8), outcome=SlotOutcome.SKIPPED, reason="overlap"
        )


def test_dst_a_0230_berlin_schedule_runs_once_the_day_clocks_skip(make_schedule):
    from zoneinfo import ZoneInfo

    berlin = ZoneInfo("Europe/Berlin")
    start = datetime(2026, 3, 28, 12, tzinfo=berlin)
    schedule = make_schedule(
        start, cron="30 2 * * *", timezone="Europe/Berlin", overlap=OverlapPolicy.ALLOW
    )
    clock = start
    while clock < start + timedelta(days=3):
        clock += timedelta(minutes=30)
        services.schedules_tick(now=clock)
    local = [s[0].astimezone(berlin).strftime("%m-%d %H:%M") for s in slots_of(schedule)]
    assert local == ["03-29 03:00", "03-30 02:30", "03-31 02:30"]


def test_dst_a_0130_new_york_schedule_runs_once_the_day_clocks_fall_back(make_schedule):
    from zoneinfo import ZoneInfo

    ny = ZoneInfo("America/New_York")
    start = datetime(2026, 10, 31, 12, tzinfo=ny)
    schedule = make_schedule(
        start, cron="30 1 * * *", timezone="America/New_York", overlap=OverlapPolicy.ALLOW
    )
    clock = start
    while clock < start + timedelta(days=3):
        clock += timedelta(minutes=30)
        services.schedules_tick(now=clock)
    rows = slots_of(schedule)
    assert [r[1] for r in rows] == [SlotOutcome.CREATED] * 3
    local = [s[0].astimezone(ny).strftime("%m-%d %H:%M") for s in rows]
    assert local == ["11-01 01:30", "11-02 01:30", "11-03 01:30"]


def test_pause_then_resume_records_the_paused_slots_and_runs_none_of_them(make_schedule, planner):
    schedule = make_schedule(at(1, 7))
    services.schedule_pause(actor=planner, schedule_id=schedule.pk)
    assert services.schedules_tick(now=at(4, 9)).schedules == 0
    services.schedule_resume(actor=planner, schedule_id=schedule.pk, now=at(4, 9))
    assert slots_of(schedule) == [(at(1, 8), SlotOutcome.SKIPPED, SkipReason.PAUSED, 4)]
    assert services.schedules_tick(now=at(4, 10)).created == 0
    services.schedules_tick(now=at(5, 8))
    assert Task.objects.count() == 1


def test_run_now_creates_a_task_paused_or_not_and_leaves_the_slots_alone(make_schedule, planner):
    schedule = make_schedule(at(1, 7))
    services.schedule_pause(actor=planner, schedule_id=schedule.pk)
    slot = services.schedule_run_now(actor=planner, schedule_id=schedule.pk, now=at(1, 7, 30))
    assert slot.kind == SlotKind.RUN_NOW and slot.task is not None
    assert slot.requested_by == planner.user
    schedule.refresh_from_db()
    assert schedule.next_slot_at == at(1, 8)


def test_a_template_that_cannot_be_created_any_more_records_a_failed_slot(
    make_schedule, tested_model
):
    schedule = make_schedule(at(1, 7), overlap=OverlapPolicy.ALLOW)
    tested_model.test_status = "failed"
    tested_model.save()
    report = services.schedules_tick(now=at(1, 8))
    assert report.failed == 1 and Task.objects.count() == 0
    failed = ScheduleSlot.objects.get(schedule=schedule)
    assert failed.outcome == SlotOutcome.FAILED and failed.reason
    schedule.refresh_from_db()
    assert schedule.next_slot_at == at(2, 8)  # the schedule goes on


def test_a_goal_schedule_creates_an_active_goal_and_skips_while_it_is_active(make_schedule):
    schedule = make_schedule(at(1, 7), target="goal")
    services.schedules_tick(now=at(1, 8))
    services.schedules_tick(now=at(2, 8))
    created = ScheduleSlot.objects.get(schedule=schedule, outcome=SlotOutcome.CREATED)
    assert created.goal is not None and created.goal.active and created.task is None
    assert ScheduleSlot.objects.filter(reason=SkipReason.OVERLAP).count() == 1


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"cron": "0 25 * * *"}, "cron", "invalid cron expression"),
        ({"timezone": "Europe/Atlantis"}, "timezone", "unknown time zone"),
        ({"tools": ["no_such_tool"]}, "tools", "unknown tools"),
        ({"limits": {"limit_nope": 1}}, "limits", "unknown limit"),
        ({"overlap": "sometimes"}, "overlap", "overlap must be one of"),
        ({"name": " "}, "name", "needs a name"),
    ],
)
def test_bad_input_is_refused_at_save(make_schedule, fields, field, message):
    with pytest.raises(InvalidInput) as err:
        make_schedule(at(1, 7), **fields)
    assert err.value.field == field and message in err.value.message
    assert Schedule.objects.count() == 0


def test_changing_the_rule_replans_from_now(make_schedule, planner):
    schedule = make_schedule(at(1, 7))
    services.schedule_update(
        actor=planner,
        schedule_id=schedule.pk,
        changes={"cron": "0 18 * * *", "timezone": "Europe/Berlin"},
        now=at(1, 9),
    )
    schedule.refresh_from_db()
    assert schedule.next_slot_at == at(1, 17)  # 18:00 in Berlin, UTC+1 in December


def test_a_person_without_the_permission_is_refused(make_schedule, outsider):
    schedule = make_schedule(at(1, 7))
    for call in (services.schedule_pause, services.schedule_run_now, services.schedule_delete):
        with pytest.raises(NotPermitted):
            call(actor=Actor.person(outsider), schedule_id=schedule.pk)


def test_remove_keeps_the_tasks_it_made(make_schedule, planner):
    schedule = make_schedule(at(1, 7))
    services.schedules_tick(now=at(1, 8))
    services.schedule_delete(actor=planner, schedule_id=schedule.pk)
    assert Task.objects.count() == 1 and ScheduleSlot.objects.count() == 0


def test_a_crash_between_deciding_and_committing_leaves_nothing_and_the_slot_runs_once_later(
    make_schedule, monkeypatch
):
    schedule = make_schedule(at(1, 7))
    other = make_schedule(at(1, 7), name="other", cron="0 8 * * *")
    real_create = services._create

    def crash_after_creating(sched, slot_at):
        made = real_create(sched, slot_at)
        if sched.pk == schedule.pk:
            raise RuntimeError("the process died here")
        return made

    monkeypatch.setattr(services, "_create", crash_after_creating)
    report = services.schedules_tick(now=at(1, 8))
    # The crashed schedule left nothing; the other one was decided in the same pass.
    assert not ScheduleSlot.objects.filter(schedule=schedule).exists()
    assert Task.objects.count() == 1 and report.created == 1
    schedule.refresh_from_db()
    assert schedule.next_slot_at == at(1, 8) and schedule.last_slot_at is None
    assert ScheduleSlot.objects.get(schedule=other).outcome == SlotOutcome.CREATED

    monkeypatch.setattr(services, "_create", real_create)
    assert services.schedules_tick(now=at(1, 8, 1)).created == 1
    assert services.schedules_tick(now=at(1, 8, 2)).created == 0
    assert ScheduleSlot.objects.filter(schedule=schedule, outcome=SlotOutcome.CREATED).count() == 1
    assert Task.objects.count() == 2


def test_paused_is_changed_only_by_pause_and_resume(make_schedule, planner):
    schedule = make_schedule(at(1, 7))
    with pytest.raises(InvalidInput):
        services.schedule_update(actor=planner, schedule_id=schedule.pk, changes={"paused": True})
