"""The evaluation report (selectors: reads only): per connection/model, the pass rate with its
95% Wilson interval, per-case outcomes, turns, tokens, cost and time, each traceable to its task,
beside the same model's real-work figures from the scorecard.

The supervisor is measured against the grader, per supervisor configuration (the runs' own
`supervisor`, e.g. "rules+defaults"): a *false approval* is a graded attempt whose work the grader
failed that the supervisor let into review (approved, or unverified), a *false rejection* one
whose work the grader passed that it rejected; each rate with its 95% Wilson interval, over the
attempts the supervisor judged (a run that stopped at a limit or an error never reaches it).

Skipped cases (the environment could not run them) are listed but not counted. A timeout counts
as a failure. Results of the runs of a model over the same suite (the same case files, by their
sha256) are pooled unless one run is asked for; another suite, or a subset of it, is reported
apart, so numbers over different cases are never mixed.
"""

import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from agents.eval.cases import InvalidCase, load_cases
from agents.eval.grading import expressible
from agents.eval.models import GRADED, EvalOutcome, EvalResult, EvalRun
from agents.scorecard import COST_PLACES, ModelScore, model_scorecard, scorecard_window
from agents.states import Verdict

Z95 = 1.959964


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float] | None:
    """The Wilson score interval of a binomial proportion; None for no trials."""
    if n <= 0:
        return None
    p = successes / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


@dataclass
class CaseStat:
    case_id: str
    results: list[EvalResult] = field(default_factory=list)

    @property
    def graded(self) -> list[EvalResult]:
        return [r for r in self.results if r.outcome in GRADED]

    @property
    def passed(self) -> int:
        return sum(1 for r in self.graded if r.outcome == EvalOutcome.PASSED)

    @property
    def attempts(self) -> int:
        return len(self.graded)

    def as_dict(self) -> dict[str, Any]:
        return {
            "case": self.case_id,
            "passed": self.passed,
            "attempts": self.attempts,
            "results": [result_as_dict(r) for r in self.results],
        }


TO_REVIEW = (Verdict.APPROVED, Verdict.UNVERIFIED)


@dataclass(frozen=True)
class Rate:
    """k of n, with its 95% Wilson interval."""

    k: int
    n: int

    @property
    def rate(self) -> float | None:
        return self.k / self.n if self.n else None

    @property
    def ci95(self) -> tuple[float, float] | None:
        return wilson_interval(self.k, self.n)

    def as_dict(self) -> dict[str, Any]:
        ci = self.ci95
        return {"count": self.k, "of": self.n, "rate": self.rate, "ci95": list(ci) if ci else None}

    def text(self) -> str:
        ci = self.ci95
        if ci is None:  # no attempts
            return "—"
        lo, hi = ci
        return f"{self.k}/{self.n} ({self.k / self.n:.0%}, 95% CI {lo:.0%}–{hi:.0%})"


@dataclass(frozen=True)
class SupervisorStat:
    """The supervisor's verdicts against the grader's, over a group's graded attempts."""

    judged: int
    false_approvals: Rate  # of the judged attempts whose work failed
    false_rejections: Rate  # of the judged attempts whose work passed
    unverified: int
    # False approvals over the cases whose grader is expressible as acceptance checks.
    false_approvals_expressible: Rate

    def as_dict(self) -> dict[str, Any]:
        return {
            "judged": self.judged,
            "false_approvals": self.false_approvals.as_dict(),
            "false_rejections": self.false_rejections.as_dict(),
            "unverified": self.unverified,
            "false_approvals_expressible": self.false_approvals_expressible.as_dict(),
        }


def _work_passed(r: EvalResult) -> bool:
    return r.work_passed if r.work_passed is not None else r.outcome == EvalOutcome.PASSED


def supervisor_stat(results: list[EvalResult], expressible_ids: set[str]) -> SupervisorStat:
    judged = [r for r in results if r.outcome in GRADED and r.supervisor_verdict]
    bad = [r for r in judged if not _work_passed(r)]
    good = [r for r in judged if _work_passed(r)]
    bad_expr = [r for r in bad if r.case_id in expressible_ids]
    let_through = [r for r in bad if r.supervisor_verdict in TO_REVIEW]
    return SupervisorStat(
        judged=len(judged),
        false_approvals=Rate(len(let_through), len(bad)),
        false_rejections=Rate(
            sum(1 for r in good if r.supervisor_verdict == Verdict.REJECTED), len(good)
        ),
        unverified=sum(1 for r in judged if r.supervisor_verdict == Verdict.UNVERIFIED),
        false_approvals_expressible=Rate(
            sum(1 for r in bad_expr if r.supervisor_verdict in TO_REVIEW), len(bad_expr)
        ),
    )


def expressible_case_ids() -> set[str]:
    """The suite's cases whose grader is all acceptance checks (from the case files as they
    are; none when the suite does not load)."""
    try:
        return {c.id for c in load_cases() if expressible(c.expect)}
    except InvalidCase:
        return set()


