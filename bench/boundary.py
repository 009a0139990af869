"""The step boundary as the conversation grows: from a model answer's last byte to the next
request's first byte, and the CPU the agent's process spends in between, for Acthelm and for
LangGraph beside it in the same run.

    .venv/bin/python bench/boundary.py [--steps 200] [--file-kb 10] [--cap-kb 200] [--repeat 2]

The task: the model (a scripted OpenAI-compatible server in a process of its own, HTTP/1.1 with
keep-alive, on loopback) asks for `read_file big.txt` (a --file-kb text file) while the tool
results in the conversation hold less than --cap-kb, then for `read_file small.txt` (one line), so
that the conversation reaches ~200 KB (~50k tokens) at step 20 and stays there to step --steps;
then it answers. The server timestamps (CLOCK_MONOTONIC) when it has written each answer's last
byte and when the next request's first byte arrives, and reads the watched process's CPU time at
both instants (the sum of `/proc/<pid>/task/*/schedstat`: every thread, in nanoseconds). A
boundary = the model's answer k → the request k+1: the answer parsed, the step recorded, the tool
run, its result recorded, the next request built and sent.

- Acthelm: one real worker process (`manage.py acthelm_worker --burst`), the task's tool
  `read_file`, on its own scratch database.
- LangGraph (the fair row): a StateGraph (agent → ToolNode → agent …) with langchain-openai's
  ChatOpenAI on the same server, PostgresSaver on the same database with `durability="sync"`,
  its tool reading the same file and returning the same numbered lines as Acthelm's read_file.
  It runs in this process (watched the same way).

Figures, per system, the median over --repeat interleaved rounds of: the boundary's wall time and
CPU at steps 6–10 (the conversation at ~60–100 KB), at steps 16–20 (~160–200 KB) and at the last
five steps (200 KB and up; --steps 200: steps 196–200). Goals (issue 36): the boundary at step 200
within 1.1× of the one at step 10, and under 10 ms at 200 KB.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

NAME = "boundary"
DB = "acthelm_bench_boundary"
GOAL_GROWTH = 1.1
GOAL_MS = 10.0
LANGGRAPH_TABLES = ("checkpoints", "checkpoint_blobs", "checkpoint_writes")


# --- the scripted model server, with timestamps ---------------------------------------------------


def process_cpu_ns(pid: int) -> int:
    """CPU time of every thread of `pid`, in ns (the first field of each thread's schedstat)."""
    total = 0
    base = f"/proc/{pid}/task"
    for tid in os.listdir(base):
        try:
            with open(f"{base}/{tid}/schedstat", "rb") as fh:
                total += int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):
            continue
    return total


def program(request: dict, cap: int, steps: int) -> dict:
    """The scripted answer: read big.txt until the results hold `cap` characters, then small.txt;
    after `steps` results, a text answer."""
    from tests.fakes.model_server import render_reply, reply_text, reply_tool_calls

    messages = request.get("messages") or []
    results = [m for m in messages if m.get("role") == "tool"]
    size = sum(len(m.get("content") or "") for m in results)
    if len(results) >= steps:
        step = reply_text(f"done after {len(results)} steps")
    else:
        name = "big.txt" if size < cap else "small.txt"
        step = reply_tool_calls([("read_file", {"path": name}, f"call_{len(results)}")])
    return render_reply(step, "openai", request, {"prompt_tokens": 10, "completion_tokens": 5})


