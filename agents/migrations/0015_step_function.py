# ruff: noqa: E501
"""The step function (agents.engine.store.statement): the common step's write as ONE server-side
PL/pgSQL function, whose statements PostgreSQL plans once per session instead of once per step —
without a prepared statement on the client, so through any pooler (PgBouncer in transaction mode
too). The SQL it applies is frozen in sql/0015_acthelm_step.sql, as the models of this migration
made it, with its SHA-256 here; a later change of those columns needs a new migration with the
new text (tests/agents/test_store_functions.py fails until there is one)."""

from django.db import migrations

from agents.migrations._frozen import applied

SQL = applied(
    "0015_acthelm_step.sql", "4e15c482da29658ec7f997243a70d5a2b6618cd854675a085a2c802191f8560c"
)

DROP = "DROP FUNCTION IF EXISTS acthelm_step(bigint, bigint, double precision, text[], integer[], text, timestamptz, jsonb)"


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0014_fillfactor_for_hot_updates"),
        ("tasks", "0017_taskevent_fewer_indexes"),
    ]

    operations = [migrations.RunSQL(SQL, reverse_sql=DROP)]
