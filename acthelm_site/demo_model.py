"""A scripted, OpenAI-compatible demo model, so `make run` shows the whole loop with no provider.

It speaks Chat Completions on 127.0.0.1 (default port 8765) and decides each turn from the
conversation, the way a small tool-calling model would: plan first, propose follow-up work when it
is planning for a goal, list the input files, read the ones the task names, write a report
artifact, then answer with what it did (not the task repeated back: the supervisor's default
checks reject an echo, and a run that never read the file its task names). Real deployments point
a connection at OpenAI, Ollama, vLLM, llama.cpp or Anthropic instead.

Asked to stream (``"stream": true``, as the worker asks), it answers in Server-Sent Events word by
word over about `STREAM_SECONDS` (a tool call's arguments in small pieces), so that the task page
shows the turn as it is written.

    python -m acthelm_site.demo_model [--port 8765] [--stream-seconds 1.5]
"""

import argparse
import contextlib
import json
import re
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# A JSON object of the Chat Completions protocol, as the worker sends it.
Json = dict[str, Any]

#: How long a streamed turn takes to arrive, about.
STREAM_SECONDS = 1.5


def _called(messages: list[Json], tool: str) -> bool:
    return any(
        call.get("function", {}).get("name") == tool
        for m in messages
        if m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
    )


def _read_paths(messages: list[Json]) -> set[str]:
    paths: set[str] = set()
    for m in messages:
        if m.get("role") != "assistant":
            continue
        for call in m.get("tool_calls") or []:
            function = call.get("function", {})
            if function.get("name") == "read_file":
                with contextlib.suppress(json.JSONDecodeError, AttributeError):
                    paths.add(json.loads(function.get("arguments") or "{}").get("path", ""))
    return paths


def _listed(messages: list[Json]) -> str:
    """The text of the tool results so far (the file listing among them)."""
    return "\n".join(m.get("content") or "" for m in messages if m.get("role") == "tool")


_FILE_NAME = re.compile(r"(?<![\w./-])([\w-]+(?:\.[\w-]+)*\.[A-Za-z][A-Za-z0-9]{0,7})(?![\w-])")


def _named_files(task: str, messages: list[Json]) -> list[str]:
    """The workspace files the task names: named in its text and present in the listing."""
    listing = _listed(messages)
    return [n for n in dict.fromkeys(_FILE_NAME.findall(task)) if n in listing]


# "… and write them to summary.md", "save it as out.csv": the file the instruction asks for.
_OUTPUT_NAME = re.compile(
    r"\b(?:to|into|as|named|called)\s+[`'\"]?"
    r"([\w-]+(?:\.[\w-]+)*\.[A-Za-z][A-Za-z0-9]{0,7})(?![\w-])",
    re.IGNORECASE,
)
DEFAULT_OUTPUT = "report.md"


def output_name(task: str) -> str:
    """The artifact the demo model writes: the file the instruction asks the work to be written
    to, else report.md."""
    match = _OUTPUT_NAME.search(task)
    return match.group(1) if match else DEFAULT_OUTPUT


def _task_text(messages: list[Json]) -> str:
    for m in messages:
        if m.get("role") == "user" and "## Task" in (m.get("content") or ""):
            content: str = m["content"]
            return content.split("## Task", 1)[1].strip()
    return ""


def _call(name: str, arguments: Json) -> Json:
    return {
        "id": f"call_{uuid.uuid4().hex[:12]}",
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments)},
    }


def next_turn(body: Json) -> Json:
    """The assistant message for this request: tool calls, or a final answer."""
    messages = body.get("messages") or []
    tools = {t["function"]["name"] for t in body.get("tools") or [] if "function" in t}
    task = _task_text(messages)
    first_line = task.splitlines()[0] if task else "the task"
    if "ping" in tools and not _called(messages, "ping"):
        # The connection test's tool-calling probe (acthelm_connection test demo).
        return {"content": "", "tool_calls": [_call("ping", {})]}
    if "update_plan" in tools and not _called(messages, "update_plan"):
        steps = ["Understand the task", "Do the work with the tools at hand", "Report back"]
        if "propose_task" in tools:
            steps = ["Review the goal", "Propose the next pieces of work", "Summarise the plan"]
        return {
            "content": "I'll start with a plan.",
            "tool_calls": [
                _call("update_plan", {"steps": [{"step": s} for s in steps]}),
            ],
        }
    if "propose_task" in tools and not _called(messages, "propose_task"):
        goal = re.sub(r"\s+", " ", first_line)[:80]
        return {
            "content": "Two follow-up tasks will move this goal forward.",
            "tool_calls": [
                _call(
                    "propose_task",
                    {
                        "title": "Gather the facts",
                        "instruction": f"Collect the facts needed for: {goal}",
                    },
                ),
                _call(
                    "propose_task",
                    {
                        "title": "Write the summary",
                        "instruction": f"Write a one-page summary for: {goal}",
                        "depends_on_titles": ["Gather the facts"],
                    },
                ),
            ],
        }
    if "list_files" in tools and not _called(messages, "list_files"):
        return {
            "content": "Let me see which files I have.",
            "tool_calls": [_call("list_files", {})],
        }
    read = _read_paths(messages)
    output = output_name(task)
    # The file it is asked to write is not one to read (once written, the listing names it).
    unread = [n for n in _named_files(task, messages) if n not in read and n != output]
    if "read_file" in tools and unread:
        return {
            "content": f"Reading {unread[0]}.",
            "tool_calls": [_call("read_file", {"path": unread[0]})],
        }
    if "write_artifact" in tools and not _called(messages, "write_artifact"):
        report = f"# Report\n\nTask: {first_line}\n\nThe demo model looked at the workspace and "
        report += "wrote this report. A person reviews it and closes the task.\n"
        return {
            "content": f"Writing {output}.",
            "tool_calls": [_call("write_artifact", {"name": output, "content": report})],
        }
    if _called(messages, "propose_task"):
        did = "I proposed two follow-up tasks: gather the facts, then write the summary."
    else:
        parts = []
        if read:
            parts.append(f"read {', '.join(sorted(read))}")
        if _called(messages, "write_artifact"):
            parts.append(f"wrote {output}")
        did = ("I " + " and ".join(parts) + ".") if parts else "I have nothing to report."
    return {
        "content": f"{did}\n\nThis answer comes from Acthelm's scripted demo model, which does "
        "not understand tasks: a person reviews what it did.",
        "tool_calls": [],
    }


