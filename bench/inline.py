"""One measured worker slot in this process (used by dispatch.py and steps.py, not run by hand).

    DATABASE_URL=<scratch> python bench/inline.py WORKER_ID [--cprofile]

Runs one worker slot in the main thread over the ready tasks of the scratch database until nothing
is claimable (`common.engine_run_inline`), with `common.Meter` installed on this thread's
connection and on the provider's model call, and prints one JSON line: the measured intervals
(see `Meter`), the tasks processed and, with --cprofile, the functions that took the time.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

PROFILE_KEYS = (
    "loop.py",
    "outcomes.py",
    "decide.py",
    "transitions.py",
    "supervisor.py",
    "_http.py",
    "openai_compat.py",
    "limits.py",
    "recorder",
    "memory",
    "worker.py",
)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("worker_id")
    parser.add_argument("--cprofile", action="store_true")
    args = parser.parse_args()
    common.django_on(os.environ["DATABASE_URL"], migrate=False)
    meter = common.Meter()
    meter.install()
    profiler = cProfile.Profile() if args.cprofile else None
    started = time.perf_counter()
    if profiler:
        profiler.enable()
    processed = common.engine_run_inline(args.worker_id)
    if profiler:
        profiler.disable()
    seconds = time.perf_counter() - started
    out = {"tasks": processed, "seconds": seconds, "intervals": meter.finish()}
    if profiler:
        stream = io.StringIO()
        stats = pstats.Stats(profiler, stream=stream)
        top = []
        for func, (_cc, _nc, tt, ct, _callers) in stats.stats.items():
            top.append((ct, tt, f"{Path(func[0]).name}:{func[1]}({func[2]})"))
        out["top"] = [
            {"cum_ms": ct * 1000, "own_ms": tt * 1000, "f": f}
            for ct, tt, f in sorted(top, reverse=True)
            if any(k in f for k in PROFILE_KEYS)
        ][:25]
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
