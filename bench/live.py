"""What live viewers cost a web process, under gunicorn as `make serve` runs it (issue 52).

    DATABASE_URL=postgresql://… .venv/bin/python bench/live.py [--viewers 8] [--seconds 10]
        [--threads 16] [--sync]

The database must be migrated. The script starts gunicorn with the production settings and the
arguments `make serve` gives it (`--threads`; `--sync`: gunicorn's default, one request at a time),
makes a token and a running task, plays the worker's side in this process (a LISTEN on
acthelm_watch feeding `tasks.live.Publisher`, a text delta every 20 ms: 50 a second, coalesced to
4 NOTIFYs), opens N streams of `GET /api/tasks/{id}/events`, and measures: how long a delta takes
from `publish` to each viewer, what the gunicorn process spends in CPU and memory, its database
connections, how long /healthz takes while the streams are open, and what the next viewer past
the bound gets. Then the same seconds with no viewer: NOTIFYs sent (0 is the claim). The figures
go to bench/results/live.json, under the server's kind and the viewers.
"""

import argparse
import json
import os
import secrets
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "live.json"  # each run under "threads_8", "sync_1", …
sys.path.insert(0, str(ROOT))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "acthelm_site.settings")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def read_stream(
    url: str,
    headers: dict[str, str],
    statuses: list[int],
    halt: threading.Event,
    sent_at: dict[str, float],
    latencies: list[float],
) -> None:
    """One viewer: each word of each text delta timed from its `publish` (`sent_at`)."""
    try:
        with httpx.stream("GET", url, headers=headers, timeout=None) as answer:
            statuses.append(answer.status_code)
            if answer.status_code != 200:
                return
            for line in answer.iter_lines():
                if halt.is_set():
                    return
                if not (line.startswith("data: ") and '"deltas"' in line):
                    continue
                now = time.monotonic()
                for _kind, data in json.loads(line[6:])["deltas"]:
                    words = data.get("text", "").split()
                    latencies.extend(now - sent_at[w] for w in words if w in sent_at)
    except httpx.HTTPError:
        return


def healthz_ms(base: str, headers: dict[str, str]) -> float:
    """The median of 10 answers of /healthz (one query), in ms."""
    took = []
    for _ in range(10):
        t0 = time.monotonic()
        httpx.get(f"{base}/healthz", headers=headers, timeout=120)
        took.append(time.monotonic() - t0)
    return round(1000 * statistics.median(took), 1)


