# ruff: noqa: E501
"""The claim as a function, `acthelm_claim`: the same one statement (the candidates, the tasks'
move to in_progress, the runs and the claim events), whose plan PL/pgSQL keeps per session
instead of the server parsing and planning a six-part statement at every claim — with no
prepared statement on the client, so through any pooler. The defaults of the run's and the
event's other columns arrive as JSON (`agents.engine.store.claim.defaults`), so a column added
later with a default needs no new function. The SQL it applies is frozen in sql/0021_acthelm_claim.sql
(tests/agents/test_store_functions.py)."""

from django.db import migrations

from agents.migrations._frozen import applied

DROP = (
    "DROP FUNCTION IF EXISTS acthelm_claim(text, double precision, integer, boolean, jsonb, jsonb)"
)

SQL = applied(
    "0021_acthelm_claim.sql", "edb9c30afb180307021d0dd122e14284df349b9b1614a24b3302343cc1c5d9af"
)


class Migration(migrations.Migration):
    dependencies = [
        ("agents", "0020_step_hands_off"),
        ("tasks", "0018_redundant_fk_indexes"),
    ]

    operations = [
        migrations.RunSQL([DROP, SQL], reverse_sql=[DROP]),
    ]
