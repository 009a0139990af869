# ruff: noqa: E501
"""A person may start a task's conversation over (agents.actions.task_change.task_change_and_retry):
the conversation's first turn and its earlier prompts. The step function inserts the
conversation row column by column, so it is created again with the new columns (the SQL it
applies frozen in sql/0022_acthelm_step.sql, tests/agents/test_store_functions.py); the
columns have database defaults, so the function before it still inserts a row."""

import importlib

from django.db import migrations, models

from agents.migrations._frozen import applied

_before = importlib.import_module("agents.migrations.0020_step_hands_off")

SQL = applied(
    "0022_acthelm_step.sql", "3462778817d5d7fa4cdecb9036f8eb960b5cdcd920f61c0834ae09cdc3c77020"
)


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0021_claim_function"),
    ]

    operations = [
        migrations.AddField(
            model_name="conversation",
            name="earlier",
            field=models.JSONField(
                blank=True, db_default=models.Value([], models.JSONField()), default=list
            ),
        ),
        migrations.AddField(
            model_name="conversation",
            name="first_turn",
            field=models.PositiveIntegerField(db_default=0, default=0),
        ),
        migrations.RunSQL([SQL], reverse_sql=[_before.SQL]),
    ]