@dataclass
class ModelEval:
    connection: str
    model: str
    model_id: int | None
    suite_sha256: str
    runs: list[EvalRun]
    cases: list[CaseStat]
    real_work: ModelScore | None = None
    supervisor: str = ""
    supervision: SupervisorStat | None = None

    @property
    def label(self) -> str:
        return f"{self.connection}/{self.model}"

    @property
    def supervisor_label(self) -> str:
        return self.supervisor or "not recorded"

    @property
    def results(self) -> list[EvalResult]:
        return [r for c in self.cases for r in c.results]

    @property
    def graded(self) -> list[EvalResult]:
        return [r for r in self.results if r.outcome in GRADED]

    @property
    def attempts(self) -> int:
        return len(self.graded)

    @property
    def passed(self) -> int:
        return sum(1 for r in self.graded if r.outcome == EvalOutcome.PASSED)

    @property
    def skipped(self) -> int:
        return sum(1 for r in self.results if r.outcome == EvalOutcome.SKIPPED)

    @property
    def timeouts(self) -> int:
        return sum(1 for r in self.results if r.outcome == EvalOutcome.TIMEOUT)

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.attempts if self.attempts else None

    @property
    def interval(self) -> tuple[float, float] | None:
        return wilson_interval(self.passed, self.attempts)

    @property
    def pass_pct(self) -> float | None:
        rate = self.pass_rate
        return None if rate is None else round(100 * rate, 1)

    @property
    def ci_pct(self) -> tuple[float, float] | None:
        interval = self.interval
        if interval is None:
            return None
        lo, hi = interval
        return round(100 * lo, 1), round(100 * hi, 1)

    @property
    def avg_turns(self) -> float | None:
        graded = self.graded
        return round(sum(r.model_turns for r in graded) / len(graded), 2) if graded else None

    @property
    def input_tokens(self) -> int:
        return sum(r.input_tokens for r in self.graded)

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.graded)

    @property
    def cost(self) -> Decimal | None:
        """None when any graded result has no cost (the model has no price): unknown, not 0."""
        graded = self.graded
        costs = [r.cost for r in graded if r.cost is not None]
        if not graded or len(costs) < len(graded):
            return None
        return sum(costs, Decimal(0)).quantize(COST_PLACES)

    @property
    def seconds(self) -> float:
        """Active seconds: the runs' own time (model requests and tools), summed."""
        return round(sum(r.active_seconds for r in self.graded), 1)

    @property
    def avg_seconds(self) -> float | None:
        graded = self.graded
        return round(self.seconds / len(graded), 2) if graded else None

    @property
    def avg_wall_seconds(self) -> float | None:
        """From the task's creation to its settling, waiting for a worker included."""
        graded = self.graded
        if not graded:
            return None
        return round(sum(r.wall_seconds for r in graded) / len(graded), 2)

    def as_dict(self) -> dict[str, Any]:
        interval = self.interval
        return {
            "connection": self.connection,
            "model": self.model,
            "model_id": self.model_id,
            "suite_sha256": self.suite_sha256,
            "supervisor": self.supervisor_label,
            "supervision": self.supervision.as_dict() if self.supervision else None,
            "runs": [
                {
                    "id": r.pk,
                    "status": r.status,
                    "cases_pattern": r.cases_pattern,
                    "repeat": r.repeat,
                    "suite_sha256": r.suite_sha256,
                    "started_at": r.started_at.isoformat(),
                    "finished_at": r.finished_at.isoformat() if r.finished_at else None,
                }
                for r in self.runs
            ],
            "attempts": self.attempts,
            "passed": self.passed,
            "skipped": self.skipped,
            "timeouts": self.timeouts,
            "pass_rate": self.pass_rate,
            "ci95": list(interval) if interval else None,
            "avg_turns": self.avg_turns,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "cost": None if self.cost is None else float(self.cost),
            "seconds": self.seconds,
            "avg_seconds": self.avg_seconds,
            "avg_wall_seconds": self.avg_wall_seconds,
            "cases": [c.as_dict() for c in self.cases],
            "real_work": real_work_as_dict(self.real_work),
        }


def result_as_dict(r: EvalResult) -> dict[str, Any]:
    return {
        "run": r.run_id,
        "repetition": r.repetition,
        "task": r.task_number,
        "outcome": r.outcome,
        "state": r.final_state,
        "failure_code": r.failure_code or None,
        "turns": r.model_turns,
        "input_tokens": r.input_tokens,
        "output_tokens": r.output_tokens,
        "cost": None if r.cost is None else float(r.cost),
        "seconds": r.active_seconds,
        "wall_seconds": r.wall_seconds,
        "failed_checks": [c for c in r.checks if not c.get("passed")],
        "supervisor_verdict": r.supervisor_verdict or None,
        "supervisor_reason": r.supervisor_reason or None,
        "work_passed": r.work_passed,
        "actions": r.actions,
    }


