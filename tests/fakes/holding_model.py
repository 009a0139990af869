"""A scripted OpenAI-compatible model for many agents at once (bench/fleet.py and
tests/agents/test_fleet.py): one asyncio process that holds every request it gets for L seconds,
so a thousand agents can wait on it at once (a thread per request, as the other scripted server
has, and a listen backlog of 5 would measure the server, not the worker).

    python tests/fakes/holding_model.py --latency 20 --turns 3  # prints its base URL, serves
                                                               # until stdin closes
    python tests/fakes/holding_model.py --threaded …           # a thread per request instead

Each conversation gets `turns` answers: `turns - 1` calls of list_files (a read-only tool), then
a final text. Every answer comes after `latency` seconds. Keep-alive connections are honoured.
A request that asks to stream (`"stream": true`) gets the same answer as Server-Sent Events: the
text word by word, each tool call in one piece (`streamed`; the asyncio server only).

What it counts (printed as JSON when it stops, and served live at `GET /stats`): requests held
at once (`open`, `peak`), answered, and per turn of a conversation (the number of tool results in
the request: "0" is a first request) how many arrived, the first and last arrival (Unix time) and
their bytes; how late each answer left (seconds past `latency`: the loop's or the threads' lag,
so a starved model shows here) and the process's own CPU seconds.

`--threaded` (bench/fleet.py `--threaded-model`): the same answers from a ThreadingHTTPServer, a
thread per request sleeping L seconds, so that 10,000 agents mean 10,000 threads sharing the
cores with the workers measured (issue 51's overload).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import threading
import time
import uuid


def answer(request: dict, turns: int) -> dict:
    messages = request.get("messages") or []
    done = sum(1 for m in messages if m.get("role") == "tool")
    usage = {"prompt_tokens": 100, "completion_tokens": 10, "total_tokens": 110}
    if done + 1 >= turns:
        message = {"role": "assistant", "content": f"done after {done} tool calls"}
        finish = "stop"
    else:
        call = {
            "id": f"call_{uuid.uuid4().hex[:12]}",
            "type": "function",
            "function": {"name": "list_files", "arguments": "{}"},
        }
        message = {"role": "assistant", "content": "", "tool_calls": [call]}
        finish = "tool_calls"
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:12]}",
        "object": "chat.completion",
        "model": request.get("model", "fleet"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": usage,
    }


class Stats:
    """The counts above; one lock, as the threaded server updates them from many threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.open = self.peak = self.answered = 0
        self.turns: dict[int, dict] = {}
        self.late: list[float] = []

    def arrived(self, request: dict, size: int) -> None:
        done = sum(1 for m in request.get("messages") or [] if m.get("role") == "tool")
        now = time.time()
        with self.lock:
            self.open += 1
            self.peak = max(self.peak, self.open)
            turn = self.turns.setdefault(
                done, {"arrived": 0, "first": now, "last": now, "bytes": 0}
            )
            turn["arrived"] += 1
            turn["last"] = now
            turn["bytes"] += size

    def left(self, late: float | None) -> None:
        with self.lock:
            self.open -= 1
            if late is not None:
                self.answered += 1
                self.late.append(late)

    def as_dict(self) -> dict:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        with self.lock:
            late = sorted(self.late)
            turns = {str(k): dict(v) for k, v in sorted(self.turns.items())}
            out = {"open": self.open, "peak": self.peak, "answered": self.answered}

        def q(p: float) -> float | None:
            return late[min(len(late) - 1, int(p * len(late)))] if late else None

        return {
            **out,
            "turns": turns,
            "late_p50_s": q(0.5),
            "late_p99_s": q(0.99),
            "late_max_s": late[-1] if late else None,
            "cpu_s": usage.ru_utime + usage.ru_stime,
            "threads": threading.active_count(),
        }


def _reply(path: str, stats: Stats) -> bytes | None:
    """The answer to a request that is not held (the model list, the counts); None: hold it."""
    if path.endswith("/models"):
        payload: dict = {"object": "list", "data": [{"id": "test-model", "object": "model"}]}
    elif path.endswith("/stats"):
        payload = stats.as_dict()
    else:
        return None
    return json.dumps(payload).encode()


def streamed(whole: dict) -> bytes:
    """The same answer as Server-Sent Events, as an OpenAI-compatible server streams it: the
    text word by word, each tool call in one piece, the finish reason, the usage, [DONE]."""
    message = whole["choices"][0]["message"]
    base = {"id": whole["id"], "object": "chat.completion.chunk", "model": whole["model"]}

    def event(choices: list, **extra) -> bytes:
        return b"data: " + json.dumps({**base, "choices": choices, **extra}).encode() + b"\n\n"

    out = [event([{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}])]
    for word in (message.get("content") or "").split(" "):
        if word:
            piece = {"index": 0, "delta": {"content": word + " "}, "finish_reason": None}
            out.append(event([piece]))
    for i, call in enumerate(message.get("tool_calls") or []):
        delta = {"tool_calls": [{"index": i, **call}]}
        out.append(event([{"index": 0, "delta": delta, "finish_reason": None}]))
    finish = whole["choices"][0]["finish_reason"]
    out.append(event([{"index": 0, "delta": {}, "finish_reason": finish}]))
    out.append(event([], usage=whole["usage"]))
    return b"".join(out) + b"data: [DONE]\n\n"


