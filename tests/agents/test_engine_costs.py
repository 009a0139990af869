"""What a step costs the database, counted (not timed): SQL statements and commits of a real worker
slot (in this thread) running real tasks against the scripted model server on loopback.

Goals (issue 12): ≤ 8 statements and 1 commit per step whose tools are read-only or idempotent;
≤ 2 commits per step with an external call (issue 36: its intent together with the turn that asks
for it, then its result as soon as it returns — issue 21, item 8); ≤ 2 commits for a one-turn task
from claim to review. Commits are counted in this thread and, for the external step, by PostgreSQL
itself (pg_stat_database.xact_commit).
A step's cost is measured as the difference between two tasks that differ only in their number of
steps, so what a run pays once (loading its state, the claim, the outcome) cancels out.
"""

import hashlib
import http.server
import json
import threading
from dataclasses import dataclass, field

import pytest
from django.db import connection

from agents.engine.runtime.worker import Worker
from agents.engine.store import claim_next
from agents.models import Conversation, ToolCall
from agents.states import ToolCallStatus
from tasks.models import Task
from tasks.states import TaskStatus
from tasks.workspace import add_input_file
from tests.agents.scripted import fast_settings, status_of, tool_task
from tests.fakes.http_target import HttpTarget
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

pytestmark = pytest.mark.django_db(transaction=True)


@dataclass
class Counts:
    statements: int = 0
    commits: int = 0
    sql: list[str] = field(default_factory=list)


@pytest.fixture
def count(monkeypatch):
    """Count this thread's SQL statements (BEGIN/COMMIT are not statements here) and commits:
    each transaction.atomic() commit, and each write statement run in autocommit mode (the
    SELECT that calls the step function `acthelm_step` is one, as is the claim's
    `acthelm_claim`)."""
    counts = Counts()
    original_commit = connection.commit

    def commit():
        counts.commits += 1
        return original_commit()

    def wrapper(execute, sql, params, many, context):
        counts.statements += 1
        counts.sql.append(sql.split(None, 1)[0].upper())
        if not context["connection"].in_atomic_block and (
            not sql.lstrip().upper().startswith("SELECT")
            or "acthelm_step(" in sql
            or "acthelm_claim(" in sql
        ):
            counts.commits += 1
        return execute(sql, params, many, context)

    monkeypatch.setattr(connection, "commit", commit)

    def measure(fn):
        before = Counts(counts.statements, counts.commits, list(counts.sql))
        with connection.execute_wrapper(wrapper):
            fn()
        return Counts(
            counts.statements - before.statements,
            counts.commits - before.commits,
            counts.sql[len(before.sql) :],
        )

    return measure


def _run_one(task) -> None:
    claim = claim_next(worker_id="w")
    assert claim is not None and claim.task_id == task.pk
    Worker(worker_id="w").process(claim)


def test_a_one_turn_task_takes_two_commits_from_claim_to_review(settings, count):
    fast_settings(settings)
    with ScriptedModelServer([reply_text("the answer")]) as server:
        task = tool_task(server, [])
        cost = count(lambda: _run_one(task))
    assert status_of(task) == TaskStatus.REVIEW
    print(f"\none-turn task, claim to review: {cost.statements} statements, {cost.commits} commits")
    assert cost.commits <= 2
    # The claim 1; the start 1 (the task with its run, conversation, usage and whether any
    # memory entry is active, in one statement: no entry, no ranking); the step with the run's
    # end and the task's move to review 1 (the step function's hand-off). The verdict reads
    # nothing: a task that made no tool call has no calls and no artifacts to read.
    # 18 before the start and the end were built once, 12 while the end was a transaction of
    # its own (fence, conversation, turn, events, the run's usage, the run's end, the task, its
    # event, the outbox's targets), 4 while the verdict read a task with no call.
    assert cost.statements <= 3


def _read_steps(settings, count, steps: int) -> Counts:
    script = [reply_tool_calls([("read_file", {"path": "notes.txt"})]) for _ in range(steps)]
    with ScriptedModelServer([*script, reply_text("done")]) as server:
        task = tool_task(server, ["read_file"], limits={"limit_turns": 100})
        add_input_file(task.pk, name="notes.txt", data="alpha\nbeta\n")
        cost = count(lambda: _run_one(task))
    assert status_of(task) == TaskStatus.REVIEW
    return cost


