"""A scripted OpenAI-compatible model for many agents at once (bench/fleet.py and
tests/agents/test_fleet.py): one asyncio process that holds every request it gets for L seconds,
so a thousand agents can wait on it at once (a thread per request, as the other scripted server
has, and a listen backlog of 5 would measure the server, not the worker).

    python tests/fakes/holding_model.py --latency 20 --turns 3  # prints its base URL, serves
                                                               # until stdin closes

Each conversation gets `turns` answers: `turns - 1` calls of list_files (a read-only tool), then
a final text. Every answer comes after `latency` seconds. Keep-alive connections are honoured.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import threading
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


async def handle(reader, writer, latency: float, turns: int, stats: dict) -> None:
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
            if path.endswith("/models"):
                payload = {"object": "list", "data": [{"id": "test-model", "object": "model"}]}
            else:
                stats["open"] += 1
                stats["peak"] = max(stats["peak"], stats["open"])
                try:
                    await asyncio.sleep(latency)
                finally:
                    stats["open"] -= 1
                stats["answered"] += 1
                payload = answer(json.loads(body or b"{}"), turns)
            data = json.dumps(payload).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
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


async def serve(latency: float, turns: int) -> None:
    stats = {"open": 0, "peak": 0, "answered": 0}
    server = await asyncio.start_server(
        lambda r, w: handle(r, w, latency, turns, stats), "127.0.0.1", 0, backlog=4096
    )
    port = server.sockets[0].getsockname()[1]
    print(f"http://127.0.0.1:{port}/v1", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()

    def wait_stdin():
        sys.stdin.read()
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=wait_stdin, daemon=True).start()
    async with server:
        await stop.wait()
    print(json.dumps(stats), flush=True)


class HoldingModel:
    """This server in a process of its own (so the worker measured or tested shares no CPU thread
    or GIL with it): `.url` is its base URL; `close()` stops it and returns its counts."""

    def __init__(self, latency: float, turns: int):
        import subprocess

        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--latency", str(latency), "--turns", str(turns)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.url = self.proc.stdout.readline().strip()

    def close(self) -> dict:
        self.proc.stdin.close()
        line = self.proc.stdout.readline().strip()
        self.proc.wait(10)
        return json.loads(line) if line else {}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--latency", type=float, default=20.0)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    asyncio.run(serve(args.latency, args.turns))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
