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

import queue
import random
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# --------------------------------------------------------------------------- item 10: search_files

_SEARCH_CHILD = r"""
import json, sys, threading, time
from pathlib import Path

from agents.tools import ToolContext, ToolError, files, get_tool

workspace, budget, pattern = Path(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
files.SEARCH_TIME_BUDGET = budget


def heartbeat():  # what a worker's heartbeat thread does: wake up often, do a little Python
    while True:
        print("tick", flush=True)
        time.sleep(0.05)


threading.Thread(target=heartbeat, daemon=True).start()
time.sleep(0.2)
print("start", flush=True)
tool = get_tool("search_files")
ctx = ToolContext(workspace=workspace, artifacts_dir=workspace)
try:
    result = tool.run(tool.parse({"pattern": pattern, "regex": True}), ctx)
    print("result " + json.dumps(result.data["timed_out"]), flush=True)
except ToolError as exc:
    print("error " + exc.code, flush=True)
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
        stderr=subprocess.DEVNULL,
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
            elif line.startswith(("result", "error", "<eof>")):
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
    ticks, longest_gap, final = _run_search_child(tmp_path, pattern, budget, wait=budget + 20)
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
