"""Proposed changes to the dispatch path, applied in memory to a benchmark worker process only, to
measure what they would gain before anyone edits the project's modules:

    .venv/bin/python bench/dispatch.py --procs 1,2 --experiment lean

Each function patches the running process (`dispatch.py --experiment-worker NAME`); no file of the
project is changed. They are experiments, not fixes: the report that goes with them says where
each change belongs and what to watch.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import contextmanager

CLAIM_ONE_STATEMENT_SQL = """
WITH candidate AS (
    SELECT t.id FROM tasks_task t
    WHERE t.status = 'ready'
      AND (t.not_before IS NULL OR t.not_before <= now())
      AND NOT EXISTS (
          SELECT 1 FROM tasks_taskdependency d
          JOIN tasks_task dep ON dep.id = d.depends_on_id
          WHERE d.task_id = t.id AND dep.status <> 'done')
    ORDER BY t.priority DESC, t.id
    LIMIT 1
    FOR UPDATE SKIP LOCKED
), claimed AS (
    UPDATE tasks_task t
    SET status = 'in_progress', claim_count = t.claim_count + 1, lease_owner = %(worker)s,
        lease_expires_at = now() + make_interval(secs => %(lease)s), not_before = NULL,
        updated_at = now()
    FROM candidate WHERE t.id = candidate.id AND t.status = 'ready'
    RETURNING t.id, t.claim_count, t.connection_id, t.model_id
), previous AS (
    SELECT DISTINCT ON (r.task_id) r.task_id, r.id, r.number
    FROM agents_agentrun r JOIN claimed c ON r.task_id = c.id
    ORDER BY r.task_id, r.number DESC
), ids AS (
    SELECT nextval(pg_get_serial_sequence('agents_agentrun', 'id')) AS run_id,
           nextval(pg_get_serial_sequence('tasks_taskevent', 'id')) AS event_id
    FROM claimed
), run AS (
    INSERT INTO agents_agentrun (
        id, task_id, number, claim_count, claim_event_id, status, worker_id, started_at,
        model_turns, input_tokens, output_tokens, network_requests, active_seconds, checkpoint,
        answer, verdict, verdict_reason, error_code, error_message, connection_id, model_id)
    SELECT ids.run_id, c.id, coalesce(p.number, 0) + 1, c.claim_count, ids.event_id, 'started',
        %(worker)s, now(), 0, 0, 0, 0, 0, '{}', '', '', '', '', '', c.connection_id, c.model_id
    FROM claimed c CROSS JOIN ids LEFT JOIN previous p ON p.task_id = c.id
    RETURNING id, task_id, claim_count
), event AS (
    INSERT INTO tasks_taskevent (id, task_id, run_id, kind, actor_kind, actor_label, from_status,
                                 to_status, data, created_at)
    SELECT ids.event_id, c.id, ids.run_id, 'claimed', 'worker', %(worker)s, 'ready',
        'in_progress',
        jsonb_build_object('run_id', ids.run_id, 'newest_run_id_before', p.id,
                           'claim_count', c.claim_count),
        now()
    FROM claimed c CROSS JOIN ids LEFT JOIN previous p ON p.task_id = c.id
)
SELECT task_id, id, claim_count FROM run
"""


def claim_one_statement() -> None:
    """tasks.transitions.claim_next as ONE statement (one round trip instead of seven): the claim
    UPDATE, the run INSERT, the claim event INSERT and the run's claim_event link, with both ids
    drawn from their sequences inside the statement (the FKs are deferred to commit)."""
    from django.conf import settings
    from django.db import connection

    import agents.worker
    import tasks.transitions as transitions

    def claim_next(*, worker_id: str, lease_seconds: float | None = None):
        lease = settings.ACTHELM_LEASE_SECONDS if lease_seconds is None else lease_seconds
        with connection.cursor() as cursor:
            cursor.execute(CLAIM_ONE_STATEMENT_SQL, {"worker": worker_id, "lease": lease})
            row = cursor.fetchone()
        if row is None:
            return None
        return transitions.Claim(task_id=row[0], run_id=row[1], claim_count=row[2])

    transitions.claim_next = claim_next
    agents.worker.claim_next = claim_next


HOLDS_EXPR = """EXISTS (
    SELECT 1 FROM agents_agentrun r
    WHERE r.id = %s AND r.status = 'started' AND r.claim_count = tasks_task.claim_count
      AND r.id = (SELECT max(n.id) FROM agents_agentrun n WHERE n.task_id = tasks_task.id)
      AND NOT EXISTS (
          SELECT 1 FROM tasks_taskevent e
          WHERE e.task_id = tasks_task.id AND e.id > r.claim_event_id
            AND e.actor_kind = 'person' AND NOT (e.kind = ANY(%s))))"""


def fence_one_query() -> None:
    """tasks.transitions.fenced: lock the task and prove holds_attempt() in ONE statement (the
    SELECT … FOR UPDATE carries the holds check as a column) instead of two."""
    from django.db import transaction
    from django.db.models.expressions import RawSQL

    import agents.loop
    import agents.outcomes
    import tasks.transitions as transitions
    from tasks.exceptions import AttemptLost, TaskNotFound
    from tasks.models import Task
    from tasks.states import COOPERATIVE_EVENTS, HELD

    @contextmanager
    def fenced(run_id: int, task_id: int):
        with transaction.atomic():
            task = (
                Task.objects.select_for_update(of=("self",))
                .annotate(_holds=RawSQL(HOLDS_EXPR, [run_id, list(COOPERATIVE_EVENTS)]))
                .filter(pk=task_id)
                .first()
            )
            if task is None:
                raise TaskNotFound(f"task {task_id} does not exist")
            if task.status not in HELD or not task._holds:
                raise AttemptLost(f"run {run_id} no longer holds task {task_id}")
            yield task

    transitions.fenced = fenced
    agents.loop.fenced = fenced
    agents.outcomes.fenced = fenced


def persistent_event_loop() -> None:
    """agents.providers._http._run: reuse one event loop per thread instead of asyncio.run()
    (a new loop, its selector and its shutdown) for every model request."""
    import agents.providers._http as http

    local = threading.local()

    def _run(coro):
        loop = getattr(local, "loop", None)
        if loop is None or loop.is_closed():
            loop = asyncio.new_event_loop()
            local.loop = loop
        return loop.run_until_complete(coro)

    http._run = _run


def no_active_time_write() -> None:
    """agents.loop._FencedWrite: skip the separate UPDATE of the run's active_seconds on every
    fenced write. (The proposal is to fold the increment into the UPDATE of the run that the
    same transaction makes anyway; this experiment only measures the round trip it costs.)"""
    import agents.loop as loop

    def __enter__(self):
        self._cm = loop.fenced(self.loop.run_id, self.loop.task_id)
        return self._cm.__enter__()

    loop._FencedWrite.__enter__ = __enter__


def messages_cache() -> None:
    """agents.loop.AgentLoop._messages: read the history once per run and keep the messages (and
    their token estimates) in memory; each later call reads only the turns added since, plus the
    tool calls of the last assistant turn (their results arrive after the turn). The compaction
    check runs only when the running estimate comes near the window. (Per-step cost then stops
    growing with the conversation.)"""
    import json

    import agents.loop as loop
    from agents.models import ToolCall, Turn
    from agents.providers import Message, ToolCallRequest
    from agents.services import estimate_tokens
    from agents.states import Role

    def turn_messages(turn, calls):
        if turn.role != Role.ASSISTANT:
            return [Message(role="user", content=turn.content)]
        out = [
            Message(
                role="assistant",
                content=turn.content,
                tool_calls=[
                    ToolCallRequest(
                        id=c.call_id,
                        name=c.tool,
                        arguments=c.arguments,
                        arguments_raw=c.arguments_raw,
                    )
                    for c in calls
                ],
            )
        ]
        for c in calls:
            content = loop.PLACEHOLDER if c.compacted else c.result_for_model
            out.append(Message(role="tool", content=content, tool_call_id=c.call_id, name=c.tool))
        return out

    def cost(messages):
        return sum(
            estimate_tokens(m.content)
            + estimate_tokens(json.dumps([c.model_dump() for c in m.tool_calls]))
            for m in messages
        )

    def _messages(self, *, compact: bool):
        cache = getattr(self, "_bench_cache", None)
        if cache is None:
            system = [Message(role="system", content=self.conversation.system_prompt)]
            cache = self._bench_cache = {"turns": [], "parts": [], "system": (system, cost(system))}
        turns, parts = cache["turns"], cache["parts"]
        if turns and turns[-1].role == Role.ASSISTANT:  # its results may have arrived
            calls = sorted(ToolCall.objects.filter(turn_id=turns[-1].pk), key=lambda c: c.position)
            msgs = turn_messages(turns[-1], calls)
            parts[-1] = (msgs, cost(msgs))
        after = turns[-1].index if turns else -1
        for turn in (
            Turn.objects.filter(task_id=self.task_id, discarded=False, index__gt=after)
            .order_by("index")
            .prefetch_related("tool_calls")
        ):
            msgs = turn_messages(turn, sorted(turn.tool_calls.all(), key=lambda c: c.position))
            turns.append(turn)
            parts.append((msgs, cost(msgs)))
        total = cache["system"][1] + sum(c for _, c in parts)
        window = self.task.model.context_window
        if compact and window and total * 2 > window:
            self._bench_cache = None  # compaction may rewrite old results: rebuild from the DB
            return original(self, compact=compact)
        messages = list(cache["system"][0])
        for msgs, _ in parts:
            messages.extend(msgs)
        return messages, total

    original = loop.AgentLoop._messages
    loop.AgentLoop._messages = _messages


def lean() -> None:
    """All of the above together."""
    claim_one_statement()
    fence_one_query()
    persistent_event_loop()
    no_active_time_write()


# Measured one by one, then together, by `bench/dispatch.py`.
ALL = [
    "claim_one_statement",
    "fence_one_query",
    "persistent_event_loop",
    "no_active_time_write",
    "lean",
]
# Measured by `bench/steps.py` (the conversation-length path).
STEPS = ["messages_cache"]
