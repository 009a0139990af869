"""A run's MCP calls and cost stored on the run, so that a task's usage is one aggregate over its
runs (agents.engine.run.usage.task_usage). Existing runs are filled from what was counted before: the
run_count of their MCP tool calls (named SERVER__TOOL) and the known costs of their turns."""

from django.db import migrations, models

FILL_RUN_USAGE = """
UPDATE agents_agentrun r SET mcp_calls = c.n
FROM (SELECT run_id, sum(run_count) AS n FROM agents_toolcall
      WHERE strpos(tool, '__') > 0 GROUP BY run_id) c
WHERE r.id = c.run_id;
UPDATE agents_agentrun r SET cost = t.cost
FROM (SELECT run_id, sum(cost) AS cost FROM agents_turn
      WHERE cost IS NOT NULL GROUP BY run_id) t
WHERE r.id = t.run_id;
"""


def fill_run_usage(apps, schema_editor) -> None:
    """Fill the new columns of existing runs (the recorder keeps them from now on)."""
    with schema_editor.connection.cursor() as cursor:
        cursor.execute(FILL_RUN_USAGE)


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0010_supervisor_verdicts"),
    ]

    operations = [
        migrations.AddField(
            model_name="agentrun",
            name="cost",
            field=models.DecimalField(decimal_places=8, default=0, max_digits=16),
        ),
        migrations.AddField(
            model_name="agentrun",
            name="mcp_calls",
            field=models.PositiveIntegerField(default=0),
        ),
        # Going back drops the columns: nothing to undo.
        migrations.RunPython(fill_run_usage, migrations.RunPython.noop, elidable=True),
    ]
