"""The CPU of one model request on a warm thread: `provider.complete` against a zero-latency
OpenAI-compatible server (HTTP/1.1, keep-alive, on loopback, in a process of its own).

    python bench/request_cpu.py [--engine-root PATH] [--requests 2000] [--pairs 5]

Each measurement is a fresh process that imports the providers from a checkout (this one, and
with `--engine-root` another one: the "before"), warms up its thread with 50 requests and then
times `time.thread_time()` over `--requests` requests. With `--engine-root`, before and after run
as interleaved pairs; the medians and their ratio are printed.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

ANSWER = json.dumps(
    {
        "id": "x",
        "object": "chat.completion",
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "done"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 10, "completion_tokens": 1},
    }
).encode()


def serve() -> int:
    """Print the base URL, answer every request at once until stdin closes."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    reply = (
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(ANSWER)}\r\n\r\n".encode()
        + ANSWER
    )

    def connection(conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                while b"\r\n\r\n" not in buf:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                head, _, buf = buf.partition(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    key, _, value = line.partition(b":")
                    if key.strip().lower() == b"content-length":
                        length = int(value)
                while len(buf) < length:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    buf += chunk
                buf = buf[length:]
                conn.sendall(reply)

    def accept() -> None:
        while True:
            conn, _ = sock.accept()
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=connection, args=(conn,), daemon=True).start()

    threading.Thread(target=accept, daemon=True).start()
    print(f"http://127.0.0.1:{sock.getsockname()[1]}/v1", flush=True)
    sys.stdin.read()
    return 0


def measure(url: str, requests: int) -> int:
    """In a process whose sys.path starts with the checkout: µs of thread CPU per request."""
    import time

    from agents.catalogue.providers import Message, build_provider
    from agents.catalogue.providers.base import CancelEvent

    messages = [Message(role="user", content="hello " * 200)]
    cancel = CancelEvent()

    def one() -> None:
        provider = build_provider("openai_compatible", base_url=url, timeout=30)
        answer = provider.complete(
            model="m", messages=messages, tools=[], max_tokens=100, cancel_event=cancel
        )
        assert answer.text == "done"

    for _ in range(50):
        one()
    start = time.thread_time()
    for _ in range(requests):
        one()
    print((time.thread_time() - start) / requests * 1e6, flush=True)
    return 0


def run_one(root: Path, url: str, requests: int) -> float:
    code = (
        f"import sys, runpy; sys.path.insert(0, {str(root)!r}); "
        f"runpy.run_path({__file__!r})['measure']({url!r}, {requests})"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, stdout=subprocess.PIPE, text=True, check=True
    )
    return float(out.stdout.strip().splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--engine-root", type=Path)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        return serve()
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().decode().strip()
        before: list[float] = []
        after: list[float] = []
        for _ in range(args.pairs):
            if args.engine_root:
                before.append(run_one(args.engine_root.resolve(), url, args.requests))
            after.append(run_one(ROOT, url, args.requests))
            line = f"after {after[-1]:.0f} µs"
            if before:
                line = f"before {before[-1]:.0f} µs, " + line
            print(line, flush=True)
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait()
    print(f"CPU of one request, median of {args.pairs}: {statistics.median(after):.0f} µs", end="")
    if before:
        ratio = statistics.median(after) / statistics.median(before)
        print(f" (before: {statistics.median(before):.0f} µs; after/before {ratio:.2f})")
    else:
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
