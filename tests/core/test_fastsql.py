"""Statements built once (core.fastsql) write and read what the ORM does: `save` is
`Model.save()` for a row that exists (auto_now stamped, arrays, JSON, decimals, datetimes), an
`Update` is `filter(...).update(...)` and touches no row its filter excludes, a `Select` builds
the instances and values the queryset builds."""

from datetime import timedelta
from decimal import Decimal

import pytest
from django.apps import apps
from django.db import DatabaseError, connection
from django.db.models import F
from django.utils import timezone

from agents.models import AgentRun
from core import fastsql
from tasks.models import Task
from tests.factories import AgentRunFactory, ModelFactory, TaskFactory

pytestmark = pytest.mark.django_db(transaction=True)


def _row(task_id: int) -> dict[str, object]:
    return Task.objects.filter(pk=task_id).values().get()


def test_save_writes_every_field_as_model_save_does():
    by_orm, by_sql = TaskFactory(), TaskFactory()
    model = ModelFactory()
    when = timezone.now() + timedelta(minutes=5)
    for task in (by_orm, by_sql):
        task.tags = ["x", "y"]
        task.tool_policies = {"fetch_url": {"mode": "ask"}, "n": [1, 2.5, None]}
        task.limit_cost = Decimal("12.3400")
        task.lease_expires_at = when
        task.model, task.connection = model, model.connection
        task.feedback = "a 'quoted' text; -- not SQL"
    before = timezone.now()
    by_orm.save()
    fastsql.save(by_sql)
    orm, sql = _row(by_orm.pk), _row(by_sql.pk)
    assert sql["updated_at"] >= before and by_sql.updated_at == sql["updated_at"]  # auto_now
    skip = {"id", "title", "updated_at", "created_at"}
    assert {k: v for k, v in sql.items() if k not in skip} == {
        k: v for k, v in orm.items() if k not in skip
    }
    assert sql["tags"] == ["x", "y"] and sql["limit_cost"] == Decimal("12.3400")
    assert sql["tool_policies"] == {"fetch_url": {"mode": "ask"}, "n": [1, 2.5, None]}


def test_save_of_a_row_that_is_gone_raises_and_an_expression_goes_through_the_orm():
    task = TaskFactory(priority=1)
    task.priority = F("priority") + 1
    fastsql.save(task)
    assert Task.objects.get(pk=task.pk).priority == 2
    gone = TaskFactory()
    Task.objects.filter(pk=gone.pk).delete()
    with pytest.raises(DatabaseError):
        fastsql.save(gone)


def test_an_update_with_a_filter_touches_only_the_rows_it_matches():
    run = AgentRunFactory(status="started")
    update = fastsql.Update.of(AgentRun, ("status", "finished_at"), (("status", "started"),))
    now = timezone.now()
    assert update.run(run.pk, ["succeeded", now]) == 1
    assert update.run(run.pk, ["failed", now]) == 0  # no longer started
    run.refresh_from_db()
    assert run.status == "succeeded" and run.finished_at == now


def test_a_select_builds_what_the_queryset_builds():
    task = TaskFactory(tags=["a"], limit_cost=Decimal("1.5000"))
    select = fastsql.Select(lambda pk: Task.objects.filter(pk=pk), "pk")
    (built,) = select.rows(pk=task.pk)
    orm = Task.objects.get(pk=task.pk)
    assert {f.attname: getattr(built, f.attname) for f in Task._meta.concrete_fields} == {
        f.attname: getattr(orm, f.attname) for f in Task._meta.concrete_fields
    }
    values = fastsql.Select(
        lambda pk: Task.objects.filter(pk=pk).values_list("tags", "limit_cost"), "pk"
    )
    assert values.tuples(pk=task.pk) == [(["a"], Decimal("1.5000"))]
    assert values.tuples(pk=task.pk + 1000) == []


def test_a_select_takes_lists_of_ids_as_one_array_compiled_once():
    tasks = TaskFactory.create_batch(3)
    select = fastsql.Select(
        lambda ids, other: Task.objects.filter(pk__in=fastsql.id_list(ids), id__gte=other).order_by(
            "pk"
        ),
        "ids",
        "other",
    )
    assert [t.pk for t in select.rows(ids=[tasks[0].pk, tasks[2].pk], other=0)] == [
        tasks[0].pk,
        tasks[2].pk,
    ]
    assert [t.pk for t in select.rows(ids=[t.pk for t in tasks], other=tasks[1].pk)] == [
        tasks[1].pk,
        tasks[2].pk,
    ]
    assert select.rows(ids=[], other=0) == []
    with pytest.raises(TypeError, match="ids: a list of ids expected"):
        select.rows(ids=tasks[0].pk, other=0)
    with pytest.raises(TypeError, match="other: an id expected"):
        select.rows(ids=[tasks[0].pk], other=[0])


def test_a_row_in_hand_written_sql_builds_what_the_orm_builds():
    task = TaskFactory(
        tags=["a", "b"],
        limit_cost=Decimal("2.5000"),
        tool_policies={"fetch_url": {"mode": "ask"}, "n": [1, 2.5, None]},
        feedback="a 'quoted' text",
    )
    row = fastsql.Row.of(Task)
    cursor = fastsql.execute(
        f"SELECT {row.columns('t')}, now() FROM tasks_task t WHERE t.id = %s", [task.pk]
    )
    *columns, clock = cursor.fetchone()
    built = row.instance([*columns, clock])  # what follows the row's columns is the caller's
    orm = Task.objects.get(pk=task.pk)
    assert {f.attname: getattr(built, f.attname) for f in Task._meta.concrete_fields} == {
        f.attname: getattr(orm, f.attname) for f in Task._meta.concrete_fields
    }
    assert built.tool_policies == {"fetch_url": {"mode": "ask"}, "n": [1, 2.5, None]}
    assert not built._state.adding and built.get_deferred_fields() == set()
    built.title = "saved from the built row"
    fastsql.save(built)
    assert Task.objects.get(pk=task.pk).title == "saved from the built row"


@pytest.mark.django_db
@pytest.mark.parametrize(
    "label", ["agents.Turn", "agents.ToolCall", "agents.AgentRun", "tasks.TaskEvent"]
)
def test_sequence_names_the_sequence_postgresql_uses_for_the_id(label):
    """The worker's statements name these sequences as constants (the step function, the
    claim); a name PostgreSQL did not give would fail at the first step, not here."""
    model = apps.get_model(label)
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT pg_get_serial_sequence(%s, 'id')::regclass = %s::regclass",
            [model._meta.db_table, fastsql.sequence(model)],
        )
        assert cursor.fetchone() == (True,)
