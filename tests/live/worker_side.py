"""A worker process's side of the live channel, as a child process of a test:

    python -m tests.live.worker_side TASK_ID RUN_ID WORKER_ID

Its connections as a worker's: a pool (`configure_pool`, through `DATABASE_URL`: a PgBouncer in
the test) that the publisher borrows for each send, and a LISTEN connection to
`ACTHELM_LISTEN_DATABASE_URL` (PostgreSQL itself) that hands each announcement to
`tasks.live.watch_announced`, as the worker's `_listen` does. Once the task is watched it
publishes a turn word by word for 20 s, printing "watched" first."""

import sys
import threading
import time

import django


def main() -> None:
    django.setup()
    import psycopg
    from django.conf import settings
    from django.db import connection

    from agents.engine.runtime.pool import configure_pool
    from core.dburl import listen_conninfo
    from tasks import live

    task_id, run_id, worker_id = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
    configure_pool(2, worker_id=worker_id)
    conninfo = listen_conninfo(
        settings.ACTHELM_LISTEN_DATABASE_URL,
        connection.settings_dict,
        application_name=f"acthelm-listen {worker_id}",
    )

    def listen() -> None:
        with psycopg.connect(conninfo, autocommit=True) as conn:
            conn.execute(f"LISTEN {live.WATCH_CHANNEL}")
            while True:
                for note in conn.notifies(timeout=1.0):
                    live.watch_announced(note.payload)

    threading.Thread(target=listen, daemon=True).start()
    deadline = time.monotonic() + 30
    while not live.publisher.watched(task_id):
        if time.monotonic() > deadline:
            sys.exit("never watched")
        time.sleep(0.05)
    print("watched", flush=True)
    live.publish(task_id, run_id, "turn", {})
    end = time.monotonic() + 20
    n = 0
    while time.monotonic() < end:
        live.publish(task_id, run_id, "text", {"text": f"word{n} "})
        n += 1
        time.sleep(0.05)


if __name__ == "__main__":
    main()
