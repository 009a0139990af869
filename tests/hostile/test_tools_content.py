"""Hostile tool input and content (issue 13, items 10–14), each against the real peer.

* a regex that makes a backtracking engine run for ever, searched in a real child process whose
  heartbeat thread must keep ticking;
* web servers on a real loopback socket that send ``102 Processing`` for ever or trickle their
  headers, and one that declares a charset that is not a text encoding;
* a scripted model server that sends ``NaN``/``Infinity`` in tool arguments, through the loop;
* look-alike and bidi URLs as they reach a person's approval card;
* ``propose_task`` under a planning task with narrow tools, policies, domains and limits.
"""

from __future__ import annotations

import json
import queue
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------- item 10: search_files

_SEARCH_CHILD = r"""
import json, os, sys, threading, time
from pathlib import Path

from agents.catalogue.tools import ToolContext, ToolError, files, get_tool

workspace, budget, pattern = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
files.SEARCH_TIME_BUDGET = budget


def say(line):  # one write per line: the two threads' lines never interleave
    os.write(1, (line + "\n").encode())


def heartbeat():  # what a worker's heartbeat thread does: wake up often, do a little Python
    while True:
        say("tick")
        time.sleep(0.05)


threading.Thread(target=heartbeat, daemon=True).start()
time.sleep(0.2)
say("start")
tool = get_tool("search_files")
ctx = ToolContext(workspace=workspace, artifacts_dir=workspace)
try:
    result = tool.run(tool.parse({"pattern": pattern, "regex": True}), ctx)
    say("result " + json.dumps(result.data["timed_out"]))
except ToolError as exc:
    say("error " + exc.code)
"""

# Python's backtracking engine needs (at least) exponential time for each of these on a line of
# 'a's; the old nested-repeat lint let all three through.
CATASTROPHIC = [r"(.|.)*QQQ", r"(a|a)*b", r"(.*a){8}x", r"(\w|\w)*!", r"(a|aa)*c"]


