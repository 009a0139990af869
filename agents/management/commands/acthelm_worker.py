"""Run Acthelm workers: claim ready tasks from PostgreSQL and run them."""

import gc
from argparse import ArgumentParser
from typing import Any

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from agents.engine.runtime.pool import configure_pool
from agents.engine.runtime.worker import Worker, default_worker_id
from core.commands import CHECKS

# A running task is a thread that holds a database connection only while it reads or writes (the
# pool, ACTHELM_DB_POOL_SIZE); more than this in one process is a typo, not a plan.
MAX_CONCURRENCY = 5000


class Command(BaseCommand):
    requires_system_checks = CHECKS  # all but the URLconf's: core/commands.py
    help = "Run workers that claim and run tasks (SIGTERM hands running tasks back, then exits)."

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--concurrency", type=int, default=1, help="tasks run at once")
        parser.add_argument("--burst", action="store_true", help="exit when nothing is claimable")
        parser.add_argument("--worker-id", default=None, help="default: host:pid")
        parser.add_argument(
            "--evaluation-only",
            action="store_true",
            help="claim evaluation tasks only (what the workers acthelm_eval run starts do)",
        )

    def handle(self, *args: Any, **opts: Any) -> None:
        if not 1 <= opts["concurrency"] <= MAX_CONCURRENCY:
            raise CommandError(f"--concurrency must be at least 1 and at most {MAX_CONCURRENCY}")
        worker_id = opts["worker_id"] or default_worker_id()
        configure_pool(settings.ACTHELM_DB_POOL_SIZE, worker_id=worker_id)
        worker = Worker(
            worker_id=worker_id,
            concurrency=opts["concurrency"],
            burst=opts["burst"],
            evaluation_only=opts["evaluation_only"],
        )
        worker.install_signal_handlers()
        # What the process imported and built before its first run (Django, the apps, the
        # providers' and tools' classes: most of its heap) lives as long as the process: moved
        # out of the collector's generations, so that no collection ever scans it again.
        gc.collect()
        gc.freeze()
        code = worker.run()
        if code:
            raise SystemExit(code)
