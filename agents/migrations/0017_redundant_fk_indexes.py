"""Drop the foreign-key indexes that a unique constraint's leading column already covers. Each
index less is an insert less: agents_turn and agents_toolcall get a row in most steps (the step
function), agents_agentrun one a claim.

The state changes through AlterField; the database only through DROP INDEX (reversed by CREATE
INDEX): Django's own AlterField would re-add each foreign key, validating the whole table, and on
agents_agentrun.task_id it also dropped run_one_started_per_task, the partial unique index on
the same column (one started run per task). tests/agents/test_indexes.py holds the rule."""

import django.db.models.deletion
from django.db import migrations, models

# (index, table, column): each covered by the unique constraint named beside it.
DROPPED = [
    (
        "agents_turn_task_id_52fadeb6",
        "agents_turn",
        "task_id",
    ),  # turn_index_unique (task_id, index)
    (
        "agents_toolcall_turn_id_84231bbf",
        "agents_toolcall",
        "turn_id",
    ),  # toolcall_position_unique (turn_id, position)
    (
        "agents_agentrun_task_id_28d8bb9e",
        "agents_agentrun",
        "task_id",
    ),  # run_number_unique (task_id, number)
    (
        "agents_artifact_task_id_94f46273",
        "agents_artifact",
        "task_id",
    ),  # artifact_name_unique (task_id, name)
    (
        "agents_model_connection_id_8afbab62",
        "agents_model",
        "connection_id",
    ),  # model_unique_per_conn (connection_id, name)
    (
        "agents_evalresult_run_id_a169c6ae",
        "agents_evalresult",
        "run_id",
    ),  # evalresult_once_per_case (run_id, case_id, repetition)
]


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0016_step_fence_lock"),
        ("tasks", "0017_taskevent_fewer_indexes"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="agentrun",
                    name="task",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="runs",
                        to="tasks.task",
                    ),
                ),
                migrations.AlterField(
                    model_name="toolcall",
                    name="turn",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="tool_calls",
                        to="agents.turn",
                    ),
                ),
                migrations.AlterField(
                    model_name="turn",
                    name="task",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="turns",
                        to="tasks.task",
                    ),
                ),
                migrations.AlterField(
                    model_name="artifact",
                    name="task",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="artifacts",
                        to="tasks.task",
                    ),
                ),
                migrations.AlterField(
                    model_name="model",
                    name="connection",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="models",
                        to="agents.connection",
                    ),
                ),
                migrations.AlterField(
                    model_name="evalresult",
                    name="run",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="results",
                        to="agents.evalrun",
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
