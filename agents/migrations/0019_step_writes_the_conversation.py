# ruff: noqa: E501
"""The step function also writes the task's conversation (its system prompt and tool pins) with
the task's first step: that step was the one step of every task that took the fenced-transaction
path (a BEGIN, the fence, seven statements and a COMMIT, each a round trip on a pooled
connection), all of a fleet's tasks at once at its start. Same signature; the SQL it applies is frozen
in sql/0019_acthelm_step.sql (tests/agents/test_store_functions.py)."""

import importlib

from django.db import migrations

from agents.migrations._frozen import applied

_before = importlib.import_module("agents.migrations.0018_step_ids_generic_plan")

SQL = applied(
    "0019_acthelm_step.sql", "528df65e23140fc0a483617d14976f4b7dd5d1a2cffcbad30ae97f03411b7bfc"
)


class Migration(migrations.Migration):
    dependencies = [("agents", "0018_step_ids_generic_plan")]

    operations = [
        migrations.RunSQL([SQL], reverse_sql=[_before.SQL]),
    ]
