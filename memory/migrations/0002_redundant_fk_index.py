"""Drop memory_memoryselection's index on run_id: memory_selection_unique (run_id, position)
covers it, and a run with memory writes a selection row per entry.

The state changes through AlterField; the database only through DROP INDEX (reversed by CREATE
INDEX): Django's own AlterField would re-add each foreign key, validating the whole table, and on
agents_agentrun.task_id it also dropped run_one_started_per_task, the partial unique index on
the same column (one started run per task). tests/agents/test_indexes.py holds the rule."""

import django.db.models.deletion
from django.db import migrations, models

# (index, table, column): each covered by the unique constraint named beside it.
DROPPED = [
    (
        "memory_memoryselection_run_id_178a9100",
        "memory_memoryselection",
        "run_id",
    ),  # memory_selection_unique (run_id, position)
]


class Migration(migrations.Migration):
    dependencies = [
        ("memory", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.AlterField(
                    model_name="memoryselection",
                    name="run",
                    field=models.ForeignKey(
                        db_index=False,
                        on_delete=django.db.models.deletion.CASCADE,
                        related_name="memory",
                        to="agents.agentrun",
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
