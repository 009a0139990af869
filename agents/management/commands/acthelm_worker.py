"""Run Acthelm workers: claim ready tasks from PostgreSQL and run them."""

from django.core.management.base import BaseCommand, CommandError

from agents.worker import Worker

# Each slot is a thread with its own database connection: far more than PostgreSQL's default
# max_connections is a typo, not a plan.
MAX_CONCURRENCY = 256


class Command(BaseCommand):
    help = "Run workers that claim and run tasks (SIGTERM hands running tasks back, then exits)."

    def add_arguments(self, parser):
        parser.add_argument("--concurrency", type=int, default=1, help="tasks run at once")
        parser.add_argument("--burst", action="store_true", help="exit when nothing is claimable")
        parser.add_argument("--worker-id", default=None, help="default: host:pid")

    def handle(self, *args, **opts):
        if not 1 <= opts["concurrency"] <= MAX_CONCURRENCY:
            raise CommandError(f"--concurrency must be at least 1 and at most {MAX_CONCURRENCY}")
        worker = Worker(
            worker_id=opts["worker_id"], concurrency=opts["concurrency"], burst=opts["burst"]
        )
        worker.install_signal_handlers()
        code = worker.run()
        if code:
            raise SystemExit(code)
