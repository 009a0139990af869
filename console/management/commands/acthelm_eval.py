"""acthelm_eval run|report|cases — the graded task suite (see docs/eval.md)."""

from agents.eval.cases import load_cases
from agents.eval.report import eval_report, format_report, wilson_interval
from agents.eval.runner import Runner
from console.cli import ActionCommand, Actions, Options, emit, person_actor


class Command(ActionCommand):
    help = "Run the graded task suite on a connection/model, and report pass rates."

    def add_actions(self, sub: Actions) -> None:
        run = sub.add_parser("run", help="create the cases as tasks, let workers run them, grade")
        run.add_argument("--connection", required=True)
        run.add_argument("--model", required=True)
        run.add_argument("--cases", default="", help="case ids, shell patterns, comma-separated")
        run.add_argument("--repeat", type=int, default=1, help="run every case N times")
        run.add_argument(
            "--workers", type=int, default=1, help="burst worker processes to start (default 1)"
        )
        run.add_argument(
            "--concurrency", type=int, default=4, help="tasks each started worker runs at once"
        )
        run.add_argument(
            "--no-worker",
            action="store_true",
            help="start no worker: workers already running take the cases",
        )
        run.add_argument(
            "--allow-loopback-fetch",
            action="store_true",
            help="let the started workers fetch the runner's page server, that address and "
            "port only (sets ACTHELM_FETCH_ALLOW_ENDPOINTS for them; they claim evaluation tasks "
            "only); without it the fetch cases are skipped unless this process's settings allow "
            "private networks",
        )
        run.add_argument(
            "--timeout",
            type=float,
            default=1800,
            help="seconds until unsettled cases are cancelled",
        )
        run.add_argument(
            "--user", help="decide approvals as this person (default: the acthelm_eval system)"
        )
        run.add_argument(
            "--case-checks",
            action="store_true",
            help="give each task its case's grader checks that are expressible as acceptance "
            "checks (measures the supervisor with a person's checks)",
        )
        report = sub.add_parser("report", help="pass rates per connection/model")
        report.add_argument("--run", type=int, default=None, help="only this evaluation run")
        sub.add_parser("cases", help="list the suite's cases")

    def do_run(self, opts: Options) -> None:
        as_json = opts["json"]
        runner = Runner(
            connection=opts["connection"],
            model=opts["model"],
            cases=opts["cases"] or None,
            repeat=opts["repeat"],
            workers=opts["workers"],
            concurrency=opts["concurrency"],
            start_workers=not opts["no_worker"],
            allow_loopback_fetch=opts["allow_loopback_fetch"],
            timeout=opts["timeout"],
            case_checks=opts["case_checks"],
            actor=person_actor(opts["user"]) if opts["user"] else None,
            out=(lambda line: None) if as_json else self._line,
        )
        summary = runner.run()
        graded, passed = len(summary.graded), summary.passed
        interval = wilson_interval(passed, graded)
        data = {
            "ok": True,
            "run": summary.run.pk,
            "connection": summary.run.connection_name,
            "model": summary.run.model_name,
            "supervisor": summary.run.supervisor,
            "passed": passed,
            "graded": graded,
            "skipped": len(summary.results) - graded,
            "pass_rate": passed / graded if graded else None,
            "ci95": list(interval) if interval else None,
            "results": [
                {
                    "case": r.case_id,
                    "repetition": r.repetition,
                    "task": r.task_number,
                    "outcome": r.outcome,
                    "state": r.final_state,
                    "supervisor_verdict": r.supervisor_verdict or None,
                    "work_passed": r.work_passed,
                    "turns": r.model_turns,
                    "tokens": r.input_tokens + r.output_tokens,
                    "seconds": r.active_seconds,
                    "wall_seconds": r.wall_seconds,
                }
                for r in summary.results
            ],
        }
        text = f"eval run {summary.run.pk}: {passed}/{graded} passed"
        if interval:
            text += f" ({passed / graded:.0%}, 95% CI {interval[0]:.0%}–{interval[1]:.0%})"
        if data["skipped"]:
            text += f", {data['skipped']} skipped"
        emit(self, data, as_json=as_json, text=text)

    def _line(self, line: str) -> None:
        self.stdout.write(line)
        self.stdout.flush()

    def do_report(self, opts: Options) -> None:
        report = eval_report(run_id=opts["run"])
        emit(
            self,
            {"ok": True, "models": [m.as_dict() for m in report]},
            as_json=opts["json"],
            text=format_report(report),
        )

    def do_cases(self, opts: Options) -> None:
        cases = load_cases()
        rows = [
            {"id": c.id, "title": c.title, "tools": list(c.tools), "checks": sorted(c.expect)}
            for c in cases
        ]
        text = "\n".join(f"{c.id:<28} {c.title}" for c in cases)
        emit(self, rows, as_json=opts["json"], text=text)
