"""Racing schedulers on real PostgreSQL: many threads, each with its own connection, tick the same
schedules at the same frozen moments; every slot creates exactly one task."""

import threading
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection

from schedules import services
from schedules.models import ScheduleSlot
from schedules.states import OverlapPolicy, SlotOutcome
from tasks.models import Task

pytestmark = pytest.mark.django_db(transaction=True)

THREADS = 8
SCHEDULES = 6
DAYS = 4


def test_concurrent_ticks_create_each_slot_exactly_once(make_schedule):
    start = datetime(2026, 12, 1, 7, tzinfo=UTC)
    for n in range(SCHEDULES):
        make_schedule(start, name=f"race-{n}", cron="0 8 * * *", overlap=OverlapPolicy.ALLOW)
    errors: list[BaseException] = []
    reports: list[services.TickReport] = []

    def ticker(barrier: threading.Barrier) -> None:
        try:
            for day in range(DAYS):
                now = start + timedelta(days=day, hours=1, minutes=1)
                barrier.wait(timeout=30)
                reports.append(services.schedules_tick(now=now))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)
        finally:
            connection.close()

    barrier = threading.Barrier(THREADS)
    threads = [threading.Thread(target=ticker, args=(barrier,)) for _ in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert Task.objects.count() == SCHEDULES * DAYS
    created = ScheduleSlot.objects.filter(outcome=SlotOutcome.CREATED)
    assert created.count() == SCHEDULES * DAYS
    pairs = list(created.values_list("schedule_id", "slot_at"))
    assert len(set(pairs)) == len(pairs)
    assert sum(r.created for r in reports) == SCHEDULES * DAYS
    # Every created task is linked to its slot, once.
    assert created.values("task_id").distinct().count() == SCHEDULES * DAYS
