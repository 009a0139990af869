#!/usr/bin/env python3
"""The chaos test's peers in one process of their own, so that killing workers never touches them:
a scripted OpenAI-compatible model server whose every reply is computed from the request, and a
counting loopback web server for the tasks' fetch_url calls.

    python tests/chaos/chaos_server.py --ready-file ready.json --count-file counts.txt

The ready file receives ``{"model": <base URL>, "target": <base URL>}`` once both listen. The count
file gets one line ``GET /t/<key>`` per request to the web server, appended as it arrives.

The model program (the ``chaos`` program): every task's instruction carries ``chaos-key:<key>``;
from the tool calls already in the conversation the model decides the next step —

    1. update_plan          2. fetch_url http://127.0.0.1:<port>/t/<key>
    3. write_artifact <key>.md   4. a final answer "done <key>"

Each reply and each fetch takes a little while (randomised), so that kills land in every phase:
mid model request, mid fetch, between commits.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.fakes.http_target import HttpTarget  # noqa: E402
from tests.fakes.model_server import ScriptedModelServer, reply_text, reply_tool_calls  # noqa: E402

KEY = re.compile(r"chaos-key:(\S+)")
PLAN = {"steps": [{"step": "Fetch the page"}, {"step": "Write the note"}]}


def called_tools(messages: list[dict]) -> list[str]:
    names = []
    for message in messages:
        if message.get("role") == "assistant":
            for call in message.get("tool_calls") or []:
                names.append(call["function"]["name"])
    return names


def task_key(messages: list[dict]) -> str:
    for message in messages:
        if message.get("role") == "user":
            found = KEY.search(message.get("content") or "")
            if found:
                return found.group(1)
    return "unknown"


def chaos_program(target_url: str, max_delay: float):
    """The callable default step: decide the next reply from the conversation so far."""

    def step(request_json):
        messages = (request_json or {}).get("messages") or []
        key = task_key(messages)
        done = called_tools(messages)
        delay = random.uniform(0.0, max_delay)
        if "update_plan" not in done:
            return reply_tool_calls([("update_plan", PLAN)], text=f"plan {key}", delay=delay)
        if "fetch_url" not in done:
            return reply_tool_calls(
                [("fetch_url", {"url": f"{target_url}/t/{key}"})], text=f"fetch {key}", delay=delay
            )
        if "write_artifact" not in done:
            note = {"name": f"{key}.md", "content": f"# {key}\n\nFetched and noted.\n"}
            return reply_tool_calls([("write_artifact", note)], text=f"write {key}", delay=delay)
        return reply_text(f"done {key}", delay=delay)

    return step


class ChaosTarget(HttpTarget):
    """Answers /t/<key> after a short random pause (a fetch stays in flight for a while)."""

    def __init__(self, *args, max_delay: float = 0.3, **kwargs):
        super().__init__(*args, **kwargs)
        self.max_delay = max_delay

    def _dispatch(self, h) -> None:
        path = urlsplit(h.path).path
        if path.startswith("/t/"):
            time.sleep(random.uniform(0.0, self.max_delay))
            h.send_simple(200, f"page of {path[3:]}: all is well\n".encode())
            return
        super()._dispatch(h)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ready-file", required=True)
    parser.add_argument("--count-file", required=True)
    parser.add_argument("--model-delay", type=float, default=0.25)
    parser.add_argument("--fetch-delay", type=float, default=0.3)
    args = parser.parse_args(argv)

    target = ChaosTarget(count_file=args.count_file, max_delay=args.fetch_delay).start()
    model = ScriptedModelServer(
        [], default=chaos_program(target.url, args.model_delay), context_length=100_000
    ).start()
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    tmp = f"{args.ready_file}.tmp{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump({"model": model.url, "target": target.url}, fh)
    os.replace(tmp, args.ready_file)
    try:
        while not done.wait(0.2):
            pass
    finally:
        model.stop()
        target.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
