"""Drop the foreign-key indexes that a unique constraint's or an index's leading column already
covers. tasks_task_goal_id matters most: a status change is not a HOT update (status is indexed),
so every index of tasks_task gets an entry at each claim and each end of a run.

The state changes through AlterField; the database only through DROP INDEX (reversed by CREATE
INDEX): Django's own AlterField would re-add each foreign key, validating the whole table, and on
agents_agentrun.task_id it also dropped run_one_started_per_task, the partial unique index on
the same column (one started run per task). tests/agents/test_indexes.py holds the rule."""

import django.db.models.deletion
from django.db import migrations, models

# (index, table, column): each covered by the unique constraint named beside it.
DROPPED = [
    (
        "tasks_task_goal_id_e83e5733",
        "tasks_task",
        "goal_id",
    ),  # task_goal_status_idx (goal_id, status)
    (
        "tasks_taskdependency_task_id_b06a95c0",
        "tasks_taskdependency",
        "task_id",
    ),  # task_dependency_unique (task_id, depends_on_id)
    (
        "tasks_notification_event_id_7b04b8ae",
        "tasks_notification",
        "event_id",
    ),  # notification_event_target_unique (event_id, target_id, part)
]


class Migration(migrations.Migration):
    dependencies = [
        ("tasks", "0017_taskevent_fewer_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="task",
                    name="goal",
                    field=models.ForeignKey(
                        blank=True,
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="tasks",
                        to="tasks.goal",
                    ),
                ),
                migrations.AlterField(
                    model_name="taskdependency",
                    name="task",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="dependency_links",
                        to="tasks.task",
                    ),
                ),
                migrations.AlterField(
                    model_name="notification",
                    name="event",
                    field=models.ForeignKey(
                        db_index=False,
                        null=True,
                        on_delete=django.db.models.deletion.SET_NULL,
                        related_name="notifications",
                        to="tasks.taskevent",
                    ),
                ),
            ],
            database_operations=[
                migrations.RunSQL(
                    f'DROP INDEX IF EXISTS "{name}"',
                    f'CREATE INDEX IF NOT EXISTS "{name}" ON "{table}" ("{column}")',
                )
                for name, table, column in DROPPED
            ],
        ),
    ]
