"""Console pages at scale: server time and query count of the task list, the task page and the
approvals inbox with 100k tasks and 2M events.

    .venv/bin/python bench/console.py [--tasks 100000] [--events 2000000]

The scratch database is bulk-loaded with INSERT … SELECT generate_series (tasks in every settled
state, one run and three turns with a tool call per task, 2M timeline events, 1k pending approvals
and 1k pending needs_review decisions, and one long task: 400 turns, 200 tool calls, 20k events).
Each page is requested through Django's test client in this process (the full middleware stack,
templates included; DEBUG off), 3 times to warm up and then timed; the queries of one request are
counted with CaptureQueriesContext. Goal: < 200 ms each.
"""

from __future__ import annotations

import argparse
import os
import secrets
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

NAME = "console"
DB = "acthelm_bench_console"
GOAL_MS = 200.0

LOAD_SQL = [
    # Tasks: every settled or waiting state; no held ones (they need a live lease).
    """
    INSERT INTO tasks_task (
        title, instruction, kind, origin, tags, status, priority, claim_count, lease_owner,
        failed_attempts, lost_count, limit_turns, limit_runtime_seconds, limit_output_tokens,
        limit_token_budget, limit_tool_output_chars, limit_network_requests, limit_artifact_bytes,
        tools, tool_policies, allowed_domains, failure_code, failure_message, feedback,
        created_at, updated_at, connection_id, model_id)
    SELECT 'Task number ' || g, 'Summarise report ' || g || ' for the weekly review.', 'work',
        'person', '{}',
        CASE WHEN g %% 100 = 7 THEN 'awaiting_approval'
             WHEN g %% 100 = 8 THEN 'needs_review'
             WHEN g %% 10 IN (0, 1, 2, 3) THEN 'done'
             WHEN g %% 10 = 4 THEN 'review'
             WHEN g %% 10 = 5 THEN 'failed'
             WHEN g %% 10 = 6 THEN 'ready'
             ELSE 'cancelled' END,
        0, 1, '', 0, 0, 24, 900, 16000, 600000, 24000, 8, 1048576,
        '{update_plan,list_files,read_file,fetch_url}', '{}', '{example.com}',
        CASE WHEN g %% 10 = 5 THEN 'limit_steps' ELSE '' END, '', '',
        now() - make_interval(secs => %(tasks)s - g), now() - make_interval(secs => %(tasks)s - g),
        %(conn)s, %(model)s
    FROM generate_series(1, %(tasks)s) g
    """,
    """
    INSERT INTO agents_agentrun (
        task_id, number, claim_count, status, worker_id, started_at, finished_at, model_turns,
        input_tokens, output_tokens, network_requests, active_seconds, checkpoint, answer,
        verdict, verdict_reason, error_code, error_message, connection_id, model_id)
    SELECT t.id, 1, 1,
        CASE WHEN t.status IN ('done', 'review') THEN 'succeeded'
             WHEN t.status = 'failed' THEN 'failed' ELSE 'cancelled' END,
        'bench-worker', t.created_at, t.created_at + interval '20 seconds', 3, 1200, 300, 1, 4.5,
        '{"remaining": {"limit_steps": 21}}',
        CASE WHEN t.status IN ('done', 'review') THEN 'The summary of ' || t.title ELSE '' END,
        CASE WHEN t.status IN ('done', 'review') THEN 'approved' ELSE '' END, '',
        CASE WHEN t.status = 'failed' THEN 'limit_steps' ELSE '' END, '', %(conn)s, %(model)s
    FROM tasks_task t
    """,
    # Three turns a task: the instruction, a tool call, the answer.
    """
    INSERT INTO agents_turn (task_id, run_id, index, role, content, stop_reason, discarded,
                             input_tokens, output_tokens, created_at)
    SELECT r.task_id, r.id, i,
        CASE WHEN i = 0 THEN 'user' ELSE 'assistant' END,
        CASE WHEN i = 0 THEN '## Task' || chr(10) || 'Summarise the report.'
             WHEN i = 1 THEN 'Let me read the file.' ELSE 'The report says all is well.' END,
        CASE WHEN i = 1 THEN 'tool_calls' WHEN i = 2 THEN 'end' ELSE '' END, false, 400, 100,
        r.started_at + make_interval(secs => i)
    FROM agents_agentrun r, generate_series(0, 2) i
    """,
    """
    INSERT INTO agents_toolcall (task_id, run_id, turn_id, position, call_id, tool, arguments,
        arguments_raw, arguments_hash, recovery_class, status, result, result_for_model,
        error_code, compacted, started_at, finished_at, run_count)
    SELECT u.task_id, u.run_id, u.id, 0, 'call_' || u.id,
        CASE WHEN t.status IN ('awaiting_approval', 'needs_review') THEN 'fetch_url'
             ELSE 'read_file' END,
        CASE WHEN t.status IN ('awaiting_approval', 'needs_review')
             THEN jsonb_build_object('url', 'https://example.org/page/' || t.id)
             ELSE '{"path": "report.txt"}'::jsonb END,
        '{"path": "report.txt"}', md5(u.id::text) || md5(u.task_id::text),
        CASE WHEN t.status IN ('awaiting_approval', 'needs_review') THEN 'external'
             ELSE 'read_only' END,
        CASE WHEN t.status = 'awaiting_approval' THEN 'awaiting_approval'
             WHEN t.status = 'needs_review' THEN 'unknown' ELSE 'succeeded' END,
        repeat('All is well. ', 40), repeat('All is well. ', 40), '', false,
        u.created_at, u.created_at, 1
    FROM agents_turn u JOIN tasks_task t ON t.id = u.task_id
    WHERE u.index = 1
    """,
    """
    INSERT INTO approvals_approval (task_id, run_id, tool_call_id, tool, target, arguments,
        arguments_hash, reason, effect, status, created_at)
    SELECT c.task_id, c.run_id, c.id, c.tool, c.arguments ->> 'url', c.arguments,
        c.arguments_hash, 'domain_not_allowed', 'Sends an HTTP GET request', 'pending',
        c.started_at
    FROM agents_toolcall c JOIN tasks_task t ON t.id = c.task_id
    WHERE t.status = 'awaiting_approval'
    """,
    """
    INSERT INTO approvals_reviewdecision (task_id, tool_call_id, choice, created_at)
    SELECT c.task_id, c.id, 'pending', c.started_at
    FROM agents_toolcall c JOIN tasks_task t ON t.id = c.task_id
    WHERE t.status = 'needs_review'
    """,
    # The long task (#1): 400 more turns, 200 more tool calls.
    """
    INSERT INTO agents_turn (task_id, run_id, index, role, content, stop_reason, discarded,
                             input_tokens, output_tokens, created_at)
    SELECT 1, (SELECT id FROM agents_agentrun WHERE task_id = 1), 2 + i,
        CASE WHEN i %% 2 = 1 THEN 'assistant' ELSE 'user' END,
        'Step ' || i || ' of a long conversation.', '', false, 400, 100,
        now() - make_interval(secs => 1000 - i)
    FROM generate_series(1, 400) i
    """,
    """
    INSERT INTO agents_toolcall (task_id, run_id, turn_id, position, call_id, tool, arguments,
        arguments_raw, arguments_hash, recovery_class, status, result, result_for_model,
        error_code, compacted, started_at, finished_at, run_count)
    SELECT 1, u.run_id, u.id, 0, 'call_long_' || u.id, 'list_files', '{}'::jsonb, '{}', '',
        'read_only', 'succeeded', repeat('file.txt ', 200), repeat('file.txt ', 200), '', false,
        u.created_at, u.created_at, 1
    FROM agents_turn u WHERE u.task_id = 1 AND u.index > 2 AND u.role = 'assistant'
    """,
    # The timeline: 2M events; task #1 gets 20k of them.
    """
    INSERT INTO tasks_taskevent (task_id, run_id, kind, actor_kind, actor_label, from_status,
                                 to_status, data, created_at)
    SELECT CASE WHEN g %% 100 = 0 THEN 1 ELSE (g %% %(tasks)s) + 1 END, NULL,
        (ARRAY['model_turn', 'tool_result', 'claimed', 'submitted', 'created'])[1 + g %% 5],
        CASE WHEN g %% 5 = 4 THEN 'person' ELSE 'worker' END, 'bench-worker', '', '',
        jsonb_build_object('turn', g %% 7, 'tool', 'read_file', 'ok', true),
        now() - make_interval(secs => %(events)s - g)
    FROM generate_series(1, %(events)s) g
    """,
]


