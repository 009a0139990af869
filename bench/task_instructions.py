"""A one-turn task's instructions in the worker, counted rather than timed: its claim, its
start (loading the task), the model's answer, the supervisor's verdict and the outcome's
transaction into review. N one-turn tasks (the scripted model answers "done" at once, as in
bench/dispatch.py) run by one worker slot in a child process under `valgrind --tool=callgrind`,
for each N of --counts; the difference between two counts over the tasks between them is what a
task costs the worker process beyond its start-up. This is the work a fleet does in the bursts
at its tasks' starts and ends (bench/fleet.py), measured without the machine's load: a timing
on this 2-core machine moves by ±30 % between windows, a count by under 1 %.

    .venv/bin/python bench/task_instructions.py [--counts 10,60] [--engine-root PATH]

`--engine-root PATH` also counts another checkout's worker (a "before": a worktree of an earlier
commit) on the same tasks, made by this checkout; its migrations must be this checkout's or a
prefix of them, and its step function this checkout's (bench/step_instructions.py says why; each
count checks that its tasks reached review). The slot claims one task at a time (`Worker.drain`),
where a fleet's dispatcher claims up to ACTHELM_CLAIM_BATCH in one statement: a claim here costs a
statement a task. The production settings (DEBUG off), after `gc.freeze()` as the command does.
Prints a table; writes nothing. Needs valgrind (Debian's package).
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from dispatch import create_tasks  # noqa: E402
from model_server import ModelServerProcess  # noqa: E402
from step_instructions import counted_args, instructions, scratch_database  # noqa: E402

DB = "acthelm_bench_task_instructions"


def main() -> int:
    counts, roots = counted_args("--counts", "10,60")
    with (
        scratch_database(DB) as (scratch, media, db_url),
        ModelServerProcess("done") as model_url,
    ):
        rows = [_count(root, db_url, model_url, media, scratch, counts) for root in roots]
    common.print_table(
        "Worker instructions per one-turn task (millions; callgrind, one worker slot)",
        ["tree", *(f"tasks {a}–{b}" for a, b in itertools.pairwise(counts))],
        rows,
    )
    return 0


def _count(
    root: Path, db_url: str, model_url: str, media: str, scratch: str, counts: list[int]
) -> list[str]:
    total = {}
    for n in counts:
        common.truncate_acthelm()
        create_tasks(common.scripted_connection(model_url), n)
        total[n] = instructions(db_url, root, media, Path(scratch) / f"cg.{n}.out", processed=n)
        print(f"{root.name}, {n} tasks: {total[n]:,} instructions", flush=True)
    per = [(total[b] - total[a]) / (b - a) for a, b in itertools.pairwise(counts)]
    return [root.name, *(f"{p / 1e6:.3f}" for p in per)]


if __name__ == "__main__":
    sys.exit(main())