def _run_search_child(workspace: Path, pattern: str, budget: float, wait: float):
    """Run the search in a child process; return (ticks seen while it ran, longest gap between
    two ticks in seconds, the final line or None if it never finished)."""
    proc = subprocess.Popen(
        [sys.executable, "-c", _SEARCH_CHILD, str(workspace), str(budget), pattern],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: queue.Queue[tuple[float, str]] = queue.Queue()

    def read():
        for line in proc.stdout:
            lines.put((time.monotonic(), line.strip()))
        lines.put((time.monotonic(), "<eof>"))

    threading.Thread(target=read, daemon=True).start()
    started = None
    last_tick = None
    longest_gap = 0.0
    ticks = 0
    final = None
    give_up = time.monotonic() + wait
    try:
        while time.monotonic() < give_up:
            try:
                at, line = lines.get(timeout=0.2)
            except queue.Empty:
                if started is not None and last_tick is not None:
                    longest_gap = max(longest_gap, time.monotonic() - last_tick)
                continue
            if line == "start":
                started = last_tick = at
            elif line == "tick" and started is not None:
                longest_gap = max(longest_gap, at - last_tick)
                last_tick = at
                ticks += 1
            elif line.startswith(("result", "error", "<eof>", "Traceback")):
                if last_tick is not None:
                    longest_gap = max(longest_gap, at - last_tick)
                final = line
                break
    finally:
        proc.kill()
        proc.wait(5)
    return ticks, longest_gap, final


@pytest.mark.parametrize("pattern", CATASTROPHIC)
def test_search_files_catastrophic_regex_keeps_the_heartbeat_and_its_budget(tmp_path, pattern):
    # Lines of 'a's (and one long one with words) — the input each pattern explodes on.
    (tmp_path / "a.txt").write_text(("a" * 3000 + "\n") * 200 + ("ab " * 1300 + "\n") * 50)
    budget = 3.0
    _ticks, longest_gap, final = _run_search_child(tmp_path, pattern, budget, wait=budget + 20)
    # The search ended (with a result or a clear error), within its budget plus a margin that
    # only a hang can exceed.
    assert final is not None and final.startswith(("result", "error")), (
        f"the search of {pattern!r} did not end within {budget + 20:.0f} s"
    )
    # The heartbeat never stalled while the search ran (a backtracking engine holds the GIL:
    # no tick at all until it ends).
    assert longest_gap < 2.0, f"heartbeat stalled {longest_gap:.1f} s during {pattern!r}"


def test_search_files_long_search_stops_at_its_budget_and_the_heartbeat_ticks(tmp_path):
    # Each line costs the linear-time engine real work (two alternatives of ~1000 repeats over a
    # line of 4000 characters); 100 such lines take far longer than the budget. It must stop at
    # its budget with partial results, and the heartbeat thread must tick all along: the engine
    # leaves the GIL to other threads while it searches.
    rng = random.Random(13)
    lines = ("".join(rng.choice("ab") for _ in range(3999)) + "\n" for _ in range(100))
    (tmp_path / "big.txt").write_text("".join(lines))
    ticks, longest_gap, final = _run_search_child(
        tmp_path, r"(.*a){999}x|(.*b){999}y", 1.0, wait=30
    )
    assert final == "result true", final
    assert ticks >= 5
    assert longest_gap < 2.0, f"heartbeat stalled {longest_gap:.1f} s"


# --------------------------------------------------------------------------- item 11: fetch_url


class RawHttpServer:
    """A raw socket server on loopback that answers every request with a scripted byte stream.

    ``behaviour(conn)`` writes to the accepted socket after the request line arrived; the
    server counts connections and notes when a client went away.
    """

    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.client_gone = threading.Event()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def url(self, path="/") -> str:
        return f"http://127.0.0.1:{self.port}{path}"

    def __enter__(self):
        t = threading.Thread(target=self._accept, daemon=True)
        t.start()
        self._threads.append(t)
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self.sock.close()
        for t in self._threads:
            t.join(5)

    def _accept(self):
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except (TimeoutError, OSError):
                continue
            self.connections += 1
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn):
        with conn:
            conn.settimeout(5)
            try:
                data = b""
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(4096)
                    if not chunk:
                        return
                    data += chunk
                self.behaviour(conn, self._stop)
            except OSError:
                self.client_gone.set()


def processing_forever(conn, stop):
    """``102 Processing`` every 0.5 s, never a final response."""
    while not stop.is_set():
        conn.sendall(b"HTTP/1.1 102 Processing\r\n\r\n")
        time.sleep(0.5)


def trickled_headers(conn, stop):
    """A status line and then header bytes, one every 0.2 s, for ever."""
    conn.sendall(b"HTTP/1.1 200 OK\r\n")
    while not stop.is_set():
        for byte in b"X-Slow: " + b"a" * 1000:
            if stop.is_set():
                return
            conn.sendall(bytes([byte]))
            time.sleep(0.2)


def _fetch_in_thread(ctx, url, wait):
    """Run fetch_url in a thread; return (ToolError or result or None if still running)."""
    from agents.catalogue.tools import ToolError, get_tool

    box = {}

    def work():
        tool = get_tool("fetch_url")
        try:
            box["result"] = tool.run(tool.parse({"url": url}), ctx)
        except ToolError as exc:
            box["error"] = exc

    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(wait)
    return box.get("error", box.get("result"))


def _fetch_ctx(tmp_path, **kw):
    from agents.catalogue.tools import ToolContext

    kw.setdefault("allow_private_network", True)
    kw.setdefault("allowed_domains", ("127.0.0.1",))
    return ToolContext(workspace=tmp_path, artifacts_dir=tmp_path / "artifacts", **kw)


