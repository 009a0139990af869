"""The supervisor measured against the evaluation suite's grader (issue 23).

    .venv/bin/python bench/supervisor.py [--models good,bad,demo] [--configs rules,defaults,...]

Runs the whole suite (`agents.eval.runner.Runner`, real burst workers) on three scripted models —
the good and the bad model of the suite's tests (`tests/fakes/eval_model.py`) and the demo model of
`make run` (`acthelm_site/demo_model.py`) — under each supervisor configuration:

- `rules`: the rules only (the default checks off: ACTHELM_SUPERVISOR_DEFAULT_CHECKS=false);
- `defaults`: the rules and the default checks (what every task gets);
- `case-checks`: the default checks and each case's grader, where expressible, attached to the
  task as acceptance checks (what a person who writes checks gets);
- `model-down`: the default checks and a model supervisor that cannot be asked (its connection
  refuses): every run it would have judged goes to review *unverified*.

and prints, per model and configuration, the supervisor's false approvals (the grader failed the
work, the supervisor let it into review) and false rejections (the grader passed it, the
supervisor rejected it), with 95% Wilson intervals. Writes bench/results/supervisor.json. On a
scratch database of its own (`acthelm_bench_supervisor`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # noqa: E402

DB = "acthelm_bench_supervisor"
CONFIGS = {
    "rules": ({"ACTHELM_SUPERVISOR_DEFAULT_CHECKS": "false"}, False),
    "defaults": ({"ACTHELM_SUPERVISOR_DEFAULT_CHECKS": "true"}, False),
    "case-checks": ({"ACTHELM_SUPERVISOR_DEFAULT_CHECKS": "true"}, True),
    "model-down": (
        {"ACTHELM_SUPERVISOR_DEFAULT_CHECKS": "true", "ACTHELM_SUPERVISOR_CONNECTION": "down"},
        False,
    ),
}
SUPERVISOR_ENV = ("ACTHELM_SUPERVISOR_DEFAULT_CHECKS", "ACTHELM_SUPERVISOR_CONNECTION")


class DemoServer:
    """The demo model of `make run` on a free loopback port, in a thread."""

    def __init__(self):
        from acthelm_site.demo_model import Handler

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self):
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.httpd.shutdown()
        self.httpd.server_close()


def run_suite(model: str, config: str, *, timeout: float) -> int:
    from django.test import override_settings

    from agents.eval.runner import Runner

    env, case_checks = CONFIGS[config]
    for key in SUPERVISOR_ENV:
        os.environ.pop(key, None)
    os.environ.update(env)
    overrides = {
        "ACTHELM_SUPERVISOR_DEFAULT_CHECKS": env["ACTHELM_SUPERVISOR_DEFAULT_CHECKS"] == "true",
        "ACTHELM_SUPERVISOR_CONNECTION": env.get("ACTHELM_SUPERVISOR_CONNECTION", ""),
    }
    with override_settings(**overrides):
        summary = Runner(
            connection=model,
            model="test-model",
            concurrency=4,
            allow_loopback_fetch=True,
            timeout=timeout,
            case_checks=case_checks,
            out=lambda line: None,
        ).run()
    return summary.run.pk


def rows_for(runs: dict[tuple[str, str], int]) -> list[dict]:
    from agents.eval.report import eval_report

    out = []
    for (model, config), run_id in runs.items():
        (group,) = eval_report(run_id=run_id)
        s = group.supervision
        out.append(
            {
                "model": model,
                "config": config,
                "supervisor": group.supervisor_label,
                "run": run_id,
                "passed": group.passed,
                "graded": group.attempts,
                "judged": s.judged,
                "false_approvals": s.false_approvals.as_dict(),
                "false_approvals_text": s.false_approvals.text(),
                "false_approvals_expressible": s.false_approvals_expressible.as_dict(),
                "false_approvals_expressible_text": s.false_approvals_expressible.text(),
                "false_rejections": s.false_rejections.as_dict(),
                "false_rejections_text": s.false_rejections.text(),
                "unverified": s.unverified,
                "let_through": sorted(
                    r.case_id
                    for r in group.results
                    if r.supervisor_verdict in ("approved", "unverified")
                    and not (r.work_passed if r.work_passed is not None else r.passed)
                ),
                "rejected_good": sorted(
                    r.case_id
                    for r in group.results
                    if r.supervisor_verdict == "rejected" and r.work_passed
                ),
            }
        )
    return out


def per_default_check(runs: dict[tuple[str, str], int]) -> list[list]:
    """Under `defaults`: for each default check, on how many attempts it failed, split by what
    the grader said of the work (a failure on good work is a false rejection), from the checks
    the supervisor stored with its verdict (the newest verdict event of each graded task)."""
    from agents.eval.models import EvalResult
    from tasks.models import TaskEvent
    from tasks.states import EventKind

    counts: dict[str, dict[str, int]] = {}
    for (_model, config), run_id in runs.items():
        if config != "defaults":
            continue
        for result in EvalResult.objects.filter(run_id=run_id, task__isnull=False):
            event = (
                TaskEvent.objects.filter(
                    task_id=result.task_id, kind__in=[EventKind.SUBMITTED, EventKind.REJECTED]
                )
                .order_by("-id")
                .first()
            )
            good = result.work_passed if result.work_passed is not None else result.passed
            for check in event.data.get("checks", []) if event else []:
                if not check.get("default"):
                    continue
                name = check["check"].split("=")[0]
                row = counts.setdefault(name, {"good": 0, "good_failed": 0, "bad_failed": 0})
                row["good"] += 1 if good else 0
                if not check["passed"]:
                    row["good_failed" if good else "bad_failed"] += 1
    return [
        [name, f"{c['good_failed']}/{c['good']}", c["bad_failed"]]
        for name, c in sorted(counts.items())
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default="good,bad,demo")
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--timeout", type=float, default=300)
    args = parser.parse_args()
    models = [m for m in args.models.split(",") if m]
    configs = [c for c in args.configs.split(",") if c]

    db_url = common.recreate_database(DB)
    common.django_on(db_url)
    from agents.models import Connection, Model
    from tests.fakes.eval_model import eval_model_server

    started = time.monotonic()
    with eval_model_server("good") as good, eval_model_server("bad") as bad, DemoServer() as demo:
        urls = {"good": good.url, "bad": bad.url, "demo": demo.url}
        common.truncate_acthelm()
        for name in models:
            common.scripted_connection(urls[name], name=name, context_window=100_000)
        # The model supervisor of `model-down`: a connection nothing listens on.
        down = Connection.objects.create(
            name="down",
            kind="openai_compatible",
            base_url="http://127.0.0.1:9/v1",
            cost_tier="zero_cost",
            timeout_seconds=5,
        )
        Model.objects.create(
            connection=down, name="judge", supports_tools=False, test_status="passed"
        )
        runs = {}
        for name in models:
            for config in configs:
                print(f"… {name} / {config}", flush=True)
                runs[(name, config)] = run_suite(name, config, timeout=args.timeout)
    rows = rows_for(runs)
    table = common.print_table(
        "The supervisor against the grader (false approvals: the grader failed the work and "
        "it reached review; false rejections: the grader passed it and it was rejected)",
        [
            "model",
            "supervisor",
            "grader passed",
            "judged",
            "false approvals",
            "… on expressible cases",
            "false rejections",
            "unverified",
        ],
        [
            [
                r["model"],
                r["supervisor"],
                f"{r['passed']}/{r['graded']}",
                r["judged"],
                r["false_approvals_text"],
                r["false_approvals_expressible_text"],
                r["false_rejections_text"],
                r["unverified"],
            ]
            for r in rows
        ],
    )
    checks = per_default_check(runs)
    if checks:
        common.print_table(
            "Each default check under `defaults` (every model): failed on good work (a false "
            "rejection) / good attempts it ran on, and failed attempts whose work was bad",
            ["default check", "failed on good work", "caught bad work"],
            checks,
        )
    for r in rows:
        if r["let_through"] or r["rejected_good"]:
            print(
                f"{r['model']}/{r['config']}: let through {r['let_through']}; "
                f"rejected good work {r['rejected_good']}"
            )
    common.RESULTS.mkdir(exist_ok=True)
    facts = common.machine()
    (common.RESULTS / "supervisor.json").write_text(
        json.dumps(
            {
                "facts": facts,
                "seconds": round(time.monotonic() - started, 1),
                "rows": rows,
                "table": table,
                "default_checks": checks,
            },
            indent=2,
            default=str,
        )
        + "\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
