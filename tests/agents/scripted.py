"""Helpers for tests that drive the agent loop through a scripted model server on loopback.

The server is real HTTP (tests/fakes/model_server.py); the tasks, runs and tool calls are real
rows in PostgreSQL; the worker is the real one (in-process, or a separate process).
"""

import itertools
import time
from pathlib import Path

import psycopg
from django.db import connection
from psycopg.conninfo import make_conninfo

from agents.engine.run.intake import task_create
from agents.models import Connection, Model, ToolCall
from core.actors import Actor
from tasks.models import Task

_names = itertools.count(1)


def fast_settings(settings, *, allow_private: bool = True):
    """Short leases for in-process workers (as tests/agents/conftest.py's fast_worker_settings),
    and fetch_url allowed to reach the loopback test servers."""
    settings.ACTHELM_HEARTBEAT_SECONDS = 0.2
    settings.ACTHELM_LEASE_SECONDS = 1.5
    settings.ACTHELM_POLL_SECONDS = 0.5
    settings.ACTHELM_RECOVER_INTERVAL_SECONDS = 0.5
    settings.ACTHELM_FETCH_ALLOW_PRIVATE = allow_private
    return settings


def scripted_model(server, *, context_window: int = 100_000) -> Model:
    """A zero-cost openai-compatible connection to `server` with a tested, tool-capable model."""
    conn = Connection.objects.create(
        name=f"scripted-{next(_names)}",
        kind="openai_compatible",
        base_url=server.url,
        cost_tier="zero_cost",
        timeout_seconds=30,
    )
    return Model.objects.create(
        connection=conn,
        name="test-model",
        supports_tools=True,
        test_status="passed",
        context_window=context_window,
    )


def tool_task(server, tools: list[str], **kwargs) -> Task:
    return task_create(
        actor=Actor.system("test"),
        title=kwargs.pop("title", "Use the tools"),
        instruction=kwargs.pop("instruction", "Do the work with your tools."),
        tools=tools,
        model=scripted_model(server),
        **kwargs,
    )


def status_of(task) -> str:
    return Task.objects.values_list("status", flat=True).get(pk=task.pk)


def calls_of(task) -> list[ToolCall]:
    return list(ToolCall.objects.filter(task=task).order_by("turn__index", "position"))


def tool_messages(request) -> list[dict]:
    """The tool-result messages of one recorded completion request (openai wire format)."""
    return [m for m in request.json["messages"] if m.get("role") == "tool"]


def tool_result_for(request, call_id: str) -> str:
    found = [m["content"] for m in tool_messages(request) if m.get("tool_call_id") == call_id]
    assert len(found) == 1, f"expected one tool message for {call_id}, got {found!r}"
    return found[0]


def offered_tools(request) -> list[str]:
    return [t["function"]["name"] for t in (request.json.get("tools") or [])]


def conninfo() -> str:
    """A libpq connection string for the test database (for a second, independent session)."""
    params = connection.get_connection_params()
    return make_conninfo(
        **{k: v for k, v in params.items() if k in ("dbname", "user", "password", "host", "port")}
    )


def waits_for_a_lock(query_like: str = "%", seconds: float = 10.0) -> bool:
    """Whether a session of the test database comes to wait for a lock (pg_stat_activity, seen
    from a session of its own) within `seconds`; `query_like` narrows it to the waiting
    statement's text (a LIKE pattern)."""
    with psycopg.connect(conninfo(), autocommit=True) as watcher:
        for _ in range(int(seconds / 0.05)):
            row = watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND datname = current_database() AND query LIKE %s",
                [query_like],
            ).fetchone()
            if row and row[0]:
                return True
            time.sleep(0.05)
    return False


def artifact_files(task) -> list[Path]:
    from tasks.workspace import artifacts_dir

    return sorted(artifacts_dir(task.pk).iterdir())