@pytest.mark.parametrize("behaviour", [processing_forever, trickled_headers])
def test_fetch_url_deadline_holds_before_the_headers_arrive(tmp_path, behaviour):
    with RawHttpServer(behaviour) as server:
        ctx = _fetch_ctx(tmp_path, fetch_timeout=2.0)
        outcome = _fetch_in_thread(ctx, server.url("/slow"), wait=30)
        assert outcome is not None, "fetch_url was still waiting for headers after 30 s"
        assert getattr(outcome, "code", None) == "fetch_timeout", outcome
        assert outcome.network_requests == 1
        assert server.connections == 1


@pytest.mark.parametrize("behaviour", [processing_forever, trickled_headers])
def test_fetch_url_cancel_applies_before_the_headers_arrive(tmp_path, behaviour):
    cancel = threading.Event()
    with RawHttpServer(behaviour) as server:
        ctx = _fetch_ctx(tmp_path, fetch_timeout=120.0, cancel_event=cancel)
        threading.Timer(1.0, cancel.set).start()
        outcome = _fetch_in_thread(ctx, server.url("/slow"), wait=30)
        assert outcome is not None, "fetch_url ignored the cancel for 30 s"
        assert getattr(outcome, "code", None) == "cancelled", outcome


# --------------------------------------------------------------------------- item 12: bad bytes


def _answer(content_type: bytes, body: bytes):
    def behaviour(conn, stop):
        conn.sendall(
            b"HTTP/1.1 200 OK\r\nContent-Type: "
            + content_type
            + b"\r\nContent-Length: "
            + str(len(body)).encode()
            + b"\r\nConnection: close\r\n\r\n"
            + body
        )

    return behaviour


@pytest.mark.parametrize("charset", ["base64", "hex", "rot13", "rot_13", "zlib", "uu", "idna"])
def test_fetch_url_charset_that_is_not_a_text_encoding_is_a_tool_error(tmp_path, charset):
    content_type = f"text/plain; charset={charset}".encode()
    with RawHttpServer(_answer(content_type, b"aGVsbG8=")) as server:
        outcome = _fetch_in_thread(_fetch_ctx(tmp_path), server.url("/odd"), wait=30)
    assert getattr(outcome, "code", None) == "response_charset_invalid", outcome
    assert charset in outcome.message and "not a text encoding" in outcome.message
    assert outcome.network_requests == 1


def test_fetch_url_unknown_or_usual_charsets_still_decode(tmp_path):
    for content_type, body, text in [
        (b"text/plain; charset=no-such-charset", b"caf\xc3\xa9", "café"),
        (b"text/plain; charset=latin-1", b"caf\xe9", "café"),
    ]:
        with RawHttpServer(_answer(content_type, body)) as server:
            outcome = _fetch_in_thread(_fetch_ctx(tmp_path), server.url("/ok"), wait=30)
        assert outcome.text.endswith(text), (content_type, outcome)


def _scripted_task(server, *, flavor="openai", tools=("update_plan", "read_file"), **kwargs):
    from agents.engine.run.intake import task_create
    from agents.models import Connection, Model
    from core.actors import Actor

    conn = Connection.objects.create(
        name=f"scripted-{server.port}",
        kind="anthropic" if flavor == "anthropic" else "openai_compatible",
        base_url=server.url,
        cost_tier="zero_cost",
        timeout_seconds=10,
    )
    model = Model.objects.create(
        connection=conn, name="test-model", test_status="passed", context_window=100_000
    )
    return task_create(
        actor=Actor.system("hostile"),
        title=kwargs.pop("title", "Read the notes"),
        instruction=kwargs.pop("instruction", "Read notes.txt and report."),
        tools=list(tools),
        model=model,
        **kwargs,
    )


@pytest.fixture
def loop_settings(settings):
    settings.ACTHELM_HEARTBEAT_SECONDS = 0.2
    settings.ACTHELM_LEASE_SECONDS = 5
    settings.ACTHELM_POLL_SECONDS = 0.5
    settings.ACTHELM_RECOVER_INTERVAL_SECONDS = 0.5
    settings.ACTHELM_RECONCILE_INTERVAL_SECONDS = 3600
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    return settings


