"""Agent steps: steps/s and bytes written per step at conversation lengths 10, 50 and 200, against
LangGraph with its PostgresSaver checkpointer on the same database, driven by a fake chat model.

    .venv/bin/python bench/steps.py [--lengths 10,50,200]

A step is one model turn that calls a trivial tool (list_files) plus that tool's result; a
conversation of length L is L such steps and then a final answer.

- Acthelm: one real worker process (`manage.py acthelm_worker --burst`) runs the task; the model is
  an OpenAI-compatible scripted server in this process (real HTTP on loopback) that calls
  list_files until the conversation holds L results, then answers.
- LangGraph: a StateGraph (agent node → ToolNode → agent …) compiled with PostgresSaver on a
  psycopg connection to the same database; the model is a small BaseChatModel in process (no HTTP)
  that emits the same tool call each turn.

Step cost at length L is the median time of the last 5 steps of the conversation of length L (the
cost of one more step when the conversation is that long); steps/s is L over the whole run.
Bytes written per step: the growth of the tables (pg_total_relation_size of every table the system
writes, indexes and TOAST included) divided by L; the tuple counts come from pg_stat_database, the
WAL bytes from pg_current_wal_lsn() (cluster-wide: other sessions on the server add to it).
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

import common  # noqa: E402

NAME = "steps"
DB = "acthelm_bench_steps"
GOAL_GROWTH = 1.2
GOAL_VS_LANGGRAPH = 5.0
TAIL = 5


def _count_tool_messages(messages: list[dict]) -> int:
    return sum(1 for m in messages if m.get("role") == "tool")


def model_program(length_of):
    """The scripted model: list_files until `length` results are in the conversation."""
    from tests.fakes.model_server import reply_text, reply_tool_calls

    def step(request_json):
        messages = (request_json or {}).get("messages") or []
        length = length_of(messages)
        done = _count_tool_messages(messages)
        if done < length:
            return reply_tool_calls([("list_files", {})])
        return reply_text(f"done after {done} steps")

    return step


def _length_from(messages: list[dict]) -> int:
    for m in messages:
        if m.get("role") == "user" and "steps:" in (m.get("content") or ""):
            return int(m["content"].split("steps:")[1].split()[0])
    return 0


# --- what the database wrote ------------------------------------------------------------------


def db_counters(tables_like: list[str]) -> dict:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_clear_snapshot()")
        cursor.execute(
            "SELECT tup_inserted, tup_updated, tup_deleted FROM pg_stat_database "
            "WHERE datname = current_database()"
        )
        ins, upd, dele = cursor.fetchone()
        where = " OR ".join("c.relname LIKE %s" for _ in tables_like)
        cursor.execute(
            "SELECT coalesce(sum(pg_total_relation_size(c.oid)), 0) FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            f"WHERE n.nspname = 'public' AND c.relkind = 'r' AND ({where})",
            tables_like,
        )
        size = int(cursor.fetchone()[0])
        cursor.execute("SELECT pg_current_wal_lsn()")
        lsn = cursor.fetchone()[0]
    return {"tuples": ins + upd + dele, "inserted": ins, "updated": upd, "size": size, "lsn": lsn}


def wal_diff(a: str, b: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_wal_lsn_diff(%s, %s)", [b, a])
        return int(cursor.fetchone()[0])


def delta(before: dict, after: dict, steps: int) -> dict:
    return {
        "bytes_per_step": (after["size"] - before["size"]) / steps,
        "tuples_per_step": (after["tuples"] - before["tuples"]) / steps,
        "wal_bytes_per_step": wal_diff(before["lsn"], after["lsn"]) / steps,
    }


ACTHELM_TABLES = ["tasks\\_%", "agents\\_%", "approvals\\_%", "memory\\_%"]
LANGGRAPH_TABLES = ["checkpoint%"]


# --- Acthelm ----------------------------------------------------------------------------------


def run_acthelm(db_url: str, server, length: int, media: str, entry: str | None = None) -> dict:
    from agents.models import AgentRun, Turn
    from tasks.actors import Actor
    from tasks.services import task_create
    from tasks.workspace import add_input_file

    common.truncate_acthelm()
    model = common.scripted_connection(server, name=f"steps-{length}")
    task = task_create(
        actor=Actor.system("bench"),
        title=f"steps {length}",
        instruction=f"List the files again and again. steps:{length} then answer.",
        tools=["list_files"],
        limits={"limit_turns": length + 5, "limit_token_budget": 100_000_000},
        model=model,
    )
    for name in ("a.txt", "b.txt", "c.csv"):
        add_input_file(task.pk, name=name, data=f"{name}\n")
    time.sleep(1.2)  # let this session's own statistics flush
    before = db_counters(ACTHELM_TABLES)
    if entry is None:
        worker = common.spawn_worker(
            db_url, f"steps-{length}", "--burst", env={"ACTHELM_MEDIA_ROOT": media}
        )
    else:  # a proposed change, applied in memory (bench/experiments.py)
        worker = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).resolve().parent / "dispatch.py"),
                "--experiment-worker",
                entry,
                f"steps-{length}",
                "--burst",
            ],
            env=common.child_env(db_url, ACTHELM_MEDIA_ROOT=media),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
    _, err = worker.communicate(timeout=1800)
    if worker.returncode != 0:
        raise RuntimeError(f"worker failed: {err[-2000:]}")
    time.sleep(1.2)
    after = db_counters(ACTHELM_TABLES)
    run = AgentRun.objects.get(task=task)
    if run.status != "succeeded":
        raise RuntimeError(f"the run ended {run.status} {run.error_code}: {run.error_message}")
    times = list(
        Turn.objects.filter(task=task, role="assistant")
        .order_by("index")
        .values_list("created_at", flat=True)
    )
    if len(times) != length + 1:
        raise RuntimeError(f"expected {length + 1} model turns, got {len(times)}")
    marks = [run.started_at, *times]
    intervals = [(b - a).total_seconds() for a, b in zip(marks, marks[1:], strict=False)][:length]
    total = (times[-1] - run.started_at).total_seconds()
    return {
        "length": length,
        "seconds": total,
        "steps_per_s": length / total,
        "step_ms_at_length": statistics.median(intervals[-TAIL:]) * 1000,
        "step_ms_mean": total / length * 1000,
        **delta(before, after, length),
    }


# --- LangGraph --------------------------------------------------------------------------------


def langgraph_graph(workspace: Path, marks: list[float]):
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
        model = FakeToolModel(steps=steps)

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


def run_langgraph(db_url: str, length: int, workspace: Path) -> dict:
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg.rows import dict_row

    marks: list[float] = []
    build = langgraph_graph(workspace, marks)
    conninfo = common.libpq(db_url)
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row) as c:
        saver = PostgresSaver(c)
        saver.setup()
        c.execute("TRUNCATE checkpoints, checkpoint_blobs, checkpoint_writes")
        app = build(length).compile(checkpointer=saver)
        time.sleep(1.2)
        before = db_counters(LANGGRAPH_TABLES)
        started = time.perf_counter()
        result = app.invoke(
            {"messages": [("user", f"List the files again and again. steps:{length}")]},
            {"configurable": {"thread_id": f"steps-{length}"}, "recursion_limit": 2 * length + 10},
        )
        total = time.perf_counter() - started
    time.sleep(1.2)
    from django.db import connection

    connection.close()  # a fresh session sees the saver's flushed statistics
    after = db_counters(LANGGRAPH_TABLES)
    tools = sum(1 for m in result["messages"] if m.type == "tool")
    if tools != length:
        raise RuntimeError(f"LangGraph ran {tools} steps, not {length}")
    intervals = [b - a for a, b in zip(marks, marks[1:], strict=False)][:length]
    return {
        "length": length,
        "seconds": total,
        "steps_per_s": length / total,
        "step_ms_at_length": statistics.median(intervals[-TAIL:]) * 1000,
        "step_ms_mean": total / length * 1000,
        **delta(before, after, length),
    }


# --- main -------------------------------------------------------------------------------------


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="10,50,200")
    parser.add_argument(
        "--experiment",
        action="append",
        default=None,
        help="also run a proposed change from bench/experiments.py (default: messages_cache)",
    )
    args = parser.parse_args()
    import experiments

    experiments_run = experiments.STEPS if args.experiment is None else args.experiment
    lengths = [int(x) for x in args.lengths.split(",")]

    media = tempfile.mkdtemp(prefix="acthelm-bench-steps-")
    os.environ["ACTHELM_MEDIA_ROOT"] = media
    db_url = common.recreate_database(DB)
    common.django_on(db_url)
    from tests.fakes.model_server import ScriptedModelServer

    acthelm, langgraph, proposals = {}, {}, {name: {} for name in experiments_run}
    workspace = Path(media) / "langgraph"
    workspace.mkdir()
    for name in ("a.txt", "b.txt", "c.csv"):
        (workspace / name).write_text(f"{name}\n")
    with ScriptedModelServer(
        [], default=model_program(_length_from), context_length=1_000_000
    ) as server:
        for length in lengths:
            print(f"… Acthelm, {length} steps", flush=True)
            acthelm[length] = run_acthelm(db_url, server, length, media)
            print(f"… LangGraph, {length} steps", flush=True)
            langgraph[length] = run_langgraph(db_url, length, workspace)
            for name in experiments_run:
                print(f"… Acthelm with the proposed change {name}, {length} steps", flush=True)
                proposals[name][length] = run_acthelm(db_url, server, length, media, name)
    subprocess.run(["rm", "-rf", media], check=False)

    facts = common.machine()
    vers = common.versions("langgraph", "langgraph-checkpoint-postgres", "langchain-core")
    rows = []
    for length in lengths:
        a, g = acthelm[length], langgraph[length]
        rows.append(
            [
                length,
                a["steps_per_s"],
                g["steps_per_s"],
                f"{a['steps_per_s'] / g['steps_per_s']:.2f}×",
                a["step_ms_at_length"],
                g["step_ms_at_length"],
                f"{a['bytes_per_step']:,.0f}",
                f"{g['bytes_per_step']:,.0f}",
                f"{a['tuples_per_step']:.1f} / {g['tuples_per_step']:.1f}",
                f"{a['wal_bytes_per_step']:,.0f} / {g['wal_bytes_per_step']:,.0f}",
            ]
        )
    headers = [
        "steps",
        "Acthelm steps/s",
        "LangGraph steps/s",
        "Acthelm ÷ LangGraph",
        "Acthelm ms/step at this length",
        "LangGraph ms/step at this length",
        "Acthelm bytes/step",
        "LangGraph bytes/step",
        "rows written/step (A / LG)",
        "WAL bytes/step (A / LG)",
    ]
    table = common.print_table("steps: Acthelm vs LangGraph + PostgresSaver", headers, rows)
    lo, hi = min(lengths), max(lengths)
    growth = acthelm[hi]["step_ms_at_length"] / acthelm[lo]["step_ms_at_length"]
    lg_growth = langgraph[hi]["step_ms_at_length"] / langgraph[lo]["step_ms_at_length"]
    vs = acthelm[hi]["steps_per_s"] / langgraph[hi]["steps_per_s"]
    goal_rows = [
        [
            f"Acthelm step cost at {hi} within {GOAL_GROWTH}× of the cost at {lo}",
            f"{growth:.2f}× ({acthelm[lo]['step_ms_at_length']:.1f} → "
            f"{acthelm[hi]['step_ms_at_length']:.1f} ms)",
            common.verdict(growth <= GOAL_GROWTH),
        ],
        [
            f"Acthelm ≥ {GOAL_VS_LANGGRAPH}× LangGraph's steps/s at {hi}",
            f"{vs:.2f}×",
            common.verdict(vs >= GOAL_VS_LANGGRAPH),
        ],
    ]
    goals = common.print_table(
        "steps: goals",
        ["goal", "measured", "verdict"],
        [
            *goal_rows,
            [f"(for reference) LangGraph step cost growth {lo} → {hi}", f"{lg_growth:.2f}×", ""],
        ],
    )
    prop_rows = []
    for name, by_length in proposals.items():
        for length in lengths:
            r = by_length[length]
            prop_rows.append(
                [
                    name,
                    length,
                    r["steps_per_s"],
                    f"{r['steps_per_s'] / acthelm[length]['steps_per_s']:.2f}×",
                    r["step_ms_at_length"],
                    f"{r['step_ms_at_length'] / by_length[lo]['step_ms_at_length']:.2f}×",
                ]
            )
    prop_table = ""
    if prop_rows:
        prop_table = common.print_table(
            "steps: proposed changes (bench/experiments.py, applied in memory to the worker)",
            [
                "change",
                "steps",
                "steps/s",
                "vs unchanged",
                "ms/step at this length",
                f"growth from {lo}",
            ],
            prop_rows,
        )
    section = (
        f"### steps\n\n`.venv/bin/python bench/steps.py --lengths {args.lengths}`\n\n"
        f"{common.facts_line(facts, vers)}\n\n{table}\n\n{goals}\n\n{prop_table}\n"
    )
    common.record(
        NAME,
        section,
        {
            "facts": facts,
            "versions": vers,
            "acthelm": acthelm,
            "langgraph": langgraph,
            "proposals": proposals,
        },
        goal_rows,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
