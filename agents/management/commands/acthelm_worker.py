"""Run Acthelm workers: claim ready tasks from PostgreSQL and run them."""

from django.core.management.base import BaseCommand, CommandError

from agents.worker import Worker


class Command(BaseCommand):
    help = "Run workers that claim and run tasks (SIGTERM hands running tasks back, then exits)."

    def add_arguments(self, parser):
        parser.add_argument("--concurrency", type=int, default=1, help="tasks run at once")
        parser.add_argument("--burst", action="store_true", help="exit when nothing is claimable")
        parser.add_argument("--worker-id", default=None, help="default: host:pid")

    def handle(self, *args, **opts):
        if opts["concurrency"] < 1:
            raise CommandError("--concurrency must be at least 1")
        worker = Worker(
            worker_id=opts["worker_id"], concurrency=opts["concurrency"], burst=opts["burst"]
        )
        worker.install_signal_handlers()
        code = worker.run()
        if code:
            raise SystemExit(code)