NON_FINITE_ARGUMENTS = [
    ("read_file", '{"path": "notes.txt", "start_line": NaN}'),
    ("read_file", '{"path": "notes.txt", "max_lines": Infinity}'),
    ("read_file", '{"path": "notes.txt", "extra": -Infinity}'),
    ("update_plan", '{"steps": [{"step": "Read", "status": "pending", "n": [1, NaN]}]}'),
]


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("flavor", ["openai", "anthropic"])
@pytest.mark.parametrize(("tool", "arguments"), NON_FINITE_ARGUMENTS)
def test_non_finite_numbers_in_tool_arguments_are_refused_and_the_run_goes_on(
    loop_settings, flavor, tool, arguments
):
    from agents.engine.runtime.worker import Worker
    from agents.models import AgentRun, ToolCall
    from tasks.models import Task, TaskEvent
    from tasks.workspace import add_input_file
    from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

    script = [
        reply_tool_calls([("update_plan", {"steps": [{"step": "Read the notes"}]})]),
        # The bad call and a good one in the same turn: only the bad one is refused.
        reply_tool_calls([(tool, arguments), ("read_file", {"path": "notes.txt"})]),
        reply_text("The notes say hello."),
    ]
    with ScriptedModelServer(script, flavor=flavor, default=reply_text("done")) as server:
        task = _scripted_task(server, flavor=flavor)
        add_input_file(task.pk, name="notes.txt", data="hello")
        Worker(worker_id="hostile", burst=True).run()
        # The model was told why, in the next request.
        told = json.dumps(server.completion_requests[2].json)
        assert len(server.completion_requests) == 3

    task.refresh_from_db()
    calls = list(ToolCall.objects.filter(task=task).order_by("turn__index", "position"))
    bad = calls[1]
    assert (bad.tool, bad.status, bad.error_code) == (tool, "refused", "invalid_arguments")
    assert "NaN" in bad.result_for_model and "finite" in bad.result_for_model
    assert "must be finite" in told
    assert bad.arguments is None and bad.run_count == 0  # nothing non-finite in jsonb
    assert ("NaN" in bad.arguments_raw) or ("Infinity" in bad.arguments_raw)  # what was sent
    # The run went on: the calls around it ran and the task reached review.
    assert [calls[0].status, calls[2].status] == ["succeeded", "succeeded"]
    assert (task.status, task.failure_code) == ("review", "")
    assert AgentRun.objects.filter(task=task).count() == 1
    assert TaskEvent.objects.filter(
        task=task, kind="tool_result", data__error="invalid_arguments"
    ).exists()
    assert Task.objects.filter(pk=task.pk, tools=["update_plan", "read_file"]).exists()


# --------------------------------------------------------------------------- item 13: URL display


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("typed", "real_host", "real_target"),
    [
        ("https://аpple.com/login", "xn--pple-43d.com", "https://xn--pple-43d.com:443/login"),
        ("http://EXAMPLE.com.:8080/a?b=1", "example.com", "http://example.com:8080/a?b=1"),
        ("https://раypal.com/", "xn--ypal-43d9g.com", "https://xn--ypal-43d9g.com:443/"),
    ],
)
def test_approval_card_shows_the_host_and_port_the_request_will_use(
    loop_settings, person, typed, real_host, real_target
):
    from django.test import Client

    from agents.engine.runtime.worker import Worker
    from approvals.models import Approval
    from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

    script = [
        reply_tool_calls([("update_plan", {"steps": [{"step": "Fetch"}]})]),
        reply_tool_calls([("fetch_url", {"url": typed})]),
    ]
    with ScriptedModelServer(script, default=reply_text("done")) as server:
        task = _scripted_task(server, tools=("update_plan", "fetch_url"))
        Worker(worker_id="hostile", burst=True).run()

    approval = Approval.objects.get(task=task)
    assert approval.target == real_target
    assert real_host in approval.effect
    if not typed.isascii():
        assert "non-ASCII" in approval.effect  # the person is told the host was a look-alike
    client = Client()
    client.force_login(person)
    for page in ("/approvals/", f"/tasks/{task.pk}/"):
        html = client.get(page).content.decode()
        assert real_target in html and real_host in html, page


