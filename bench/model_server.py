"""The scripted OpenAI-compatible model the benchmarks talk to, in a process of its own (so that
neither the worker being measured nor the peer shares a CPU thread or the GIL with it).

    python bench/model_server.py PROGRAM  # prints its base URL, serves until stdin closes

PROGRAM `done`: every request is answered with the text "done" (dispatch).
PROGRAM `steps`: the conversation's first user message says `steps:N` (and optionally
`fetch:URL`, or `hold:S`); the model calls list_files (or fetch_url on URL) until the conversation
holds N tool results, then answers (with `hold:S`: answers after S seconds). Acthelm
(openai_compatible connection) and LangGraph (ChatOpenAI) get the same answers from the same
server.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _first_user_text(messages: list[dict]) -> str:
    for m in messages:
        if m.get("role") == "user":
            content = m.get("content") or ""
            if isinstance(content, list):  # content parts
                content = " ".join(p.get("text", "") for p in content if isinstance(p, dict))
            if "steps:" in content:
                return content
    return ""


def steps_program(request_json):
    from tests.fakes.model_server import reply_text, reply_tool_calls

    messages = (request_json or {}).get("messages") or []
    text = _first_user_text(messages)
    length = int(text.split("steps:")[1].split()[0]) if text else 0
    done = sum(1 for m in messages if m.get("role") == "tool")
    if "hold:" in text:  # answer after that many seconds (the run only heartbeats meanwhile)
        return reply_text("held", delay=float(text.split("hold:")[1].split()[0]))
    if done >= length:
        return reply_text(f"done after {done} steps")
    if "fetch:" in text:
        url = text.split("fetch:")[1].split()[0]
        return reply_tool_calls([("fetch_url", {"url": f"{url}?n={done}"})])
    return reply_tool_calls([("list_files", {})])


def serve(program: str) -> int:
    from tests.fakes.model_server import ScriptedModelServer, reply_text

    default = steps_program if program == "steps" else reply_text("done")
    server = ScriptedModelServer([], default=default, context_length=1_000_000, keep_alive=True)
    # Keep no request log: a long benchmark would hold every request body in memory.
    server.add_request = lambda rec: None
    with server:
        print(server.url, flush=True)
        sys.stdin.read()  # until the benchmark closes our stdin (or exits)
    return 0


class ModelServerProcess:
    """`with ModelServerProcess("steps") as url:` the scripted model in a child process."""

    def __init__(self, program: str):
        self.program = program
        self.proc = None

    def __enter__(self) -> str:
        self.proc = subprocess.Popen(
            [sys.executable, __file__, self.program],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        url = self.proc.stdout.readline().strip()
        if not url.startswith("http"):
            raise RuntimeError("the scripted model server did not start")
        return url

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