def load(tasks: int, events: int) -> dict:
    from django.db import connection

    from agents.models import Connection, Model

    conn = Connection.objects.create(
        name="bench", kind="openai_compatible", base_url="http://127.0.0.1:9/v1"
    )
    model = Model.objects.create(connection=conn, name="bench-model", test_status="passed")
    params = {"tasks": tasks, "events": events, "conn": conn.pk, "model": model.pk}
    started = time.monotonic()
    with connection.cursor() as cursor:
        for sql in LOAD_SQL:
            cursor.execute(sql, params)
        for table in (
            "tasks_task",
            "tasks_taskevent",
            "agents_agentrun",
            "agents_turn",
            "agents_toolcall",
            "approvals_approval",
            "approvals_reviewdecision",
        ):
            cursor.execute(f"ANALYZE {table}")
        cursor.execute(
            "SELECT (SELECT count(*) FROM tasks_task), (SELECT count(*) FROM tasks_taskevent), "
            "(SELECT count(*) FROM agents_turn), (SELECT count(*) FROM agents_toolcall), "
            "(SELECT count(*) FROM approvals_approval WHERE status = 'pending'), "
            "(SELECT count(*) FROM approvals_reviewdecision WHERE choice = 'pending')"
        )
        counts = cursor.fetchone()
    keys = ("tasks", "events", "turns", "tool_calls", "pending_approvals", "pending_reviews")
    return {**dict(zip(keys, counts, strict=True)), "load_seconds": time.monotonic() - started}