def real_work_as_dict(score: ModelScore | None) -> dict[str, Any] | None:
    if score is None:
        return None
    return {
        "period": "last month",
        "tasks_run": score.tasks_run,
        "approvals": score.approvals,
        "rejections": score.rejections,
        "closed": score.closed,
        "reopened": score.reopened,
        "approved_closed": score.approved_closed,
        "approved_reopened": score.approved_reopened,
        "limit_failures": score.limit_failures,
    }


def eval_report(*, run_id: int | None = None, real_work_period: str = "month") -> list[ModelEval]:
    """Per connection/model, suite and supervisor configuration; pooled over its runs (or one
    run)."""
    chosen = EvalRun.objects.all()
    if run_id is not None:
        chosen = chosen.filter(pk=run_id)
    runs = list(chosen.order_by("id"))
    results = (
        EvalResult.objects.filter(run__in=runs)
        .defer("actions")
        .order_by("case_id", "run_id", "repetition")
    )
    by_run: dict[int, list[EvalResult]] = {}
    for result in results:
        by_run.setdefault(result.run_id, []).append(result)
    groups: dict[tuple[str, str, str, str], ModelEval] = {}
    for run in runs:
        key = (run.connection_name, run.model_name, run.suite_sha256, run.supervisor)
        group = groups.get(key)
        if group is None:
            group = groups[key] = ModelEval(
                connection=run.connection_name,
                model=run.model_name,
                model_id=run.model_id,
                suite_sha256=run.suite_sha256,
                runs=[],
                cases=[],
                supervisor=run.supervisor,
            )
        group.runs.append(run)
        group.model_id = run.model_id or group.model_id
        cases = {c.case_id: c for c in group.cases}
        for result in by_run.get(run.pk, []):
            if result.case_id not in cases:
                cases[result.case_id] = CaseStat(result.case_id)
                group.cases.append(cases[result.case_id])
            cases[result.case_id].results.append(result)
    card = model_scorecard(window=scorecard_window(period=real_work_period))
    # Keyed by int | None: a group without a model finds no real work.
    scores: dict[int | None, ModelScore] = {
        s.model_id: s for s in card.models if s.model_id is not None
    }
    report = []
    expressible_ids = expressible_case_ids() if groups else set()
    for group in groups.values():
        group.cases.sort(key=lambda c: c.case_id)
        group.real_work = scores.get(group.model_id)
        group.supervision = supervisor_stat(group.results, expressible_ids)
        report.append(group)
    # Per model, the suite run most recently first.
    report.sort(key=lambda g: (g.connection, g.model, -g.runs[-1].pk))
    return report


def format_report(report: list[ModelEval]) -> str:
    """The plain-text report of `acthelm_eval report`."""
    if not report:
        return "No evaluation runs yet: run `manage.py acthelm_eval run --connection C --model M`."
    lines = []
    for group in report:
        interval = group.interval
        rate = (
            f"{group.passed}/{group.attempts} passed ({group.pass_rate:.0%}, 95% CI "
            f"{interval[0]:.0%}–{interval[1]:.0%})"
            if interval
            else "no graded attempts"
        )
        cost = "—" if group.cost is None else f"{group.cost:.4f}"
        lines.append(
            f"{group.label} (suite {group.suite_sha256[:8]}, {len(group.cases)} cases): {rate}"
        )
        sup = group.supervision
        if sup is not None:
            lines.append(
                f"  supervisor {group.supervisor_label}: judged {sup.judged}; false approvals "
                f"{sup.false_approvals.text()} (expressible cases "
                f"{sup.false_approvals_expressible.text()}); false rejections "
                f"{sup.false_rejections.text()}; unverified {sup.unverified}"
            )
        lines.append(
            f"  runs {', '.join(str(r.pk) for r in group.runs)}; skipped {group.skipped}; "
            f"timeouts {group.timeouts}; avg turns {group.avg_turns}; tokens "
            f"{group.input_tokens} in / {group.output_tokens} out; cost {cost}; "
            f"active time {group.seconds} s"
        )
        real = group.real_work
        if real is None:
            lines.append("  real work (last month): no runs of this model")
        else:
            lines.append(
                f"  real work (last month): {real.tasks_run} tasks, {real.closed} closed, "
                f"{real.reopened} reopened, {real.rejections} rejected by the supervisor; "
                f"approved runs later closed {real.approved_closed}, reopened "
                f"{real.approved_reopened}"
            )
        for case in group.cases:
            marks = " ".join(
                (f"{r.outcome}:task {r.task_number}" if r.task_number else r.outcome)
                + (f"[{r.supervisor_verdict}]" if r.supervisor_verdict else "")
                for r in case.results
            )
            lines.append(f"  {case.case_id:<28} {case.passed}/{case.attempts}  {marks}")
    return "\n".join(lines)
