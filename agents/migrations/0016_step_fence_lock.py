# ruff: noqa: E501
"""The step function's fence locks the task row instead of updating it (agents.engine.store.
fence.fence_lock): the same `_HOLDS` checks under the same row lock (FOR NO KEY UPDATE, the lock an
UPDATE of the lease took), without renewing the lease at every step — the process heartbeat
renews it. No new version of the task row a step: no CHECK constraints evaluated, no dead row
version left behind, less WAL. The lease argument goes, so the function is dropped and created
again with its new signature; the SQL it applies is frozen in
sql/0016_acthelm_step.sql (tests/agents/test_store_functions.py)."""

import importlib

from django.db import migrations

from agents.migrations._frozen import applied

_before = importlib.import_module("agents.migrations.0015_step_function")

SQL = applied(
    "0016_acthelm_step.sql", "05c1cd6a49d33e0aab79ef28d9a855f40111927c51b18bff0a7d66164ef4d9d5"
)

DROP = "DROP FUNCTION IF EXISTS acthelm_step(bigint, bigint, text[], integer[], text, timestamptz, jsonb)"


class Migration(migrations.Migration):
    dependencies = [("agents", "0015_step_function")]

    operations = [
        migrations.RunSQL([_before.DROP, SQL], reverse_sql=[DROP, _before.SQL]),
    ]
