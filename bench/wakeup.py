"""Wake-up and recovery latency.

    .venv/bin/python bench/wakeup.py [--samples 200] [--kills 5]

1. Ready → claimed, with idle workers: two `acthelm_worker` processes wait (LISTEN); one task at a
   time is created (task_create commits, NOTIFY on commit) and the clock runs from just after the
   commit returns to the run's `started_at` (written by the claim's transaction). Goal: p50 < 20 ms.
2. SIGKILL → resumed: a worker holding a task (its model request in flight) is SIGKILLed; the clock
   runs from the kill to the `started_at` of the task's next run, claimed by the other worker after
   recover_stale() found the lease expired. Goal: < lease + 2 s. Measured with a short lease and
   the default recovery interval (ACTHELM_RECOVER_INTERVAL_SECONDS=30), and with a short interval.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402

NAME = "wakeup"
DB = "acthelm_bench_wakeup"
GOAL_P50_MS = 20.0
GOAL_SLACK_S = 2.0


def first_request_hangs():
    """The scripted model: a task's first request hangs (the worker gets killed meanwhile); any
    later request (the rescuer's) is answered at once."""
    from tests.fakes.model_server import hang, reply_text

    seen: set[str] = set()

    def step(request_json):
        messages = (request_json or {}).get("messages") or []
        key = next((m["content"] for m in messages if m.get("role") == "user"), "")
        if "hang-first" in key and key not in seen:
            seen.add(key)
            return hang(120)
        return reply_text("done")

    return step


def stop(children) -> None:
    for child in children:
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children:
        try:
            child.wait(20)
        except Exception:  # noqa: BLE001 - a wedged child is killed below
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()


def measure_wakeup(db_url: str, model, samples: int) -> list[float]:
    from agents.engine.run.intake import task_create
    from agents.models import AgentRun
    from core.actors import Actor
    from tasks.models import Task

    prefix = "wake-"
    children = [common.spawn_worker(db_url, f"{prefix}{i}") for i in range(2)]
    latencies = []
    try:
        common.wait_until(
            lambda: common.listening_workers(prefix) >= 2, timeout=60, what="idle workers"
        )
        time.sleep(0.5)
        for i in range(samples):
            task = task_create(
                actor=Actor.system("bench"),
                title=f"wake {i}",
                instruction="Answer.",
                tools=[],
                model=model,
            )
            committed = time.time()
            run = common.wait_until(
                lambda task=task: AgentRun.objects.filter(task=task).first(),
                timeout=30,
                interval=0.002,
                what="the claim",
            )
            latencies.append((run.started_at.timestamp() - committed) * 1000)
            common.wait_until(
                lambda task=task: Task.objects.filter(pk=task.pk, status="review").exists(),
                timeout=30,
                interval=0.005,
                what="review",
            )
            time.sleep(random.uniform(0.02, 0.08))  # both workers idle again
    finally:
        stop(children)
    return latencies


def measure_recovery(db_url: str, model, server, kills: int, env: dict) -> list[float]:
    """Kill the holder mid model request; time until the task's next run starts."""
    from agents.engine.run.intake import task_create
    from agents.models import AgentRun
    from core.actors import Actor
    from tasks.models import Task

    results = []
    slots: dict[int, object] = {}
    generation = 0

    def start(slot: int):
        nonlocal generation
        generation += 1
        slots[slot] = (
            f"rec-{generation}",
            common.spawn_worker(db_url, f"rec-{generation}", env=env),
        )

    for slot in (0, 1):
        start(slot)
    try:
        common.wait_until(
            lambda: common.listening_workers("rec-") >= 2, timeout=60, what="idle workers"
        )
        for i in range(kills):
            time.sleep(0.5)
            requests_before = len(server.completion_requests)
            task = task_create(
                actor=Actor.system("bench"),
                title=f"recover {i}",
                instruction=f"hang-first {i}",
                tools=[],
                model=model,
            )
            common.wait_until(
                lambda n=requests_before: len(server.completion_requests) > n,
                timeout=30,
                what="the model request in flight",
            )
            holder = Task.objects.get(pk=task.pk).lease_owner
            slot = next(s for s, (wid, _) in slots.items() if wid == holder)
            os.killpg(slots[slot][1].pid, signal.SIGKILL)
            killed = time.time()
            slots[slot][1].wait()
            run = common.wait_until(
                lambda task=task: AgentRun.objects.filter(task=task, number=2).first(),
                timeout=120,
                interval=0.01,
                what="the task's next run",
            )
            results.append(run.started_at.timestamp() - killed)
            common.wait_until(
                lambda task=task: Task.objects.filter(pk=task.pk, status="review").exists(),
                timeout=60,
                what="review",
            )
            start(slot)
            common.wait_until(
                lambda: common.listening_workers("rec-") >= 2, timeout=60, what="a new worker"
            )
    finally:
        stop([proc for _, proc in slots.values()])
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--kills", type=int, default=5)
    parser.add_argument("--lease", type=float, default=3.0)
    args = parser.parse_args()

    db_url = common.recreate_database(DB)
    common.django_on(db_url)
    from tests.fakes.model_server import ScriptedModelServer

    with ScriptedModelServer([], default=first_request_hangs()) as server:
        common.truncate_acthelm()
        model = common.scripted_connection(server)
        print(f"… ready → claimed, {args.samples} samples", flush=True)
        wake = measure_wakeup(db_url, model, args.samples)
        heartbeat = args.lease / 3
        recovery = {}
        for label, interval in (("default recovery interval (30 s)", None), ("0.5 s", 0.5)):
            env = {
                "ACTHELM_LEASE_SECONDS": str(args.lease),
                "ACTHELM_HEARTBEAT_SECONDS": str(heartbeat),
            }
            if interval is not None:
                env["ACTHELM_RECOVER_INTERVAL_SECONDS"] = str(interval)
            kills = args.kills if interval is not None else max(2, args.kills // 2)
            print(f"… SIGKILL → resumed, lease {args.lease:g} s, {label}: {kills}", flush=True)
            recovery[label] = measure_recovery(db_url, model, server, kills, env)

    facts = common.machine()
    vers = common.versions()
    p50, p99 = common.pct(wake, 50), common.pct(wake, 99)
    rows = [
        [
            "ready → claimed, idle workers (ms)",
            len(wake),
            f"{p50:.1f}",
            f"{p99:.1f}",
            f"{max(wake):.1f}",
            f"p50 < {GOAL_P50_MS:g} ms: {common.verdict(p50 < GOAL_P50_MS)} "
            f"({p50 / GOAL_P50_MS:.2f}× the bound)",
        ]
    ]
    bound = args.lease + GOAL_SLACK_S
    for label, values in recovery.items():
        rows.append(
            [
                f"SIGKILL → resumed (s), lease {args.lease:g} s, {label}",
                len(values),
                f"{common.pct(values, 50):.2f}",
                f"{common.pct(values, 99):.2f}",
                f"{max(values):.2f}",
                f"< lease + {GOAL_SLACK_S:g} s = {bound:g} s: "
                f"{common.verdict(max(values) < bound)} ({max(values) / bound:.2f}× the bound)",
            ]
        )
    table = common.print_table("wakeup", ["measure", "samples", "p50", "p99", "max", "goal"], rows)
    goals = [
        [
            f"ready → claimed p50 < {GOAL_P50_MS:g} ms (idle workers)",
            f"{p50:.1f} ms (p99 {p99:.1f} ms) = {p50 / GOAL_P50_MS:.2f}× the bound",
            common.verdict(p50 < GOAL_P50_MS),
        ]
    ]
    for label, values in recovery.items():
        goals.append(
            [
                f"SIGKILL → resumed < lease + {GOAL_SLACK_S:g} s ({bound:g} s), {label}",
                f"max {max(values):.2f} s = {max(values) / bound:.2f}× the bound",
                common.verdict(max(values) < bound),
            ]
        )
    section = (
        f"### wakeup\n\n`.venv/bin/python bench/wakeup.py --samples {args.samples} "
        f"--kills {args.kills} --lease {args.lease:g}`\n\n{common.facts_line(facts, vers)}\n\n"
        f"{table}\n"
    )
    common.record(
        NAME,
        section,
        {"facts": facts, "versions": vers, "wakeup_ms": wake, "recovery_s": recovery},
        goals,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