def _fetch_steps(settings, count, target, steps: int) -> Counts:
    script = [
        reply_tool_calls([("fetch_url", {"url": f"{target.url}/text"})]) for _ in range(steps)
    ]
    with ScriptedModelServer([*script, reply_text("done")]) as server:
        task = tool_task(
            server,
            ["fetch_url"],
            allowed_domains=["127.0.0.1"],
            limits={"limit_turns": 100, "limit_network_requests": 100},
        )
        cost = count(lambda: _run_one(task))
    assert status_of(task) == TaskStatus.REVIEW
    return cost


def test_a_step_with_a_read_only_tool_costs_at_most_8_statements_and_1_commit(settings, count):
    fast_settings(settings)
    short, long = _read_steps(settings, count, 2), _read_steps(settings, count, 6)
    statements = (long.statements - short.statements) / 4
    commits = (long.commits - short.commits) / 4
    print(f"\nread-only step: {statements:g} statements, {commits:g} commits")
    assert statements <= 8
    assert commits <= 1


def test_a_tasks_first_step_writes_its_conversation_in_the_one_step_statement(settings, count):
    """The first step carries the task's system prompt and tool pins: the step function writes
    them with the step (migration agents 0019), so the first step costs what any step costs —
    a fleet's tasks all take their first step at once."""
    fast_settings(settings)
    with ScriptedModelServer([reply_text("the answer")]) as server:
        task = tool_task(server, [])
        answer_only = count(lambda: _run_one(task))
    one_step = _read_steps(settings, count, 1)
    # The first step is one statement; its tool's result is stored before the verdict reads it
    # (one more), and the verdict reads the call (one more: a task that only answers has no
    # call to read); the end is the answer's one statement either way: three more than a task
    # that only answers (seven more when the first step took a transaction of its own: the
    # fence, the conversation, turns, calls, events, the run).
    print(f"\nfirst step: {one_step.statements - answer_only.statements} statements more")
    assert one_step.statements <= answer_only.statements + 3, (one_step.sql, answer_only.sql)
    conversation = Conversation.objects.get(task=Task.objects.latest("id"))
    assert conversation.system_prompt and conversation.system_prompt_sha256 == (
        hashlib.sha256(conversation.system_prompt.encode()).hexdigest()
    )
    assert conversation.tool_pins == {}  # built-in tools only: nothing to pin
    assert ToolCall.objects.get(task=conversation.task).status == ToolCallStatus.SUCCEEDED


def _server_commits() -> int:
    """The test database's committed transactions, as PostgreSQL counts them."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT xact_commit FROM pg_stat_database WHERE datname = current_database()"
        )
        return int(cursor.fetchone()[0])


def test_a_step_with_an_external_call_costs_at_most_2_commits(settings, count):
    fast_settings(settings)
    with HttpTarget() as target:
        short, long = (
            _fetch_steps(settings, count, target, 1),
            _fetch_steps(settings, count, target, 3),
        )
    statements = (long.statements - short.statements) / 2
    commits = (long.commits - short.commits) / 2
    print(f"\nexternal-call step: {statements:g} statements, {commits:g} commits")
    assert commits <= 2


def test_an_external_step_is_two_commits_at_the_server(settings, count):
    """Counted by PostgreSQL, every transaction of the process included (the worker's reads in
    autocommit count too, so the difference of two runs is compared, not a total)."""
    fast_settings(settings)
    # The heartbeat's renewals are autocommitted transactions too, one per beat: on a loaded
    # machine the longer run spans more beats. A beat slower than both runs keeps them out.
    settings.ACTHELM_HEARTBEAT_SECONDS = 60
    settings.ACTHELM_LEASE_SECONDS = 180

    def server_cost(steps: int) -> int:
        before = _server_commits()
        _fetch_steps(settings, count, target, steps)
        return _server_commits() - before

    # Another backend's counts reach the statistics when it flushes them (at most once a second,
    # or as it exits), so a run's can land in the next run's interval: they only ever add, and
    # the smaller of two runs is the one no other run's transactions leaked into.
    with HttpTarget() as target:
        short = min(server_cost(1), server_cost(1))
        long = min(server_cost(3), server_cost(3))
    per_step = (long - short) / 2
    print(f"\nexternal-call step at the server: {per_step:g} transactions")
    assert per_step <= 2
    assert per_step >= 1  # the counter sees the steps' writes at all


# --- One HTTP client per connection ----------------------------------------------------------


class _KeepAlive(http.server.BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint speaking HTTP/1.1 with keep-alive; records client ports."""

    protocol_version = "HTTP/1.1"
    ports: list[int] = []

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("content-length", 0)))
        self.ports.append(self.client_address[1])
        body = json.dumps(
            {
                "id": "x",
                "object": "chat.completion",
                "model": "m",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "ok"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1},
            }
        ).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_the_worker_keeps_one_http_connection_to_the_model_server():
    from agents.catalogue.providers import Message, build_provider

    _KeepAlive.ports = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/v1"
        for _ in range(3):  # a new provider object per turn, as the loop builds it per run
            provider = build_provider("openai_compatible", base_url=url, timeout=5)
            answer = provider.complete(
                model="m", messages=[Message(role="user", content="hi")], tools=[], max_tokens=5
            )
            assert answer.text == "ok"
    finally:
        server.shutdown()
        server.server_close()
    assert len(_KeepAlive.ports) == 3
    assert len(set(_KeepAlive.ports)) == 1  # three requests, one TCP connection