async def handle(reader, writer, latency: float, turns: int, stats: Stats) -> None:
    loop = asyncio.get_running_loop()
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            lines = head.decode("latin-1").split("\r\n")
            _method, path = lines[0].split(" ")[:2]
            headers = {}
            for line in lines[1:]:
                if ":" in line:
                    key, value = line.split(":", 1)
                    headers[key.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
            data = _reply(path, stats)
            if data is None:
                request = json.loads(body or b"{}")
                stats.arrived(request, len(body))
                late = None
                try:
                    t0 = loop.time()
                    await asyncio.sleep(latency)
                    late = loop.time() - t0 - latency
                finally:
                    stats.left(late)
                data = json.dumps(answer(request, turns)).encode()
                if request.get("stream"):
                    data, kind = streamed(json.loads(data)), b"text/event-stream"
                else:
                    kind = b"application/json"
            else:
                kind = b"application/json"
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: "
                + kind
                + b"\r\n"
                + f"content-length: {len(data)}\r\n\r\n".encode()
                + data
            )
            await writer.drain()
            if headers.get("connection", "").lower() == "close":
                break
    except (asyncio.IncompleteReadError, ConnectionError, ValueError):
        pass
    finally:
        writer.close()


def raise_nofile() -> tuple[int, int]:
    """The soft limit of open files raised to the hard one (a socket per held request)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def wait_stdin(stop) -> None:
    sys.stdin.read()
    stop()


async def serve(latency: float, turns: int) -> None:
    stats = Stats()
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, latency, turns, stats), "127.0.0.1", 0, backlog=4096
    )
    port = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    threading.Thread(
        target=wait_stdin, args=(lambda: loop.call_soon_threadsafe(stop.set),), daemon=True
    ).start()
    await stop.wait()
    # The counts first: closing waits for no held request (a stopped client's are gone anyway).
    print(json.dumps(stats.as_dict()), flush=True)
    server.close()


def serve_threaded(latency: float, turns: int) -> None:
    """The same model, a thread per request (http.server), each sleeping `latency`."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    stats = Stats()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def do_GET(self) -> None:
            self._answer(b"")

        def do_POST(self) -> None:
            self._answer(self.rfile.read(int(self.headers.get("content-length") or 0)))

        def _answer(self, body: bytes) -> None:
            data = _reply(self.path, stats)
            if data is None:
                request = json.loads(body or b"{}")
                stats.arrived(request, len(body))
                late = None
                try:
                    t0 = time.monotonic()
                    time.sleep(latency)
                    late = time.monotonic() - t0 - latency
                finally:
                    stats.left(late)
                data = json.dumps(answer(request, turns)).encode()
            self.send_response(200)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    class Server(ThreadingHTTPServer):
        request_queue_size = 4096
        daemon_threads = True

    threading.stack_size(512 * 1024)
    server = Server(("127.0.0.1", 0), Handler)
    print(f"http://127.0.0.1:{server.server_address[1]}/v1", flush=True)
    threading.Thread(target=wait_stdin, args=(server.shutdown,), daemon=True).start()
    server.serve_forever(poll_interval=0.5)
    print(json.dumps(stats.as_dict()), flush=True)


class HoldingModel:
    """This server in a process of its own (so the worker measured or tested shares no CPU thread
    or GIL with it): `.url` is its base URL, `.pid` its process; `stats()` its counts so far;
    `close()` stops it and returns its counts."""

    def __init__(self, latency: float, turns: int, *, threaded: bool = False):
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--latency", str(latency), "--turns", str(turns)]
            + (["--threaded"] if threaded else []),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.pid = self.proc.pid
        self.url = self.proc.stdout.readline().strip()

    def stats(self, timeout: float = 5.0) -> dict | None:
        """The counts so far (GET /stats), or None if the server does not answer in time."""
        import urllib.request

        try:
            with urllib.request.urlopen(f"{self.url}/stats", timeout=timeout) as response:
                return json.loads(response.read())
        except OSError:
            return None

    def close(self) -> dict:
        self.proc.stdin.close()
        line = self.proc.stdout.readline().strip()
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        return json.loads(line) if line else {}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=20.0)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--threaded", action="store_true", help="a thread per request")
    args = parser.parse_args()
    raise_nofile()
    if args.threaded:
        serve_threaded(args.latency, args.turns)
    else:
        asyncio.run(serve(args.latency, args.turns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