BIDI_AND_FORMAT = [
    "https://example.com/\u202egnp.exe",  # RIGHT-TO-LEFT OVERRIDE
    "https://exam\u200bple.com/",  # ZERO WIDTH SPACE in the host
    "https://example.com/\u2066a\u2069",  # LEFT-TO-RIGHT ISOLATE … POP DIRECTIONAL ISOLATE
    "https://example.com/?q=\u200f",  # RIGHT-TO-LEFT MARK
    "https://example.com/\ufeff",  # ZERO WIDTH NO-BREAK SPACE (BOM)
    "https://ex\u00adample.com/",  # SOFT HYPHEN (IDNA would silently drop it)
]


@pytest.mark.parametrize("url", BIDI_AND_FORMAT)
def test_fetch_url_refuses_bidi_and_format_characters(tmp_path, url):
    from agents.catalogue.tools import ToolError, get_tool

    tool = get_tool("fetch_url")
    with pytest.raises(ToolError) as exc:
        tool.preflight(tool.parse({"url": url}), _fetch_ctx(tmp_path))
    assert exc.value.code == "url_invalid"
    assert "invisible" in exc.value.message and "U+" in exc.value.message


@pytest.mark.django_db(transaction=True)
def test_a_bidi_url_is_refused_before_anyone_is_asked(loop_settings):
    from agents.engine.runtime.worker import Worker
    from agents.models import ToolCall
    from approvals.models import Approval
    from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

    script = [
        reply_tool_calls([("update_plan", {"steps": [{"step": "Fetch"}]})]),
        reply_tool_calls([("fetch_url", {"url": "https://example.com/\u202egnp.exe"})]),
        reply_text("could not fetch it"),
    ]
    with ScriptedModelServer(script, default=reply_text("done")) as server:
        task = _scripted_task(server, tools=("update_plan", "fetch_url"))
        Worker(worker_id="hostile", burst=True).run()
    call = ToolCall.objects.get(task=task, tool="fetch_url")
    assert (call.status, call.error_code) == ("refused", "url_invalid")
    assert not Approval.objects.filter(task=task).exists()
    task.refresh_from_db()
    assert task.status == "review"


# --------------------------------------------------------------------------- item 14: propose_task