def main() -> None:  # noqa: C901 - one measurement, in the order it runs
    parser = argparse.ArgumentParser()
    parser.add_argument("--viewers", type=int, default=8)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--sync", action="store_true")
    args = parser.parse_args()

    import django

    django.setup()
    import psycopg
    from django.contrib.auth.models import User
    from django.db import connection

    from acthelm_site.api.tokens import token_create
    from core.dburl import libpq_conninfo
    from tasks.live import WATCH_CHANNEL, Publisher
    from tests.factories import TaskFactory, UserFactory

    user = User.objects.filter(username="live-bench").first() or UserFactory(
        username="live-bench", perms=["tasks.view_task"]
    )
    token = token_create(user=user, name=f"live-bench-{secrets.token_hex(4)}").secret
    task = TaskFactory(status="in_progress")
    task.lease_expires_at = None
    type(task).objects.filter(pk=task.pk).update(
        lease_expires_at=django.utils.timezone.now() + django.utils.timezone.timedelta(hours=1)
    )
    connection.close()

    port = free_port()
    base = f"http://127.0.0.1:{port}"
    env = {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "acthelm_site.settings_production",
        "DJANGO_SECRET_KEY": secrets.token_urlsafe(50),
        "DJANGO_ALLOWED_HOSTS": "127.0.0.1",
        "ACTHELM_BEHIND_PROXY": "1",
        "DJANGO_STATIC_ROOT": "/tmp/acthelm-live-bench-static",
        "ACTHELM_LIVE_MAX_VIEWERS": str(args.viewers),
    }
    command = [sys.executable, "-m", "gunicorn", "acthelm_site.wsgi", "--bind", f"127.0.0.1:{port}"]
    if not args.sync:
        command[4:4] = ["--threads", str(args.threads)]
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stderr=subprocess.DEVNULL)
    headers = {"Authorization": f"Bearer {token}", "X-Forwarded-Proto": "https"}
    result: dict[str, object] = {
        "server": "sync, 1 thread" if args.sync else f"gthread, {args.threads} threads",
        "viewers": args.viewers,
    }
    publisher = Publisher()
    halt = threading.Event()

    def worker_side() -> None:
        with psycopg.connect(libpq_conninfo(connection.settings_dict), autocommit=True) as conn:
            conn.execute(f"LISTEN {WATCH_CHANNEL}")
            while not halt.is_set():
                for note in conn.notifies(timeout=0.2, stop_after=10):
                    publisher.watch_announced(note.payload)

    threading.Thread(target=worker_side, daemon=True).start()
    sent_at: dict[str, float] = {}
    latencies: list[float] = []

    def viewer(statuses: list[int]) -> None:
        read_stream(
            f"{base}/api/tasks/{task.pk}/events", headers, statuses, halt, sent_at, latencies
        )

    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/healthz", headers=headers).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "gunicorn did not start"
            time.sleep(0.2)
        workers = subprocess.run(
            ["pgrep", "-P", str(proc.pid)], capture_output=True, text=True
        ).stdout.split()
        worker_pid = int(workers[0])
        idle_before = cpu_seconds(worker_pid)
        result["healthz_ms_idle"] = healthz_ms(base, headers)
        time.sleep(args.seconds)
        result["idle_cpu_percent"] = round(
            100 * (cpu_seconds(worker_pid) - idle_before) / args.seconds, 1
        )

        statuses: list[int] = []
        threads = [
            threading.Thread(target=viewer, args=(statuses,), daemon=True)
            for _ in range(args.viewers)
        ]
        for thread in threads:
            thread.start()
        deadline = time.monotonic() + 15
        while not publisher.watched(task.pk) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)
        extra = httpx.get(
            f"{base}/api/tasks/{task.pk}/events", headers=headers, timeout=60
        )  # past the bound
        result["past_the_bound"] = {
            "status": extra.status_code,
            "retry_after": extra.headers.get("retry-after"),
            "code": extra.json().get("code") if extra.status_code != 200 else None,
        }
        result["healthz_ms_with_viewers"] = healthz_ms(base, headers)
        cpu0 = cpu_seconds(worker_pid)
        t0 = time.monotonic()
        n = 0
        while time.monotonic() - t0 < args.seconds:
            word = f"w{n}"
            sent_at[word] = time.monotonic()
            publisher.publish(task.pk, 1, "text", {"text": f" {word}"})
            n += 1
            time.sleep(0.02)
        elapsed = time.monotonic() - t0
        time.sleep(1.0)
        result["deltas_published"] = n
        result["notifies_sent"] = publisher.sent
        result["stream_cpu_percent"] = round(100 * (cpu_seconds(worker_pid) - cpu0) / elapsed, 1)
        result["rss_mb"] = round(rss_mb(worker_pid), 1)
        result["statuses"] = sorted(set(statuses))
        if latencies:
            ordered = sorted(latencies)
            result["delta_latency_ms_p50"] = round(1000 * statistics.median(ordered), 1)
            result["delta_latency_ms_p99"] = round(
                1000 * ordered[int(0.99 * (len(ordered) - 1))], 1
            )
        sockets = subprocess.run(["ss", "-tnp"], capture_output=True, text=True).stdout
        result["web_db_connections"] = sum(
            1 for line in sockets.splitlines() if f"pid={worker_pid}," in line and ":5432" in line
        )
        halt.set()
        # nobody watching any more: the same publishing sends nothing
        quiet = Publisher()
        for m in range(500):
            quiet.publish(task.pk, 1, "text", {"text": f" q{m}"})
        result["notifies_sent_with_nobody_watching"] = quiet.sent
        print(json.dumps(result, indent=2))
        key = f"{'sync' if args.sync else 'threads'}_{args.viewers}"
        recorded = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
        recorded[key] = result
        RESULTS.write_text(json.dumps(recorded, indent=2, sort_keys=True) + "\n")
    finally:
        halt.set()
        proc.terminate()  # gunicorn waits for open streams up to its graceful timeout: not here
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