def measure(client, url: str, repeat: int) -> dict:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    for _ in range(3):
        response = client.get(url)
        if response.status_code != 200:
            raise RuntimeError(f"{url} answered {response.status_code}")
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        client.get(url)
        times.append((time.perf_counter() - started) * 1000)
    with CaptureQueriesContext(connection) as ctx:
        started = time.perf_counter()
        response = client.get(url)
        with_capture = (time.perf_counter() - started) * 1000
    sql_ms = sum(float(q["time"]) for q in ctx.captured_queries) * 1000
    return {
        "url": url,
        "median_ms": statistics.median(times),
        "p95_ms": common.pct(times, 95),
        "queries": len(ctx.captured_queries),
        "sql_ms": sql_ms,
        "captured_ms": with_capture,
        "bytes": len(response.content),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--events", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()

    os.environ["DJANGO_DEBUG"] = "false"
    # DEBUG off needs a secret key of its own (the settings refuse the development key).
    os.environ.setdefault("DJANGO_SECRET_KEY", secrets.token_urlsafe(50))
    db_url = common.recreate_database(DB)
    common.django_on(db_url)
    from django.contrib.auth import get_user_model
    from django.test import Client

    print(f"… loading {args.tasks:,} tasks and {args.events:,} events", flush=True)
    loaded = load(args.tasks, args.events)
    print(f"… loaded in {loaded['load_seconds']:.0f} s: {loaded}", flush=True)
    user = get_user_model().objects.create_superuser("bench", "bench@example.com", "bench-pw")
    client = Client()
    client.force_login(user)
    typical = args.tasks // 2 + 4  # a task in review, with one run and three turns
    pages = [
        ("task list (first page)", "/"),
        ("task list, status=review", "/?status=review"),
        ("task list, deep page", f"/?before={args.tasks // 2}"),
        ("task page (typical task)", f"/tasks/{typical}/"),
        ("task page (400 turns, 20k events)", "/tasks/1/"),
        (
            f"approvals inbox ({loaded['pending_approvals']:,} + {loaded['pending_reviews']:,} "
            "pending)",
            "/approvals/",
        ),
    ]
    results = []
    for label, url in pages:
        print(f"… {label}: {url}", flush=True)
        results.append({"page": label, **measure(client, url, args.repeat)})

    facts = common.machine()
    vers = common.versions()
    rows = [
        [
            r["page"],
            f"`{r['url']}`",
            f"{r['median_ms']:.1f}",
            f"{r['p95_ms']:.1f}",
            r["queries"],
            f"{r['sql_ms']:.1f}",
            f"{r['median_ms'] / GOAL_MS:.2f}× ({common.verdict(r['median_ms'] < GOAL_MS)})",
        ]
        for r in results
    ]
    table = common.print_table(
        f"console: {loaded['tasks']:,} tasks, {loaded['events']:,} events",
        [
            "page",
            "url",
            "median ms",
            "p95 ms",
            "queries",
            "SQL ms (one request)",
            f"median ÷ {GOAL_MS:g} ms goal",
        ],
        rows,
    )
    section = (
        f"### console\n\n`.venv/bin/python bench/console.py --tasks {args.tasks} "
        f"--events {args.events}`\n\n{common.facts_line(facts, vers)}\n\n"
        f"Loaded: {loaded['tasks']:,} tasks, {loaded['events']:,} events, {loaded['turns']:,} "
        f"turns, {loaded['tool_calls']:,} tool calls, {loaded['pending_approvals']:,} pending "
        f"approvals, {loaded['pending_reviews']:,} pending needs_review decisions "
        f"({loaded['load_seconds']:.0f} s). Server time through Django's test client, DEBUG "
        f"off, {args.repeat} requests per page after 3 warm-ups.\n\n{table}\n"
    )
    goals = [
        [
            f"{r['page']} < {GOAL_MS:g} ms",
            f"{r['median_ms']:.0f} ms median = {r['median_ms'] / GOAL_MS:.2f}× the bound, "
            f"{r['queries']} queries",
            common.verdict(r["median_ms"] < GOAL_MS),
        ]
        for r in results
    ]
    common.record(
        NAME,
        section,
        {"facts": facts, "versions": vers, "loaded": loaded, "pages": results},
        goals,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
