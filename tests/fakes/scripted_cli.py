#!/usr/bin/env python3
"""A scripted stand-in for a model CLI (``llm``, ``claude -p``, ...). Stdlib only.

It always reads stdin fully (the prompt) first, then acts according to ``--mode``:

  echo          print "ANSWER: " + the first 200 characters of the prompt
  text          print --text
  json          print --json (a JSON document, verbatim)
  sleep         sleep --seconds, then print --text (default "slept")
  hang          sleep forever
  fail          print --stderr to stderr and exit with --exit-code (default 1)
  invalid-json  print a broken JSON document
  huge          print --bytes bytes
  env           print "<NAME>=<value>" for --env-name NAME ("<NAME> unset" if missing)
  script        answer from --script FILE: a JSON list consumed in order across
                invocations (state in --state-file, default "<count-file or script>.state");
                entries: {"text": T}, {"json": OBJ}, {"fail": {"code": N, "stderr": S}},
                {"sleep": S, "text": T}, {"hang": true}; once exhausted: "done".

``--count-file PATH`` appends one JSON line per invocation ({"pid", "argv", "time"}) under
an fcntl lock; ``--prompt-file PATH`` appends the received prompt (followed by a line
"\\x00END\\x00"). ``--stderr MSG`` is written to stderr in every mode.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import sys
import time

PROMPT_SEPARATOR = "\x00END\x00\n"


def _append_locked(path: str, text: str) -> None:
    with open(path, "a", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            fh.write(text)
            fh.flush()
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def _next_script_entry(script_path: str, state_path: str) -> dict:
    with open(script_path, encoding="utf-8") as fh:
        entries = json.load(fh)
    fd = os.open(state_path, os.O_RDWR | os.O_CREAT, 0o644)
    with os.fdopen(fd, "r+", encoding="utf-8") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            raw = fh.read().strip()
            index = int(raw) if raw else 0
            fh.seek(0)
            fh.truncate()
            fh.write(str(index + 1))
            fh.flush()
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
    if index < len(entries):
        return entries[index]
    return {"text": "done"}


def _out(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def _hang() -> None:
    while True:
        time.sleep(3600)


def _act(entry: dict) -> int:
    if entry.get("sleep"):
        time.sleep(float(entry["sleep"]))
    if entry.get("hang"):
        _hang()
    if "fail" in entry:
        fail = entry["fail"] or {}
        sys.stderr.write(str(fail.get("stderr", "failed")))
        sys.stderr.flush()
        return int(fail.get("code", 1))
    if "json" in entry:
        _out(json.dumps(entry["json"]))
        return 0
    _out(str(entry.get("text", "")) + "\n")
    return 0


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="scripted model CLI for tests")
    parser.add_argument(
        "--mode",
        default="echo",
        choices=[
            "echo",
            "text",
            "json",
            "sleep",
            "hang",
            "fail",
            "invalid-json",
            "huge",
            "env",
            "script",
        ],
    )
    parser.add_argument("--text", default=None)
    parser.add_argument("--json", default='{"result": "ok"}')
    parser.add_argument("--seconds", type=float, default=1.0)
    parser.add_argument("--exit-code", type=int, default=1)
    parser.add_argument("--stderr", default=None)
    parser.add_argument("--bytes", type=int, default=1024)
    parser.add_argument("--env-name", default=None)
    parser.add_argument("--script", default=None)
    parser.add_argument("--state-file", default=None)
    parser.add_argument("--count-file", default=None)
    parser.add_argument("--prompt-file", default=None)
    return parser


def _record(args: argparse.Namespace, prompt: str) -> None:
    """What every mode does first: log the call and the prompt, write --stderr."""
    if args.count_file:
        record = {"pid": os.getpid(), "argv": sys.argv[1:], "time": time.time()}
        _append_locked(args.count_file, json.dumps(record) + "\n")
    if args.prompt_file:
        _append_locked(args.prompt_file, prompt + PROMPT_SEPARATOR)
    if args.stderr and args.mode != "fail":
        sys.stderr.write(args.stderr)
        sys.stderr.flush()


def _write_bytes(count: int) -> int:
    """Print ``count`` bytes of "x"; exit code 1 when the reader goes away first."""
    chunk = b"x" * (1024 * 1024)
    remaining = count
    try:
        while remaining > 0:
            piece = chunk[: min(len(chunk), remaining)]
            sys.stdout.buffer.write(piece)
            remaining -= len(piece)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        return 1
    return 0


def _answer(args: argparse.Namespace, prompt: str, parser: argparse.ArgumentParser) -> int:
    """Act out --mode; returns the exit code."""
    mode = args.mode
    if mode == "echo":
        _out("ANSWER: " + prompt[:200] + "\n")
    elif mode == "text":
        _out((args.text if args.text is not None else "") + "\n")
    elif mode == "json":
        _out(args.json + "\n")
    elif mode == "sleep":
        time.sleep(args.seconds)
        _out((args.text if args.text is not None else "slept") + "\n")
    elif mode == "hang":
        _hang()
    elif mode == "fail":
        sys.stderr.write(args.stderr if args.stderr is not None else "failed")
        sys.stderr.flush()
        return args.exit_code
    elif mode == "invalid-json":
        _out('{"result": "unterminated\n')
    elif mode == "huge":
        return _write_bytes(args.bytes)
    elif mode == "env":
        name = args.env_name or ""
        value = os.environ.get(name)
        _out(f"{name}={value}\n" if value is not None else f"{name} unset\n")
    elif mode == "script":
        if not args.script:
            parser.error("--mode script needs --script FILE")
        state = args.state_file or f"{args.count_file or args.script}.state"
        return _act(_next_script_entry(args.script, state))
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    prompt = sys.stdin.buffer.read().decode("utf-8", "replace")
    _record(args, prompt)
    return _answer(args, prompt, parser)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except BrokenPipeError:
        sys.exit(1)