class Server:
    """One thread per connection; keep-alive; every POST answered at once by `program`."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.pid = 0
        self.cap, self.steps = 0, 0
        self.events: list[tuple[str, float, int]] = []  # (kind, monotonic ns, cpu ns)
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"

    def serve(self) -> None:
        while True:
            conn, _ = self.sock.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self.connection, args=(conn,), daemon=True).start()

    def mark(self, kind: str) -> None:
        now = time.monotonic_ns()
        cpu = process_cpu_ns(self.pid) if self.pid else 0
        with self.lock:
            self.events.append((kind, now, cpu))

    def connection(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                if not buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf = chunk
                first = True  # this request's first byte is here
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                lines = head.decode("latin-1").split("\r\n")
                method, path = lines[0].split(" ")[:2]
                headers = {}
                for line in lines[1:]:
                    key, _, value = line.partition(":")
                    headers[key.strip().lower()] = value.strip()
                length = int(headers.get("content-length") or 0)
                while len(buf) < length:
                    chunk = conn.recv(max(65536, length - len(buf)))
                    if not chunk:
                        return
                    buf += chunk
                body, buf = buf[:length], buf[length:]
                post = method == "POST" and path.endswith("/chat/completions")
                if post and first:
                    self.mark("request")
                if post:
                    out = json.dumps(program(json.loads(body), self.cap, self.steps)).encode()
                elif path.rstrip("/").endswith("/models"):
                    out = json.dumps({"object": "list", "data": [{"id": "test-model"}]}).encode()
                else:
                    out = b"{}"
                close = headers.get("connection", "").lower() == "close"
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + f"Content-Length: {len(out)}\r\n".encode()
                    + (b"Connection: close\r\n" if close else b"")
                    + b"\r\n"
                    + out
                )
                if post:
                    self.mark("answer")
                if close:
                    return


def serve_main(cap: int, steps: int) -> int:
    """`boundary.py --serve CAP STEPS`: prints the URL, then obeys stdin: `watch PID` (clear the
    events, watch PID's CPU), `dump` (print the events as a JSON line)."""
    server = Server()
    server.cap, server.steps = cap, steps
    threading.Thread(target=server.serve, daemon=True).start()
    print(server.url, flush=True)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "watch":
            with server.lock:
                server.events = []
                server.pid = int(cmd[1])
            print("ok", flush=True)
        elif cmd[0] == "dump":
            with server.lock:
                print(json.dumps(server.events), flush=True)
    return 0


class ServerProcess:
    def __init__(self, cap: int, steps: int):
        self.args = [sys.executable, __file__, "--serve", str(cap), str(steps)]

    def __enter__(self):
        self.proc = subprocess.Popen(
            self.args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.url = self.proc.stdout.readline().strip()
        return self

    def ask(self, line: str) -> str:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def watch(self, pid: int) -> None:
        assert self.ask(f"watch {pid}") == "ok"

    def boundaries(self) -> list[tuple[float, float]]:
        """(wall ms, CPU ms) of each boundary: answer k's last byte → request k+1's first."""
        events = json.loads(self.ask("dump"))
        out, answer = [], None
        for kind, at, cpu in events:
            if kind == "answer":
                answer = (at, cpu)
            elif kind == "request" and answer is not None:
                out.append(((at - answer[0]) / 1e6, (cpu - answer[1]) / 1e6))
                answer = None
        return out

    def __exit__(self, *exc):
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


# --- the file both systems read ------------------------------------------------------------------


def big_text(kb: int) -> str:
    line = "The quick brown fox jumps over the lazy dog; pack my box with five dozen jugs. "
    n = kb * 1024 // (len(line) + 1)
    return "\n".join(f"{i:04d} {line}" for i in range(n)) + "\n"


def numbered(text: str, name: str) -> str:
    """What Acthelm's read_file returns for a whole small file (header and numbered lines)."""
    lines = text.splitlines()
    body = "\n".join(f"{i + 1:>6}\t{t}" for i, t in enumerate(lines))
    return f"{name} ({len(text.encode())} B), lines 1-{len(lines)} of {len(lines)}\n{body}"


# --- Acthelm -------------------------------------------------------------------------------------


def run_acthelm(
    db_url: str, server: ServerProcess, steps: int, media: str, files: dict, spy: str = ""
) -> dict:
    from agents.engine.run.intake import task_create
    from agents.models import AgentRun
    from core.actors import Actor
    from tasks.workspace import add_input_file

    common.truncate_acthelm()
    model = common.scripted_connection(server.url, name="boundary")
    task = task_create(
        actor=Actor.system("bench"),
        title=f"boundary {steps}",
        instruction="Read the file again and again, then answer.",
        tools=["read_file"],
        limits={
            "limit_turns": steps + 5,
            "limit_token_budget": 1_000_000_000,
            "limit_runtime_seconds": 3600,
        },
        model=model,
    )
    for name, text in files.items():
        add_input_file(task.pk, name=name, data=text)
    worker = common.spawn_worker(db_url, "boundary", "--burst", env={"ACTHELM_MEDIA_ROOT": media})
    server.watch(worker.pid)
    profiler = None
    if spy:  # a sampling profile of the worker (py-spy, the bench extra), in py-spy's raw format
        exe = Path(sys.executable).parent / "py-spy"
        profiler = subprocess.Popen(
            [str(exe), "record", "-p", str(worker.pid), "-r", "1000", "-f", "raw", "-o", spy],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
    _, err = worker.communicate(timeout=1800)
    if profiler is not None:
        profiler.wait(60)
    if worker.returncode != 0:
        raise RuntimeError(f"worker failed: {err[-2000:]}")
    run = AgentRun.objects.get(task=task)
    if run.status != "succeeded":
        raise RuntimeError(f"the run ended {run.status} {run.error_code}: {run.error_message}")
    got = server.boundaries()
    if len(got) != steps:
        raise RuntimeError(f"Acthelm: {len(got)} boundaries, expected {steps}")
    return {"boundaries": got}


# --- LangGraph -----------------------------------------------------------------------------------


def run_langgraph(db_url: str, server: ServerProcess, steps: int, workspace: Path) -> dict:
    import psycopg
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.graph import END, START, MessagesState, StateGraph
    from langgraph.prebuilt import ToolNode
    from psycopg.rows import dict_row

    @tool
    def read_file(path: str) -> str:
        """Read a text file from the workspace."""
        name = Path(path).name
        return numbered((workspace / name).read_text(), name)

    model = ChatOpenAI(
        model="test-model", base_url=server.url, api_key="bench", max_retries=0, timeout=60
    ).bind_tools([read_file])

    def agent(state):
        return {"messages": [model.invoke(state["messages"])]}

    def route(state):
        return "tools" if state["messages"][-1].tool_calls else END

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", ToolNode([read_file]))
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", route, ["tools", END])
    graph.add_edge("tools", "agent")
    conninfo = common.libpq(db_url)
    with psycopg.connect(conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row) as c:
        PostgresSaver(c).setup()
        c.execute(f"TRUNCATE {', '.join(LANGGRAPH_TABLES)}")
        app = graph.compile(checkpointer=PostgresSaver(c))
        server.watch(os.getpid())
        result = app.invoke(
            {"messages": [("user", "Read the file again and again, then answer.")]},
            {"configurable": {"thread_id": f"boundary-{steps}"}, "recursion_limit": 2 * steps + 10},
            durability="sync",
        )
    tools = sum(1 for m in result["messages"] if m.type == "tool")
    if tools != steps:
        raise RuntimeError(f"LangGraph ran {tools} steps, not {steps}")
    got = server.boundaries()
    if len(got) != steps:
        raise RuntimeError(f"LangGraph: {len(got)} boundaries, expected {steps}")
    return {"boundaries": got}


# --- figures -------------------------------------------------------------------------------------


def window(runs: list[dict], lo: int, hi: int) -> tuple[float, float]:
    """Median (over the rounds) of each round's median wall and CPU ms at steps lo..hi."""
    walls, cpus = [], []
    for run in runs:
        part = run["boundaries"][lo - 1 : hi]
        walls.append(statistics.median(b[0] for b in part))
        cpus.append(statistics.median(b[1] for b in part))
    return statistics.median(walls), statistics.median(cpus)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--file-kb", type=int, default=10)
    parser.add_argument("--cap-kb", type=int, default=200)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--no-langgraph", action="store_true")
    parser.add_argument("--serve", nargs=2, type=int, metavar=("CAP", "STEPS"))
    parser.add_argument("--py-spy", default="", help="profile Acthelm's worker into this file")
    parser.add_argument("--label", default="", help="a name for this run in the output")
    args = parser.parse_args()
    if args.serve:
        return serve_main(*args.serve)
    steps = args.steps
    cap_steps = -(-args.cap_kb // args.file_kb)  # the step at which the cap is reached
    if steps < max(cap_steps, 10):
        parser.error("--steps must reach the cap and step 10")

    media = tempfile.mkdtemp(prefix="acthelm-bench-boundary-")
    os.environ["ACTHELM_MEDIA_ROOT"] = media
    db_url = common.recreate_database(DB)
    common.django_on(db_url)
    files = {"big.txt": big_text(args.file_kb), "small.txt": "one line\n"}
    workspace = Path(media) / "langgraph"
    workspace.mkdir()
    for name, text in files.items():
        (workspace / name).write_text(text)
    # The cap in characters of tool results (Acthelm's and LangGraph's results are the same text).
    cap = args.cap_kb * 1024
    runs: dict[str, list[dict]] = {"Acthelm": [], "LangGraph + ChatOpenAI (HTTP)": []}
    with ServerProcess(cap, steps) as server:
        for r in range(args.repeat):
            print(f"… round {r + 1}: Acthelm, {steps} steps", flush=True)
            runs["Acthelm"].append(
                run_acthelm(db_url, server, steps, media, files, spy=args.py_spy)
            )
            if not args.no_langgraph:
                print(f"… round {r + 1}: LangGraph + ChatOpenAI, {steps} steps", flush=True)
                runs["LangGraph + ChatOpenAI (HTTP)"].append(
                    run_langgraph(db_url, server, steps, workspace)
                )
    windows = {
        "steps 6–10": (6, 10),
        f"steps {cap_steps - 4}–{cap_steps} (~{args.cap_kb} KB)": (cap_steps - 4, cap_steps),
        f"steps {steps - 4}–{steps}": (steps - 4, steps),
    }
    rows, data = [], {}
    for system, got in runs.items():
        if not got:
            continue
        w = {label: window(got, lo, hi) for label, (lo, hi) in windows.items()}
        vals = list(w.values())
        growth_wall = vals[2][0] / vals[0][0]
        growth_cpu = vals[2][1] / vals[0][1]
        rows.append(
            [
                system,
                *[f"{wall:.2f} / {cpu:.2f}" for wall, cpu in vals],
                f"{growth_wall:.2f}× / {growth_cpu:.2f}×",
            ]
        )
        data[system] = {"windows": w, "growth": [growth_wall, growth_cpu], "runs": got}
    headers = ["system", *[f"{label}: ms wall / CPU" for label in windows], f"step {steps} ÷ 10"]
    title = (
        f"boundary: answer's last byte → next request's first byte, read_file of {args.file_kb} KB "
        f"a step to {args.cap_kb} KB, {steps} steps (median of {args.repeat} rounds)"
    )
    table = common.print_table(title, headers, rows)
    a = data["Acthelm"]
    at_cap = list(a["windows"].values())[1][0]
    goals = [
        [
            f"step boundary at step {steps} within {GOAL_GROWTH}× of step 10 (wall)",
            f"{a['growth'][0]:.2f}× (CPU {a['growth'][1]:.2f}×)",
            common.verdict(a["growth"][0] <= GOAL_GROWTH),
        ],
        [
            f"step boundary < {GOAL_MS:g} ms at {args.cap_kb} KB",
            f"{at_cap:.2f} ms",
            common.verdict(at_cap < GOAL_MS),
        ],
    ]
    goals_table = common.print_table("boundary: goals", ["goal", "measured", "verdict"], goals)
    facts = common.machine()
    vers = common.versions("langgraph", "langgraph-checkpoint-postgres", "langchain-openai")
    command = (
        f"`.venv/bin/python bench/boundary.py --steps {steps} --file-kb {args.file_kb} "
        f"--cap-kb {args.cap_kb} --repeat {args.repeat}`"
    )
    section = (
        f"### boundary{f' ({args.label})' if args.label else ''}\n\n{command}\n\n"
        f"{common.facts_line(facts, vers)}\n\n{table}\n\n{goals_table}\n"
    )
    common.record(NAME, section, {"facts": facts, "versions": vers, "systems": data}, goals)
    return 0


if __name__ == "__main__":
    sys.exit(main())
