# ruff: noqa: E501
"""The step function draws its new ids without planning again at every step. Its two id
statements named their sequence through pg_get_serial_sequence() (a catalog lookup, folded when
planned) over generate_series(1, <count>): a plan that depends on the step's values, so PL/pgSQL
kept a custom plan and planned both statements at each call (~8 % of the server's CPU a step,
by perf). They now name the sequence as a constant over jsonb_array_elements(), and the session
keeps one generic plan. Same signature; the SQL it applies is frozen in
sql/0018_acthelm_step.sql (tests/agents/test_store_functions.py). Before it, a check that each sequence the worker
names (core.fastsql.sequence: these two, and the claim's run and event) is the one its column
uses."""

import importlib

from django.db import migrations

from agents.migrations._frozen import applied

_before = importlib.import_module("agents.migrations.0016_step_fence_lock")

CHECK = """DO $check$
BEGIN
  IF pg_get_serial_sequence('agents_turn', 'id')::regclass IS DISTINCT FROM 'agents_turn_id_seq'::regclass
     OR pg_get_serial_sequence('agents_toolcall', 'id')::regclass IS DISTINCT FROM 'agents_toolcall_id_seq'::regclass
     OR pg_get_serial_sequence('agents_agentrun', 'id')::regclass IS DISTINCT FROM 'agents_agentrun_id_seq'::regclass
     OR pg_get_serial_sequence('tasks_taskevent', 'id')::regclass IS DISTINCT FROM 'tasks_taskevent_id_seq'::regclass THEN
    RAISE EXCEPTION 'the worker names each id sequence <table>_id_seq (core.fastsql.sequence), and one of agents_turn, agents_toolcall, agents_agentrun, tasks_taskevent has another';
  END IF;
END
$check$"""

SQL = applied(
    "0018_acthelm_step.sql", "0e02ecd14d781fd1a774492257cc58b90394f4c5bb7db3a8f5b6a06c7cf4ec72"
)


class Migration(migrations.Migration):
    dependencies = [("agents", "0017_redundant_fk_indexes"), ("tasks", "0018_redundant_fk_indexes")]

    operations = [
        migrations.RunSQL([CHECK, SQL], reverse_sql=[_before.SQL]),
    ]