def stream_deltas(content: str, calls: list[Json]) -> list[Json]:
    """The pieces of a turn as a streamed answer's deltas: the text word by word, then each tool
    call (its name first, its arguments in pieces of a few characters)."""
    deltas: list[Json] = [{"role": "assistant", "content": ""}]
    words = content.split(" ")
    deltas += [{"content": w + " "} for w in words[:-1] if w] + [{"content": words[-1]}]
    for index, call in enumerate(calls):
        function = call["function"]
        first = {"index": index, "id": call["id"], "type": "function"}
        deltas.append({"tool_calls": [{**first, "function": {**function, "arguments": ""}}]})
        arguments = function["arguments"]
        for start in range(0, len(arguments), 16):
            piece = {"index": index, "function": {"arguments": arguments[start : start + 16]}}
            deltas.append({"tool_calls": [piece]})
    return [d for d in deltas if d != {"content": ""}]


class Handler(BaseHTTPRequestHandler):
    #: A streamed turn arrives over about this many seconds.
    stream_seconds = STREAM_SECONDS

    def log_message(self, format: str, *args: Any) -> None:  # quiet: the worker logs what matters
        return

    def _send(self, status: int, payload: Json) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self) -> None:
        if self.path.rstrip("/").endswith("/models"):
            self._send(200, {"data": [{"id": "demo", "object": "model", "context_length": 32768}]})
        else:
            self._send(404, {"error": {"message": "not found"}})

    def do_POST(self) -> None:
        if not self.path.rstrip("/").endswith("/chat/completions"):
            self._send(404, {"error": {"message": "not found"}})
            return
        length = int(self.headers.get("Content-Length") or 0)
        try:
            body = json.loads(self.rfile.read(length) or b"{}")
        except json.JSONDecodeError:
            self._send(400, {"error": {"message": "invalid JSON"}})
            return
        message = next_turn(body)
        calls = message.pop("tool_calls")
        finish = "tool_calls" if calls else "stop"
        head = {"id": f"chatcmpl-{uuid.uuid4().hex[:12]}", "model": body.get("model", "demo")}
        usage = {"prompt_tokens": 50, "completion_tokens": 20, "total_tokens": 70}
        if body.get("stream") is True:
            self._stream(head, stream_deltas(message["content"], calls), finish, usage)
            return
        reply = {"role": "assistant", "content": message["content"]}
        if calls:
            reply["tool_calls"] = calls
        self._send(
            200,
            {
                **head,
                "object": "chat.completion",
                "choices": [{"index": 0, "message": reply, "finish_reason": finish}],
                "usage": usage,
            },
        )

    def _stream(self, head: Json, deltas: list[Json], finish: str, usage: Json) -> None:
        """Server-Sent Events, one delta each, spread over `stream_seconds`; the connection's
        close ends the answer (HTTP/1.0)."""
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Cache-Control", "no-cache")
        self.end_headers()
        pace = self.stream_seconds / max(1, len(deltas))
        chunk = {**head, "object": "chat.completion.chunk"}
        events = [{**chunk, "choices": [{"index": 0, "delta": d}]} for d in deltas]
        events.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}]})
        events.append({**chunk, "choices": [], "usage": usage})
        try:
            for n, event in enumerate(events):
                if n and n < len(deltas):
                    time.sleep(pace)
                self.wfile.write(f"data: {json.dumps(event)}\n\n".encode())
                self.wfile.flush()
            self.wfile.write(b"data: [DONE]\n\n")
        except OSError:  # the worker let go (a cancel): nothing more to say
            self.close_connection = True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--stream-seconds", type=float, default=STREAM_SECONDS)
    args = parser.parse_args()
    Handler.stream_seconds = args.stream_seconds
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    print(f"demo model on http://{args.host}:{args.port}/v1", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
