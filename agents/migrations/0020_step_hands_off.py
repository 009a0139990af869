# ruff: noqa: E501
"""The step function also ends the run and moves the task when the run's end is a hand-off (an
approved final answer to review, `agents.engine.store.Handoff`): the outcome's fenced transaction (a
BEGIN, the fence, the run's usage, its end, the task's move, its event, the outbox's targets and a
COMMIT, each a round trip on a pooled connection, each parsed and planned again) becomes part of
the last step's one statement, whose plans PL/pgSQL keeps per session. A new OUT argument
(`handed_off`) changes the function's result type, so it is dropped and created again. The SQL is
frozen in sql/0020_acthelm_step.sql (tests/agents/test_store_functions.py)."""

import importlib

from django.db import migrations

from agents.migrations._frozen import applied

_before = importlib.import_module("agents.migrations.0019_step_writes_the_conversation")

DROP = "DROP FUNCTION IF EXISTS acthelm_step(bigint, bigint, text[], integer[], text, timestamptz, jsonb)"

SQL = applied(
    "0020_acthelm_step.sql", "a9297517fec659569ef40510e48a40b2e09a5d60d67801924b9596f9349b4502"
)


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0019_step_writes_the_conversation"),
        ("tasks", "0018_redundant_fk_indexes"),
    ]

    operations = [
        migrations.RunSQL([DROP, SQL], reverse_sql=[DROP, _before.SQL]),
    ]
