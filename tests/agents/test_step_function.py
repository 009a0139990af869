"""The step function (agents.engine.step_statement.function_sql) is installed by a migration that
holds its SQL frozen: when the models change the function's columns, a new migration must carry
the new text. These tests fail until it does."""

import importlib
import pkgutil

import pytest
from django.db import connection

import agents.migrations
from agents.engine import step_statement


def _newest_function_sql() -> str:
    """The step function's SQL as the newest agents migration that (re)creates it holds it."""
    found = None
    for info in sorted(pkgutil.iter_modules(agents.migrations.__path__), key=lambda m: m.name):
        module = importlib.import_module(f"agents.migrations.{info.name}")
        sql = getattr(module, "SQL", None)
        if isinstance(sql, str) and "FUNCTION acthelm_step(" in sql:
            found = sql
    assert found is not None, "no migration installs acthelm_step"
    return found


def test_the_newest_migration_holds_the_function_the_models_make():
    assert _newest_function_sql() == step_statement.function_sql(), (
        "the step function changed with the models: add a migration with "
        "step_statement.function_sql()'s text (as 0015_step_function holds it)"
    )


@pytest.mark.django_db
def test_the_installed_function_is_the_one_the_models_make():
    """The test database is migrated: its function's body is the one function_sql() builds."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT prosrc FROM pg_proc WHERE proname = 'acthelm_step'")
        bodies = [row[0] for row in cursor.fetchall()]
    expected = step_statement.function_sql().split("$fn$")[1]
    assert bodies == [expected]
