"""Agent steps: what one step costs (time, SQL statements, commits, WAL, server CPU) at
conversation lengths 10, 50 and 200, against LangGraph with PostgresSaver on the same database,
both driven by the same scripted OpenAI-compatible model server; and the capacity that follows.

    .venv/bin/python bench/steps.py [--lengths 10,50,200] [--count-lengths 10,50]
                                    [--external-lengths 10,50] [--profile-steps 50] [--repeat 3]

A step is one model turn that calls one tool plus that tool's result; a conversation of length L
is L such steps and then a final answer. The model (`bench/model_server.py steps`, its own
process, real HTTP on loopback) calls list_files (read-only) until the conversation holds L
results; in the external runs it calls fetch_url on a loopback page instead.

- Acthelm: one real worker process (`manage.py acthelm_worker --burst`) runs the task.
- LangGraph (two rows): a StateGraph (agent node → ToolNode → agent …) compiled with PostgresSaver
  on a psycopg connection to the same database, `durability="sync"` (each checkpoint committed
  before the next step starts, as Acthelm commits before it continues), in this process.
  *HTTP row* (the fair one): the model is langchain-openai's ChatOpenAI on the same scripted
  server. *In-process row*: the model is a small BaseChatModel in this process (no HTTP).

Step cost at length L: the median time of the last 9 steps of the conversation of length L (the
cost of one more step when the conversation is that long); steps/s: L over the whole run. The
timed runs are repeated in --repeat interleaved rounds; each row is the round with the median
steps/s, and the step cost the median over the rounds. Flatness (the goal): within the longest
conversation, so under one load, the cost of its last 9 steps ÷ the cost of the 9 steps around
step 10 (median over the rounds); the ratio across runs of different lengths is printed too.

Counted at the server for the real worker process (common.server_snapshot: nothing else runs on
the scratch database): transactions (xact_commit), commits (COMMIT records in the WAL: the
transactions that wrote), WAL bytes, rows written, server CPU. Per step = the difference between
the longest and the shortest conversation divided by the difference in steps (so the claim, the
set-up and the final answer, paid once per task, drop out). Statements are counted by the server
too, in separate untimed runs (--count-lengths, and the fetch_url runs): the embedded server has no
pg_stat_statements, so common.StatementLog logs every statement of the scratch database and counts
the lines. And they are counted in an in-process measuring slot (bench/inline.py: the same worker
slot in one process, with an execute_wrapper), which also splits a step's time into SQL, HTTP (the
provider's model call) and Python, step by step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import itertools

import common  # noqa: E402
from model_server import ModelServerProcess  # noqa: E402

NAME = "steps"
DB = "acthelm_bench_steps"
GOAL_GROWTH = 1.1
GOAL_VS_LANGGRAPH, MIN_VS_LANGGRAPH = 2.0, 1.0
GOAL_STATEMENTS = 8
GOAL_COMMITS = 1
GOAL_COMMITS_EXTERNAL = 2
TAIL = 9
HEARTBEAT_PROBE = 0.25  # s, the heartbeat interval while its cost is measured

# The server the capacity table is worked out for (bench/README.md, "Capacity on paper, round by
# round"; docs/operations.md, "Past one machine, on paper"): stated assumptions, not
# measurements. Server CPU per step is measured on this machine and assumed to scale per core.
SERVER = {
    "cores": 16,
    "cpu_budget": 0.7,  # of the cores, for the agents' steps
    "commits_per_s": 10_000,  # durable (fsync'd, group-committed) commits/s on NVMe
    "wal_mb_per_s": 100,  # sustained WAL, replication and archiving included
    "max_connections": 500,
    "reserved_connections": 50,  # console, admin, maintenance
    # worker --concurrency: a process runs hundreds of agents on its pool (bench/fleet.py ran 500)
    "agents_per_process": 500,
}
LATENCIES = (2.0, 20.0)
ACTHELM_TABLES = ["tasks\\_%", "agents\\_%", "approvals\\_%", "memory\\_%"]
LANGGRAPH_TABLES = ["checkpoint%"]


# --- what the database holds ------------------------------------------------------------------


def table_bytes(tables_like: list[str]) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        where = " OR ".join("c.relname LIKE %s" for _ in tables_like)
        cursor.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE n.nspname = 'public' AND c.relkind = 'r' AND ({where})",
            tables_like,
        )
        size = int(cursor.fetchone()[0])
    connection.close()  # this session's statistics are published now, not inside a window
    return size


def window(before_size: int, after_size: int, server: dict, length: int) -> dict:
    return {
        "bytes_per_step": (after_size - before_size) / length,
        "tuples_per_step": server["tuples"] / length,
        "wal_bytes_per_step": server["wal_bytes"] / length,
        "server": server,
    }


# --- Acthelm ----------------------------------------------------------------------------------


def create_task(model_url: str, length: int, *, target: str | None = None, name: str = ""):
    from agents.engine.run.intake import task_create
    from core.actors import Actor
    from tasks.workspace import add_input_file

    model = common.scripted_connection(model_url, name=name or f"steps-{length}")
    instruction = f"List the files again and again. steps:{length} then answer."
    tools, domains = ["list_files"], []
    if target:
        instruction = f"Fetch the page again and again. steps:{length} fetch:{target} then answer."
        tools, domains = ["fetch_url"], ["127.0.0.1"]
    task = task_create(
        actor=Actor.system("bench"),
        title=name or f"steps {length}",
        instruction=instruction,
        tools=tools,
        allowed_domains=domains,
        limits={
            "limit_turns": length + 5,
            "limit_token_budget": 100_000_000,
            "limit_network_requests": length + 5,
            "limit_runtime_seconds": 3600,
        },
        model=model,
    )
    for fname in ("a.txt", "b.txt", "c.csv"):
        add_input_file(task.pk, name=fname, data=f"{fname}\n")
    return task


def worker_env(media: str, **extra) -> dict:
    return {"ACTHELM_MEDIA_ROOT": media, "ACTHELM_FETCH_ALLOW_PRIVATE": "true", **extra}


def run_acthelm(
    db_url: str, model_url: str, length: int, media: str, target=None, *, statements=False
) -> dict:
    """One real worker process runs a task of `length` steps; with `statements`, the server logs
    and counts its statements too (common.StatementLog: not for the timed runs)."""
    from contextlib import nullcontext

    from agents.models import AgentRun, ToolCall, Turn

    common.truncate_acthelm()
    task = create_task(model_url, length, target=target)
    size0 = table_bytes(ACTHELM_TABLES)
    common.settle_stats()
    before = common.server_snapshot(DB)
    with common.StatementLog(DB) if statements else nullcontext() as log:
        worker = common.spawn_worker(db_url, f"steps-{length}", "--burst", env=worker_env(media))
        with common.ConnectionSampler(DB) as sampler:
            _, err = worker.communicate(timeout=1800)
    if worker.returncode != 0:
        raise RuntimeError(f"worker failed: {err[-2000:]}")
    common.settle_stats()
    after = common.server_snapshot(DB)
    server = common.server_delta(before, after)
    server["statements"] = log.count if log is not None else None
    server["statements_by_kind"] = log.by_kind if log is not None else None
    size1 = table_bytes(ACTHELM_TABLES)
    run = AgentRun.objects.get(task=task)
    if run.status != "succeeded":
        raise RuntimeError(f"the run ended {run.status} {run.error_code}: {run.error_message}")
    failed = ToolCall.objects.filter(task=task).exclude(status="succeeded").count()
    if failed:
        raise RuntimeError(f"{failed} tool calls did not succeed")
    times = list(
        Turn.objects.filter(task=task, role="assistant")
        .order_by("index")
        .values_list("created_at", flat=True)
    )
    if len(times) != length + 1:
        raise RuntimeError(f"expected {length + 1} model turns, got {len(times)}")
    marks = [run.started_at, *times]
    intervals = [(b - a).total_seconds() for a, b in itertools.pairwise(marks)][:length]
    total = (times[-1] - run.started_at).total_seconds()
    return {
        "length": length,
        "seconds": total,
        "steps_per_s": length / total,
        "step_ms_at_length": statistics.median(intervals[-TAIL:]) * 1000,
        "intervals_ms": [round(x * 1000, 2) for x in intervals],
        "step_ms_mean": total / length * 1000,
        "peak_connections": sampler.peak,
        **window(size0, size1, server, length),
    }


def run_connections(db_url: str, model_url: str, media: str, agents: int, length: int) -> int:
    """Server connections ONE worker process running `agents` tasks at once opens (the heartbeat
    every 0.5 s, so that every connection a running agent uses is open; each thread keeps its
    connection while it lives, so they are held together)."""
    common.truncate_acthelm()
    for i in range(agents):
        create_task(model_url, length, name=f"conn-{agents}-{i}")
    common.settle_stats(0.1)
    worker = common.spawn_worker(
        db_url,
        f"conn-{agents}",
        "--burst",
        "--concurrency",
        str(agents),
        env=worker_env(media, ACTHELM_HEARTBEAT_SECONDS="0.5"),
    )
    from django.db import connection

    connection.close()
    with common.ConnectionSampler(DB, interval=0.05) as sampler:
        _, err = worker.communicate(timeout=1800)
    if worker.returncode != 0:
        raise RuntimeError(f"worker failed: {err[-2000:]}")
    return sampler.distinct


def run_heartbeats(db_url: str, model_url: str, media: str, holds=(1.0, 11.0)) -> dict:
    """What one heartbeat costs the server: a one-turn task whose model answers after `hold`
    seconds, the heartbeat every HEARTBEAT_PROBE s; the difference between the two holds divided
    by the heartbeats in the difference (the worker's maintenance queries, once per ≤ 5 s per
    process, are included)."""
    out = {}
    for hold in holds:
        common.truncate_acthelm()
        task = create_task(model_url, 0, name=f"hold-{hold:g}")
        from tasks.models import Task

        Task.objects.filter(pk=task.pk).update(instruction=f"Wait. steps:0 hold:{hold:g}")
        table_bytes(ACTHELM_TABLES)  # closes this session: its statistics are published
        common.settle_stats()
        before = common.server_snapshot(DB)
        with common.StatementLog(DB) as log:
            worker = common.spawn_worker(
                db_url,
                f"hold-{hold:g}",
                "--burst",
                env=worker_env(media, ACTHELM_HEARTBEAT_SECONDS=str(HEARTBEAT_PROBE)),
            )
            _, err = worker.communicate(timeout=600)
        if worker.returncode != 0:
            raise RuntimeError(f"worker failed: {err[-2000:]}")
        common.settle_stats()
        server = common.server_delta(before, common.server_snapshot(DB))
        server["statements"] = log.count
        out[hold] = server
    a, b = out[min(holds)], out[max(holds)]
    beats = (max(holds) - min(holds)) / HEARTBEAT_PROBE
    per = {}
    for key in ("statements", "transactions", "commits", "wal_bytes", "server_cpu_ms"):
        value = None if a[key] is None or b[key] is None else (b[key] - a[key]) / beats
        # A checkpoint's full-page writes or autovacuum inside the short window can outweigh 40
        # heartbeats: a negative difference is noise, reported as n/a (and left out).
        per[key] = value if value is None or value >= 0 else None
    return {"runs": out, "per_heartbeat": per, "probe_interval_s": HEARTBEAT_PROBE}


def profile_steps(db_url: str, model_url: str, length: int, media: str, target=None) -> dict:
    """One task of `length` steps in the in-process measuring slot: per step (model call k up to
    model call k+1) statements, transactions, write commits and ms in SQL / HTTP / Python."""
    common.truncate_acthelm()
    create_task(model_url, length, target=target)
    out = common.inline_child(db_url, "steps-inline", env=worker_env(media))
    intervals = out["intervals"]
    if len(intervals) != length + 2:
        raise RuntimeError(f"expected {length + 2} intervals, got {len(intervals)}")
    steps = intervals[1 : length + 1]
    keys = ("statements", "transactions", "write_commits", "sql_ms", "http_ms", "wall_ms")
    med = {k: statistics.median(s[k] for s in steps) for k in keys}
    med["max_statements"] = max(s["statements"] for s in steps)
    med["max_write_commits"] = max(s["write_commits"] for s in steps)
    mean = {k: sum(s[k] for s in steps) / length for k in keys}
    mean["python_ms"] = mean["wall_ms"] - mean["sql_ms"] - mean["http_ms"]
    med["python_ms"] = med["wall_ms"] - med["sql_ms"] - med["http_ms"]
    by = common.sum_intervals(steps)["by_statement"]
    return {
        "length": length,
        "median": med,
        "mean": mean,
        "by_statement": {k: v / length for k, v in sorted(by.items(), key=lambda kv: -kv[1])},
        "setup": intervals[0],
        "finish": intervals[-1],
    }


# --- LangGraph --------------------------------------------------------------------------------


def langgraph_graph(workspace: Path, marks: list[float], model_url: str | None):
    from langchain_core.language_models.chat_models import BaseChatModel
    from langchain_core.messages import AIMessage
    from langchain_core.outputs import ChatGeneration, ChatResult
    from langchain_core.tools import tool
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode

    @tool
    def list_files() -> str:
        """List the files of the workspace."""
        return "\n".join(sorted(p.name for p in workspace.iterdir()))

    class FakeToolModel(BaseChatModel):
        """Calls list_files until the conversation holds `steps` results, then answers."""

        steps: int

        @property
        def _llm_type(self) -> str:
            return "fake-tool-caller"

        def _generate(self, messages, stop=None, run_manager=None, **kwargs):
            done = sum(1 for m in messages if m.type == "tool")
            if done < self.steps:
                message = AIMessage(
                    content="",
                    tool_calls=[{"name": "list_files", "args": {}, "id": f"call_{done}"}],
                )
            else:
                message = AIMessage(content=f"done after {done} steps")
            return ChatResult(generations=[ChatGeneration(message=message)])

    def build(steps: int):
        if model_url is None:
            model = FakeToolModel(steps=steps)
        else:
            from langchain_openai import ChatOpenAI

            model = ChatOpenAI(
                model="test-model", base_url=model_url, api_key="bench", max_retries=0, timeout=60
            ).bind_tools([list_files])

        def agent(state):
            marks.append(time.perf_counter())
            return {"messages": [model.invoke(state["messages"])]}

        def route(state):
            return "tools" if state["messages"][-1].tool_calls else END

        graph = StateGraph(MessagesState)
        graph.add_node("agent", agent)
        graph.add_node("tools", ToolNode([list_files]))
        graph.add_edge(START, "agent")
        graph.add_conditional_edges("agent", route, ["tools", END])
        graph.add_edge("tools", "agent")
        return graph

    return build


def run_langgraph(db_url: str, length: int, workspace: Path, model_url: str | None) -> dict:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    marks: list[float] = []
    build = langgraph_graph(workspace, marks, model_url)
    conninfo = common.libpq(db_url)
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row) as c:
        PostgresSaver(c).setup()
        c.execute("TRUNCATE checkpoints, checkpoint_blobs, checkpoint_writes")
    size0 = table_bytes(LANGGRAPH_TABLES)
    common.settle_stats()
    before = common.server_snapshot(DB)
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row) as c:
        app = build(length).compile(checkpointer=PostgresSaver(c))
        started = time.perf_counter()
        result = app.invoke(
            {"messages": [("user", f"List the files again and again. steps:{length}")]},
            {"configurable": {"thread_id": f"steps-{length}"}, "recursion_limit": 2 * length + 10},
            durability="sync",
        )
        total = time.perf_counter() - started
    common.settle_stats()
    after = common.server_snapshot(DB)
    server = common.server_delta(before, after)
    size1 = table_bytes(LANGGRAPH_TABLES)
    tools = sum(1 for m in result["messages"] if m.type == "tool")
    if tools != length:
        raise RuntimeError(f"LangGraph ran {tools} steps, not {length}")
    intervals = [b - a for a, b in itertools.pairwise(marks)][:length]
    return {
        "length": length,
        "seconds": total,
        "steps_per_s": length / total,
        "step_ms_at_length": statistics.median(intervals[-TAIL:]) * 1000,
        "intervals_ms": [round(x * 1000, 2) for x in intervals],
        "step_ms_mean": total / length * 1000,
        **window(size0, size1, server, length),
    }


# --- per step, from the server's counters -----------------------------------------------------


def marginal(by_length: dict[int, dict], key: str) -> float | None:
    """(value at the longest − value at the shortest) ÷ (difference in steps)."""
    lo, hi = min(by_length), max(by_length)
    a, b = by_length[lo]["server"][key], by_length[hi]["server"][key]
    if a is None or b is None or hi == lo:
        return None
    return (b - a) / (hi - lo)


def within_run_growth(runs: list[dict], position: int) -> tuple[float, float, float]:
    """In ONE conversation (so under one load): the cost of a step when the conversation is as
    long as the run (its last 9 steps) ÷ the cost when it is `position` long (the 9 steps around
    that position); the median over the rounds, with the two costs of that round."""
    values = []
    for r in runs:
        iv = r["intervals_ms"]
        early = statistics.median(iv[max(1, position - 5) : position + 4])
        late = statistics.median(iv[-TAIL:])
        values.append((late / early, early, late))
    return sorted(values)[len(values) // 2]


def median_run(runs: list[dict]) -> dict:
    """The run with the median steps/s; its step cost is the median over the runs too."""
    chosen = dict(sorted(runs, key=lambda r: r["steps_per_s"])[len(runs) // 2])
    chosen["step_ms_at_length"] = statistics.median(r["step_ms_at_length"] for r in runs)
    chosen["all_steps_per_s"] = [round(r["steps_per_s"], 2) for r in runs]
    chosen["all_step_ms_at_length"] = [round(r["step_ms_at_length"], 1) for r in runs]
    return chosen


def fmt(value, spec: str = ".2f", none: str = "n/a") -> str:
    return none if value is None else format(value, spec)


def capacity(inputs: dict) -> list[dict]:
    """Concurrently running agents one PostgreSQL carries, per limit (see docs/operations.md).

    One running agent asks the server, per second, for `rate` steps (rate = 1 / (model latency +
    the engine's own time per step)) plus one heartbeat every `heartbeat_s`; each limit divides
    the server's capacity by that load."""
    rows = []
    hb, every = inputs["per_heartbeat"], inputs["heartbeat_s"]

    def load(key: str, rate: float) -> float | None:
        step = inputs.get(key)
        if not step:
            return None
        beat = hb.get(key) or 0
        if key == "commits":
            # One heartbeat statement (one commit) per process renews all its agents' leases.
            beat /= SERVER["agents_per_process"]
        # CPU and WAL: each agent's lease row is still updated every interval; the cost of one
        # heartbeat of one agent is kept per agent (an upper bound: the statement is shared).
        return rate * step + beat / every

    for latency in LATENCIES:
        rate = 1 / (latency + inputs["step_ms"] / 1000)  # steps/s of one running agent
        limits = {}
        cpu, commits, wal = (load(k, rate) for k in ("server_cpu_ms", "commits", "wal_bytes"))
        if cpu:
            limits["CPU"] = SERVER["cores"] * SERVER["cpu_budget"] * 1000 / cpu
        if commits:
            limits["commits/s"] = SERVER["commits_per_s"] / commits
        if wal:
            limits["WAL"] = SERVER["wal_mb_per_s"] * 1e6 / wal
        per_agent = inputs["connections_per_agent"] + (
            inputs["connections_per_process"] / SERVER["agents_per_process"]
        )
        usable = SERVER["max_connections"] - SERVER["reserved_connections"]
        limits["connections"] = usable / per_agent
        carried = min(limits.values())
        # Workers through a transaction-mode pooler (LISTEN on a direct connection): a connection
        # is then held per transaction in flight, not per running agent.
        pooled = {k: v for k, v in limits.items() if k != "connections"}
        rows.append(
            {
                "latency_s": latency,
                "steps_per_s_per_agent": rate,
                "limits": limits,
                "agents": carried,
                "limited_by": min(limits, key=limits.get),
                "agents_pooled": min(pooled.values()) if pooled else None,
                "pooled_limited_by": min(pooled, key=pooled.get) if pooled else "",
                "steps_per_s": carried * rate,
                "commits_per_s": carried * (commits or 0),
                "statements_per_s": carried * (load("statements", rate) or 0),
            }
        )
    return rows


# --- main -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="10,50,200")
    parser.add_argument("--external-lengths", default="10,50")
    parser.add_argument("--count-lengths", default="10,50")
    parser.add_argument("--profile-steps", type=int, default=50)
    parser.add_argument("--connection-agents", type=int, default=4)
    parser.add_argument(
        "--repeat", type=int, default=3, help="interleaved rounds of the timed runs (median)"
    )
    args = parser.parse_args()
    lengths = [int(x) for x in args.lengths.split(",")]
    ext_lengths = [int(x) for x in args.external_lengths.split(",")]
    count_lengths = [int(x) for x in args.count_lengths.split(",")]
    lo, hi = min(lengths), max(lengths)

    media = tempfile.mkdtemp(prefix="acthelm-bench-steps-")
    os.environ["ACTHELM_MEDIA_ROOT"] = media
    db_url = common.recreate_database(DB)
    common.django_on(db_url)
    from tests.fakes.http_target import HttpTarget

    acthelm, counted, external, lg_http, lg_fake = {}, {}, {}, {}, {}
    workspace = Path(media) / "langgraph"
    workspace.mkdir()
    for name in ("a.txt", "b.txt", "c.csv"):
        (workspace / name).write_text(f"{name}\n")
    with ModelServerProcess("steps") as model_url, HttpTarget() as target:
        page = f"{target.url}/text"
        runs: dict[str, dict[int, list[dict]]] = {"a": {}, "h": {}, "g": {}}
        for r in range(args.repeat):  # interleaved, so that a burst of load hits all three
            for length in lengths:
                print(f"… round {r + 1}: Acthelm, {length} steps", flush=True)
                a = run_acthelm(db_url, model_url, length, media)
                runs["a"].setdefault(length, []).append(a)
                print(f"… round {r + 1}: LangGraph + ChatOpenAI over HTTP, {length} steps")
                h = run_langgraph(db_url, length, workspace, model_url)
                runs["h"].setdefault(length, []).append(h)
                print(f"… round {r + 1}: LangGraph, in-process model, {length} steps", flush=True)
                g = run_langgraph(db_url, length, workspace, None)
                runs["g"].setdefault(length, []).append(g)
        for length in lengths:
            acthelm[length] = median_run(runs["a"][length])
            lg_http[length] = median_run(runs["h"][length])
            lg_fake[length] = median_run(runs["g"][length])
        for length in count_lengths:
            print(f"… Acthelm, {length} steps, statements logged by the server", flush=True)
            counted[length] = run_acthelm(db_url, model_url, length, media, statements=True)
        for length in ext_lengths:
            print(f"… Acthelm, {length} steps calling fetch_url (statements logged)", flush=True)
            external[length] = run_acthelm(
                db_url, model_url, length, media, target=page, statements=True
            )
        print(f"… profile: {args.profile_steps} steps in the in-process slot", flush=True)
        profile = profile_steps(db_url, model_url, args.profile_steps, media)
        profile_ext = profile_steps(db_url, model_url, args.profile_steps, media, target=page)
        print("… what a heartbeat costs", flush=True)
        heartbeat = run_heartbeats(db_url, model_url, media)
        print("… connections of one worker process", flush=True)
        peak_1 = run_connections(db_url, model_url, media, 1, 100)
        peak_n = run_connections(db_url, model_url, media, args.connection_agents, 100)
    subprocess.run(["rm", "-rf", media], check=False)

    from django.conf import settings

    heartbeat_s = settings.ACTHELM_HEARTBEAT_SECONDS
    facts = common.machine()
    vers = common.versions(
        "langgraph", "langgraph-checkpoint-postgres", "langchain-core", "langchain-openai"
    )
    # -- the comparison table
    rows = []
    for length in lengths:
        a, h, g = acthelm[length], lg_http[length], lg_fake[length]
        rows.append(
            [
                length,
                a["steps_per_s"],
                h["steps_per_s"],
                g["steps_per_s"],
                f"{a['steps_per_s'] / h['steps_per_s']:.2f}×",
                f"{a['steps_per_s'] / g['steps_per_s']:.2f}×",
                a["step_ms_at_length"],
                h["step_ms_at_length"],
                g["step_ms_at_length"],
                " / ".join(
                    f"{x['steps_per_s'] / y['steps_per_s']:.2f}×"
                    for x, y in zip(runs["a"][length], runs["h"][length], strict=True)
                ),
            ]
        )
    table = common.print_table(
        "steps: Acthelm vs LangGraph + PostgresSaver (same PostgreSQL, same model server)",
        [
            "steps",
            "Acthelm steps/s",
            "LangGraph + ChatOpenAI (HTTP) steps/s",
            "LangGraph, in-process model steps/s",
            "Acthelm ÷ LangGraph HTTP (fair row)",
            "Acthelm ÷ LangGraph in-process",
            "Acthelm ms/step at this length",
            "LangGraph HTTP ms/step at this length",
            "LangGraph in-process ms/step at this length",
            "fair row, round by round",
        ],
        rows,
    )
    # -- what each step writes, at the server
    wrows = []
    for length in lengths:
        for label, r in (("Acthelm", acthelm[length]), ("LangGraph HTTP", lg_http[length])):
            s = r["server"]
            wrows.append(
                [
                    length,
                    label,
                    f"{s['transactions'] / length:.2f}",
                    fmt(None if s["commits"] is None else s["commits"] / length),
                    f"{r['wal_bytes_per_step']:,.0f}",
                    f"{r['tuples_per_step']:.1f}",
                    f"{r['bytes_per_step']:,.0f}",
                    fmt(None if s["server_cpu_ms"] is None else s["server_cpu_ms"] / length),
                ]
            )
    writes = common.print_table(
        "steps: what the server did per step (whole run ÷ steps; set-up and answer included)",
        [
            "steps",
            "system",
            "transactions/step",
            "commits/step (WAL)",
            "WAL bytes/step",
            "rows written/step",
            "table bytes/step",
            "server CPU ms/step",
        ],
        wrows,
    )
    # -- per step, counted
    m_tx, m_commits = marginal(acthelm, "transactions"), marginal(acthelm, "commits")
    m_wal, m_cpu = marginal(acthelm, "wal_bytes"), marginal(acthelm, "server_cpu_ms")
    m_tuples = marginal(acthelm, "tuples")
    s_stmt = marginal(counted, "statements")
    e_tx, e_commits = marginal(external, "transactions"), marginal(external, "commits")
    e_wal, e_stmt = marginal(external, "wal_bytes"), marginal(external, "statements")
    pm, pe = profile["median"], profile_ext["median"]
    count_rows = [
        [
            "list_files (read-only)",
            fmt(s_stmt, ".1f"),
            f"{pm['statements']:.0f} (max {pm['max_statements']})",
            fmt(m_tx),
            fmt(m_commits),
            f"{pm['transactions']:.0f} / {pm['write_commits']:.0f}",
            fmt(m_wal, ",.0f"),
            fmt(m_cpu),
        ],
        [
            "fetch_url (external)",
            fmt(e_stmt, ".1f"),
            f"{pe['statements']:.0f} (max {pe['max_statements']})",
            fmt(e_tx),
            fmt(e_commits),
            f"{pe['transactions']:.0f} / {pe['write_commits']:.0f}",
            fmt(e_wal, ",.0f"),
            "",
        ],
    ]
    c_lo, c_hi, x_lo, x_hi = min(counted), max(counted), min(external), max(external)
    counts = common.print_table(
        "steps: SQL statements and commits per step, counted (server columns: the difference "
        f"between {c_lo} and {c_hi} steps for statements, {lo} and {hi} for the rest, "
        f"{x_lo} and {x_hi} with fetch_url)",
        [
            "step's tool",
            "statements (server log)",
            "statements (in-process slot, median)",
            "transactions (server)",
            "commits (server, WAL)",
            "transactions / write commits (in-process)",
            "WAL bytes (server)",
            "server CPU ms",
        ],
        count_rows,
    )
    by_rows = [
        [k, f"{v:.2f}", f"{profile_ext['by_statement'].get(k, 0):.2f}"]
        for k, v in profile["by_statement"].items()
    ]
    for k, v in profile_ext["by_statement"].items():
        if k not in profile["by_statement"]:
            by_rows.append([k, "0.00", f"{v:.2f}"])
    by_table = common.print_table(
        "steps: SQL statements per step by kind (in-process slot)",
        ["statement", "list_files step", "fetch_url step"],
        by_rows,
    )
    # -- the profile of one step
    prof_rows = []
    for label, p in (("list_files (read-only)", profile), ("fetch_url (external)", profile_ext)):
        mean = p["mean"]
        prof_rows.append(
            [
                label,
                f"{mean['wall_ms']:.2f}",
                f"{mean['sql_ms']:.2f} ({mean['sql_ms'] / mean['wall_ms']:.0%})",
                f"{mean['http_ms']:.2f} ({mean['http_ms'] / mean['wall_ms']:.0%})",
                f"{mean['python_ms']:.2f} ({mean['python_ms'] / mean['wall_ms']:.0%})",
                f"{mean['statements']:.1f}",
            ]
        )
    prof_table = common.print_table(
        f"steps: where one step's time goes (in-process slot, mean of {args.profile_steps} steps)",
        ["step's tool", "ms/step", "SQL ms", "model HTTP ms", "Python ms (the rest)", "statements"],
        prof_rows,
    )
    # -- capacity inputs and the capacity on paper
    per_agent = max(0.0, (peak_n - peak_1) / max(1, args.connection_agents - 1))
    inputs = {
        "statements": s_stmt if s_stmt is not None else pm["statements"],
        "statements_source": "server log" if s_stmt is not None else "in-process",
        "transactions": m_tx,
        "commits": m_commits if m_commits is not None else pm["write_commits"],
        "commits_source": "server WAL" if m_commits is not None else "in-process",
        "wal_bytes": m_wal,
        "rows": m_tuples,
        "server_cpu_ms": m_cpu,
        "step_ms": acthelm[lo]["step_ms_at_length"],
        "connections_one_agent": peak_1,
        "connections_per_agent": per_agent,
        "connections_per_process": max(0.0, peak_1 - per_agent),
        "external_commits": e_commits if e_commits is not None else pe["write_commits"],
        "per_heartbeat": heartbeat["per_heartbeat"],
        "heartbeat_s": heartbeat_s,
    }
    in_rows = [
        [
            f"SQL statements per step, read-only tool ({inputs['statements_source']})",
            f"{inputs['statements']:.1f}",
        ],
        ["transactions per step (all, read-only included)", fmt(inputs["transactions"])],
        [f"commits per step ({inputs['commits_source']})", fmt(inputs["commits"])],
        ["commits per step with an external call", fmt(inputs["external_commits"])],
        ["WAL bytes per step", fmt(inputs["wal_bytes"], ",.0f")],
        ["rows written per step", fmt(inputs["rows"], ".1f")],
        ["server CPU ms per step (this machine)", fmt(inputs["server_cpu_ms"])],
        [f"engine ms per step (zero-latency model, {lo} steps)", fmt(inputs["step_ms"])],
        ["connections: one worker process running one agent", f"{peak_1}"],
        [
            f"connections per extra running agent (1 → {args.connection_agents} in one process)",
            f"{per_agent:.2f}",
        ],
    ]
    hbp = heartbeat["per_heartbeat"]
    in_rows.append(
        [
            f"one heartbeat (every {heartbeat_s:g} s per running agent): statements / transactions "
            "/ commits / WAL bytes / server CPU ms",
            f"{fmt(hbp['statements'], '.1f')} / {fmt(hbp['transactions'])} / "
            f"{fmt(hbp['commits'])} / {fmt(hbp['wal_bytes'], ',.0f')} / "
            f"{fmt(hbp['server_cpu_ms'])}",
        ]
    )
    in_table = common.print_table(
        "steps: capacity inputs (docs/operations.md)", ["measure", "value"], in_rows
    )
    cap = capacity(inputs)
    cap_rows = [
        [
            f"{c['latency_s']:g} s",
            *(fmt(c["limits"].get(k), ",.0f") for k in ("CPU", "commits/s", "WAL", "connections")),
            f"**{c['agents']:,.0f}**",
            c["limited_by"],
            f"{fmt(c['agents_pooled'], ',.0f')} ({c['pooled_limited_by']})",
            f"{c['steps_per_s']:,.0f}",
            f"{c['commits_per_s']:,.0f}",
        ]
        for c in cap
    ]
    server_text = (
        f"{SERVER['cores']} cores ({SERVER['cpu_budget']:.0%} for steps), "
        f"{SERVER['commits_per_s']:,} commits/s, {SERVER['wal_mb_per_s']} MB/s of WAL, "
        f"max_connections {SERVER['max_connections']} ({SERVER['reserved_connections']} "
        f"reserved), {SERVER['agents_per_process']} agents per worker process"
    )
    cap_table = common.print_table(
        f"steps: concurrently running agents one PostgreSQL carries ({server_text})",
        [
            "model latency per turn",
            "by CPU",
            "by commits/s",
            "by WAL",
            "by connections",
            "agents carried",
            "limited by",
            "agents carried, workers behind a transaction pooler (limited by)",
            "steps/s",
            "commits/s",
        ],
        cap_rows,
    )
    # -- goals
    growth, early, late = within_run_growth(runs["a"][hi], lo)
    across = acthelm[hi]["step_ms_at_length"] / acthelm[lo]["step_ms_at_length"]
    lg_growth = within_run_growth(runs["h"][hi], lo)[0]
    vs_http = acthelm[hi]["steps_per_s"] / lg_http[hi]["steps_per_s"]
    vs_fake = acthelm[hi]["steps_per_s"] / lg_fake[hi]["steps_per_s"]
    commits = inputs["commits"]
    goal_rows = [
        [
            f"≤ {GOAL_STATEMENTS} SQL statements per step (read-only tool)",
            f"{inputs['statements']:.1f} ({inputs['statements_source']}; in-process "
            f"{pm['statements']:.0f}, max {pm['max_statements']})",
            common.verdict(
                round(inputs["statements"], 1) <= GOAL_STATEMENTS
                and pm["max_statements"] <= GOAL_STATEMENTS
            ),
        ],
        [
            f"{GOAL_COMMITS} commit per step (read-only tool)",
            f"{commits:.2f} ({inputs['commits_source']}; in-process {pm['write_commits']:.0f})",
            common.verdict(round(commits, 1) <= GOAL_COMMITS),
        ],
        [
            f"≤ {GOAL_COMMITS_EXTERNAL} commits per step with an external call",
            f"{inputs['external_commits']:.2f} ({inputs['commits_source']}; in-process "
            f"{pe['write_commits']:.0f})",
            common.verdict(round(inputs["external_commits"], 1) <= GOAL_COMMITS_EXTERNAL),
        ],
        [
            f"step cost at {hi} within {GOAL_GROWTH}× of the cost at {lo}",
            f"{growth:.2f}× ({early:.1f} → {late:.1f} ms, within the {hi}-step conversation; "
            f"across runs {across:.2f}×)",
            common.verdict(growth <= GOAL_GROWTH),
        ],
        [
            f"≥ {GOAL_VS_LANGGRAPH}× LangGraph + ChatOpenAI over HTTP (fair row) at {hi} steps; "
            f"at least {MIN_VS_LANGGRAPH}×",
            f"{vs_http:.2f}× ({acthelm[hi]['steps_per_s']:.1f} vs "
            f"{lg_http[hi]['steps_per_s']:.1f} steps/s)",
            common.verdict_min(vs_http, GOAL_VS_LANGGRAPH, MIN_VS_LANGGRAPH),
        ],
    ]
    goals = common.print_table(
        "steps: goals",
        ["goal", "measured", "verdict"],
        [
            *goal_rows,
            [
                f"(for reference) Acthelm ÷ LangGraph with an in-process model at {hi}",
                f"{vs_fake:.2f}×",
                "",
            ],
            [
                f"(for reference) LangGraph HTTP step cost growth {lo} → {hi} (within a run)",
                f"{lg_growth:.2f}×",
                "",
            ],
        ],
    )
    command = (
        f"`.venv/bin/python bench/steps.py --lengths {args.lengths} --count-lengths "
        f"{args.count_lengths} --external-lengths {args.external_lengths} --profile-steps "
        f"{args.profile_steps} --repeat {args.repeat}`"
    )
    section = (
        f"### steps\n\n{command}\n\n{common.facts_line(facts, vers)}\n\n{table}\n\n{goals}\n\n"
        f"{counts}\n\n{by_table}\n\n{prof_table}\n\n{writes}\n\n{in_table}\n\n{cap_table}\n"
    )
    common.record(
        NAME,
        section,
        {
            "facts": facts,
            "versions": vers,
            "acthelm": acthelm,
            "acthelm_external": external,
            "acthelm_statements_logged": counted,
            "langgraph_http": lg_http,
            "langgraph_in_process": lg_fake,
            "profile": profile,
            "profile_external": profile_ext,
            "heartbeat": heartbeat,
            "capacity_inputs": inputs,
            "capacity_server": SERVER,
            "capacity": cap,
        },
        goal_rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
