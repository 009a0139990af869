"""A read-only step's instructions in the worker, counted rather than timed: one task of N
list_files steps (the scripted model answers at once) run to its end by one worker slot in a child
process under `valgrind --tool=callgrind`, for each N of --lengths. The difference between two
lengths over the steps between them is what a step costs the worker process, in instructions:
the same figure on a busy machine as on an idle one, where a timing on this 2-core machine moves
by ±30 % between windows. A later window that costs more is a step that grows with the
conversation (its history is longer there).

    .venv/bin/python bench/step_instructions.py [--lengths 20,120,220] [--engine-root PATH]

`--engine-root PATH` also counts another checkout's worker (a "before": a worktree of an earlier
commit) on the same tasks, made by this checkout; its migrations must be this checkout's or a
prefix of them, and its step function this checkout's: a tree before migration 0022 (0b2dd48 and
earlier) fails every step on this database (its worker sends no value for the conversation's new
columns), so count it with its own `bench/step_instructions.py`, run from that tree. Each count
checks that its task reached review: a run that failed is no step counted. The child runs what
`acthelm_worker --burst --concurrency 1` runs in its slot, with the production settings (DEBUG
off), after `gc.freeze()` as the command does. Prints a table; writes nothing. Needs valgrind
(Debian's package); each tree takes a few minutes.
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from model_server import ModelServerProcess  # noqa: E402
from steps import create_task  # noqa: E402

DB = "acthelm_bench_step_instructions"
PRODUCTION_ENV = {"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": "step-instructions-" + "k" * 50}

# One worker slot in this process until nothing is claimable (common.engine_run_inline), after
# the start-up heap is frozen as acthelm_worker freezes it.
CHILD = """
import gc, os, django
django.setup()
try:
    from agents.engine.runtime.worker import Worker
except ImportError:  # a tree before the engine's rooms (issue 50)
    from agents.engine.worker import Worker
gc.collect(); gc.freeze()
worker = Worker(worker_id="step-instructions", concurrency=1, burst=True)
worker.drain()
expected = int(os.environ["STEP_INSTRUCTIONS_TASKS"])
assert worker.processed == expected, (worker.processed, expected)
from tasks.models import Task
ended = list(Task.objects.values_list("status", "failure_message"))
assert all(status == "review" for status, _ in ended), ended
"""


def instructions(db_url: str, root: Path, media: str, out: Path, *, processed: int = 1) -> int:
    """Instructions the child process executed (callgrind's total), running the `processed`
    ready tasks."""
    env = common.child_env(
        db_url, **PRODUCTION_ENV, ACTHELM_MEDIA_ROOT=media, STEP_INSTRUCTIONS_TASKS=str(processed)
    )
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    child = subprocess.run(
        [
            "valgrind",
            "--tool=callgrind",
            f"--callgrind-out-file={out}",
            sys.executable,
            "-c",
            CHILD,
        ],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    if child.returncode != 0:
        raise RuntimeError(f"the counted worker failed: {child.stderr[-3000:]}")
    found = re.search(r"^(?:summary|totals): (\d+)", out.read_text(), re.MULTILINE)
    if found is None:
        raise RuntimeError(f"no total in {out}")
    return int(found.group(1))


def counted_args(option: str, default: str) -> tuple[list[int], list[Path]]:
    """The command line of a callgrind count: the sizes of `option` (two at least, in order) and
    the trees to count (this checkout, then --engine-root's). Exits when valgrind is missing."""
    parser = argparse.ArgumentParser(description=sys.modules["__main__"].__doc__.split("\n\n")[0])
    parser.add_argument(option, default=default)
    parser.add_argument("--engine-root", type=Path)
    args = parser.parse_args()
    sizes = sorted(int(n) for n in getattr(args, option.lstrip("-").replace("-", "_")).split(","))
    if len(sizes) < 2:
        parser.error(f"{option} needs two values at least")
    if shutil.which("valgrind") is None:
        parser.exit(2, "valgrind is not installed (apt-get install valgrind)\n")
    return sizes, [common.ROOT] + ([args.engine_root.resolve()] if args.engine_root else [])


@contextmanager
def scratch_database(name: str) -> Iterator[tuple[str, str, str]]:
    """A scratch folder, the media root in it (where the tasks' input files go, for this process
    and the counted children) and the database `name`, made anew: (scratch, media, its URL)."""
    with tempfile.TemporaryDirectory() as scratch:
        media = os.path.join(scratch, "media")
        os.environ["ACTHELM_MEDIA_ROOT"] = media
        db_url = common.recreate_database(name)
        common.django_on(db_url)
        yield scratch, media, db_url


def main() -> int:
    lengths, roots = counted_args("--lengths", "20,120,220")
    with (
        scratch_database(DB) as (scratch, media, db_url),
        ModelServerProcess("steps") as model_url,
    ):
        rows = [_count(root, db_url, model_url, media, scratch, lengths) for root in roots]
    windows = list(itertools.pairwise(lengths))
    common.print_table(
        "Worker instructions per read-only step (millions; callgrind, one worker slot)",
        ["tree", *(f"steps {a}–{b}" for a, b in windows), "last ÷ first window"],
        rows,
    )
    return 0


def _count(
    root: Path, db_url: str, model_url: str, media: str, scratch: str, lengths: list[int]
) -> list[str]:
    total = {}
    for n in lengths:
        common.truncate_acthelm()
        create_task(model_url, n)
        total[n] = instructions(db_url, root, media, Path(scratch) / f"cg.{n}.out")
        print(f"{root.name}, {n} steps: {total[n]:,} instructions", flush=True)
    per = [(total[b] - total[a]) / (b - a) for a, b in itertools.pairwise(lengths)]
    return [root.name, *(f"{p / 1e6:.3f}" for p in per), f"{per[-1] / per[0]:.2f}×"]


if __name__ == "__main__":
    sys.exit(main())