@pytest.mark.django_db(transaction=True)
def test_propose_task_children_inherit_at_most_what_the_parent_has(loop_settings):
    from agents.engine.run.usage import task_usage
    from agents.engine.runtime.worker import Worker
    from agents.models import ToolCall
    from tasks.models import Task
    from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls

    loop_settings.ACTHELM_MAX_PROPOSALS_PER_TASK = 3

    def propose(title, **extra):
        return ("propose_task", {"title": title, "instruction": f"Do {title}.", **extra})

    script = [
        reply_tool_calls([("update_plan", {"steps": [{"step": "Split the work"}]})]),
        reply_tool_calls(
            [
                propose("All of mine"),
                propose("Only reading", tools=["read_file"]),
                propose("More than mine", tools=["read_file", "write_artifact"]),
                propose("Proposing again", tools=["propose_task"]),
                propose("Third", depends_on_titles=["All of mine"]),
                propose("One too many"),
                propose("All of mine"),  # a replay of the first: the same child, not a new one
            ]
        ),
        reply_text("Proposed the work."),
    ]
    with ScriptedModelServer(script, default=reply_text("done")) as server:
        parent = _scripted_task(
            server,
            tools=("update_plan", "propose_task", "read_file", "fetch_url"),
            tool_policies={"fetch_url": "ask", "read_file": "allow"},
            allowed_domains=["example.org"],
            limits={
                "limit_turns": 10,
                "limit_runtime_seconds": 300,
                "limit_token_budget": 50_000,
                "limit_network_requests": 3,
                "limit_output_tokens": 2_000,
                "limit_tool_output_chars": 5_000,
                "limit_artifact_bytes": 10_000,
            },
            kind="planning",
        )
        Worker(worker_id="hostile", burst=True).run()

    calls = {
        c.arguments["title"] if c.arguments else "": c
        for c in ToolCall.objects.filter(task=parent, tool="propose_task").order_by("-id")
    }
    outcome = {title: (c.status, c.error_code) for title, c in calls.items()}
    assert outcome["All of mine"] == ("succeeded", "")
    assert outcome["Only reading"] == ("succeeded", "")
    assert outcome["Third"] == ("succeeded", "")
    assert outcome["More than mine"] == ("failed", "tool_not_allowed")
    assert "write_artifact" in calls["More than mine"].result_for_model
    assert outcome["Proposing again"] == ("failed", "tool_not_allowed")
    assert outcome["One too many"] == ("failed", "proposal_limit")
    assert "3" in calls["One too many"].result_for_model

    children = {t.title: t for t in Task.objects.filter(spawned_by=parent)}
    assert sorted(children) == ["All of mine", "Only reading", "Third"]
    assert children["All of mine"].tools == ["update_plan", "read_file", "fetch_url"]
    assert children["Only reading"].tools == ["read_file"]
    assert children["All of mine"].tool_policies == {"fetch_url": "ask", "read_file": "allow"}
    assert children["Only reading"].tool_policies == {"read_file": "allow"}
    parent.refresh_from_db()
    # The parent had used two turns (and some tokens) when it proposed; the children got what
    # was left, never the server's defaults.
    used = task_usage(parent.pk)
    for child in children.values():
        assert child.allowed_domains == ["example.org"]
        assert child.limit_turns == 10 - 2
        assert 0 < child.limit_runtime_seconds <= 300
        assert used.tokens > 0 and 50_000 - used.tokens <= child.limit_token_budget < 50_000
        assert child.limit_network_requests == 3
        assert (
            child.limit_output_tokens,
            child.limit_tool_output_chars,
            child.limit_artifact_bytes,
        ) == (2_000, 5_000, 10_000)
        assert (child.connection_id, child.model_id) == (parent.connection_id, parent.model_id)
    # The parent's own permissions are untouched.
    assert parent.tools == ["update_plan", "propose_task", "read_file", "fetch_url"]
    assert parent.allowed_domains == ["example.org"]


def test_fetch_url_watchdog_never_touches_a_reused_descriptor():
    # A socket the guard watches is closed behind its back and its descriptor is reused by
    # another connection (in a worker: the heartbeat's database connection, say). When the
    # guard fires, the other connection must keep working.
    from agents.catalogue.tools.fetch import _Guard

    one, two = socket.create_server(("127.0.0.1", 0)), socket.create_server(("127.0.0.1", 0))
    with one, two:
        first = socket.create_connection(one.getsockname())
        cancel = threading.Event()
        guard = _Guard(time.monotonic() + 60, cancel)
        guard.register(first.fileno(), first.getpeername())
        fd = first.fileno()
        first.close()
        other = socket.create_connection(two.getsockname())
        served, _ = two.accept()
        with other, served:
            assert other.fileno() == fd  # the descriptor was reused
            cancel.set()
            deadline = time.monotonic() + 10
            while not guard.fired and time.monotonic() < deadline:
                time.sleep(0.05)
            guard.stop()
            assert guard.fired == "cancelled"
            other.sendall(b"still here")
            assert served.recv(100) == b"still here"
