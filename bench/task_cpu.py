"""Worker CPU of a one-turn task: one burst worker process (`acthelm_worker --burst
--concurrency C`, DEBUG off) over N ready one-turn tasks, minus the same worker over none; the
process's user + system time (its rusage as it exits), in ms a task. The scripted model answers
"done" at once (bench/model_server.py, a process of its own), as in bench/dispatch.py.

    .venv/bin/python bench/task_cpu.py [--tasks 300] [--concurrency 8] [--repeat 3]
                                       [--engine-root PATH]

`--engine-root PATH` runs the workers from another checkout (for a "before" row: a worktree of
an earlier commit); the tasks are made by this checkout. Prints the median of `--repeat`
interleaved (empty, full) pairs; writes nothing.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
from dispatch import create_tasks  # noqa: E402
from model_server import ModelServerProcess  # noqa: E402

DB = "acthelm_bench_task_cpu"
PRODUCTION_ENV = {"DJANGO_DEBUG": "0", "DJANGO_SECRET_KEY": "task-cpu-bench-" + "k" * 50}


def worker_cpu(db_url: str, root: Path, concurrency: int) -> float:
    """Seconds of user + system CPU of one burst worker from `root`, run to its exit."""
    env = common.child_env(db_url, **PRODUCTION_ENV)
    env["PYTHONPATH"] = str(root) + os.pathsep + env.get("PYTHONPATH", "")
    child = subprocess.Popen(
        [
            sys.executable,
            str(root / "manage.py"),
            "acthelm_worker",
            "--worker-id",
            "task-cpu",
            "--burst",
            "--concurrency",
            str(concurrency),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        cwd=root,
    )
    assert child.stderr is not None
    err = child.stderr.read()
    _, status, usage = os.wait4(child.pid, 0)
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise RuntimeError(f"worker failed: {err[-2000:]!r}")
    return usage.ru_utime + usage.ru_stime


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=300)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--engine-root", type=Path, default=common.ROOT)
    args = parser.parse_args()
    root = args.engine_root.resolve()

    db_url = common.recreate_database(DB)
    common.django_on(db_url)
    from tasks.models import Task

    per_task = []
    with ModelServerProcess("done") as model_url:
        for _ in range(args.repeat):
            common.truncate_acthelm()
            model = common.scripted_connection(model_url)
            empty = worker_cpu(db_url, root, args.concurrency)
            create_tasks(model, args.tasks)
            full = worker_cpu(db_url, root, args.concurrency)
            done = Task.objects.filter(status="review").count()
            if done != args.tasks:
                raise RuntimeError(f"{done} of {args.tasks} tasks in review")
            ms = (full - empty) * 1000 / args.tasks
            per_task.append(ms)
            print(f"empty {empty:.2f} s, full {full:.2f} s: {ms:.2f} ms a task", flush=True)
    print(
        f"worker CPU a one-turn task ({root.name}, concurrency {args.concurrency}, "
        f"{args.tasks} tasks): median {common.median(per_task):.2f} ms "
        f"(runs {', '.join(f'{v:.2f}' for v in per_task)})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
