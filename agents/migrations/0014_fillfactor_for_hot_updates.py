"""Room on each page for a row's next version: a run row is updated by every step (usage, the
checkpoint) and a tool call by its intent and its result. With free space on the row's own page
PostgreSQL makes such an update HOT — no new index entry in any of the table's indexes — where a
full page sends it to another page and into every index. Pages written from now on keep the
room; existing ones get it when the table is next rewritten (VACUUM FULL, pg_repack)."""

from django.db import migrations

_TABLES = ("agents_agentrun", "agents_toolcall")


class Migration(migrations.Migration):
    dependencies = [("agents", "0013_connection_test")]

    operations = [
        migrations.RunSQL(
            [f"ALTER TABLE {table} SET (fillfactor = 70)" for table in _TABLES],
            reverse_sql=[f"ALTER TABLE {table} RESET (fillfactor)" for table in _TABLES],
        )
    ]