def test_runs_on_any_thread_or_fiber_share_the_processs_connection():
    """Every request is a task on the process's event loop (`core.fibers`), on one client per
    endpoint: runs one after another — from plain threads, or fibers on different step threads —
    use one kept-alive connection, and a new task's first request opens none."""
    from agents.catalogue.providers import Message, build_provider
    from core import fibers

    _KeepAlive.ports = []
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _KeepAlive)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v1"
    answers: list[str] = []

    def run() -> None:
        provider = build_provider("openai_compatible", base_url=url, timeout=5)
        answer = provider.complete(
            model="m", messages=[Message(role="user", content="hi")], tools=[], max_tokens=5
        )
        answers.append(answer.text)

    pool = fibers.Fibers(2, name="test-step")
    try:
        for _ in range(2):
            run_thread = threading.Thread(target=run)
            run_thread.start()
            run_thread.join()
        for _ in range(3):
            pool.spawn(run)
            assert pool.join(10)
    finally:
        pool.close()
        server.shutdown()
        server.server_close()
    assert answers == ["ok"] * 5
    assert len(_KeepAlive.ports) == 5
    assert len(set(_KeepAlive.ports)) == 1


def _mcp_steps(settings, count, steps: int) -> Counts:
    import sys

    from agents.catalogue.toolservers import toolserver_test
    from agents.models import ToolServer
    from core.actors import Actor
    from tests.agents.conftest import ROOT
    from tests.factories import UserFactory

    server_name = f"costs{steps}"
    ToolServer.objects.create(
        name=server_name,
        transport="stdio",
        command=[sys.executable, str(ROOT / "tests" / "fakes" / "mcp_server.py")],
    )
    person = UserFactory(perms=["agents.manage_toolservers"])
    assert toolserver_test(actor=Actor.person(person), name=server_name)["ok"]
    tool = f"{server_name}__add_item"
    script = [reply_tool_calls([(tool, {"name": f"n{i}"})]) for i in range(steps)]
    with ScriptedModelServer([*script, reply_text("done")]) as server:
        task = tool_task(server, [tool], tool_policies={tool: "allow"}, limits={"limit_turns": 100})
        cost = count(lambda: _run_one(task))
    assert status_of(task) == TaskStatus.REVIEW
    return cost


def test_a_step_with_an_external_mcp_call_costs_what_a_fetch_step_costs(settings, count):
    """The MCP count and the turn's cost ride in the step's existing statements."""
    fast_settings(settings)
    short, long = _mcp_steps(settings, count, 1), _mcp_steps(settings, count, 3)
    statements = (long.statements - short.statements) / 2
    commits = (long.commits - short.commits) / 2
    with HttpTarget() as target:
        f_short, f_long = (
            _fetch_steps(settings, count, target, 1),
            _fetch_steps(settings, count, target, 3),
        )
    fetch = (f_long.statements - f_short.statements) / 2
    print(f"\nexternal MCP step: {statements:g} statements, {commits:g} commits (fetch: {fetch:g})")
    assert commits <= 3
    assert statements <= fetch
