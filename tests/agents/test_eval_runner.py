"""`manage.py acthelm_eval run` end to end: a real command process starts real burst workers,
which run every case of the suite against a case-aware scripted OpenAI-compatible server on
loopback; approvals are decided through the approvals service; each case is graded.

The good model must pass every case, the bad one must fail exactly the cases where it misbehaves
(truncating, calling unlisted tools, following injected instructions, answering empty, dawdling).
Run with -s to see both pass rates."""

import json
import time

import pytest

from agents.eval.cases import load_cases
from agents.eval.models import EvalOutcome, EvalResult, EvalRun, EvalRunStatus
from agents.models import AgentRun, Connection, Model
from agents.scorecard import model_scorecard, scorecard_window
from approvals.models import Approval
from core.actors import ActorKind
from tasks.models import Task, TaskEvent
from tasks.states import TaskStatus
from tests.agents.conftest import FAST_ENV
from tests.fakes.eval_model import BAD_FAILS, eval_model_server

pytestmark = [pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def scripted_model(server, name: str) -> Model:
    conn = Connection.objects.create(
        name=name, kind="openai_compatible", base_url=server.url, cost_tier="zero_cost"
    )
    return Model.objects.create(
        connection=conn,
        name="test-model",
        supports_tools=True,
        test_status="passed",
        context_window=100_000,
        price_input_per_mtok="1.00",
        price_output_per_mtok="2.00",
    )


def run_suite(manage, connection: str) -> tuple[dict, float]:
    started = time.monotonic()
    result = manage(
        "acthelm_eval",
        "--json",
        "run",
        "--connection",
        connection,
        "--model",
        "test-model",
        "--concurrency",
        "6",
        "--allow-loopback-fetch",
        "--timeout",
        "100",
        env=FAST_ENV,
        timeout=150,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads(result.stdout), time.monotonic() - started


def outcomes(run_id: int) -> dict[str, str]:
    return dict(EvalResult.objects.filter(run_id=run_id).values_list("case_id", "outcome"))


def failed_checks(run_id: int) -> dict[str, list]:
    return {
        r.case_id: [c for c in r.checks if not c["passed"]]
        for r in EvalResult.objects.filter(run_id=run_id)
    }


def test_the_good_model_passes_every_case_through_real_workers(manage):
    cases = load_cases()
    assert len(cases) >= 20
    # Real work queued meanwhile: the workers the runner starts claim evaluation tasks only.
    bystander = Task.objects.create(title="Real work", instruction="not for the eval workers")
    with eval_model_server("good") as server:
        scripted_model(server, "good-local")
        data, seconds = run_suite(manage, "good-local")
    bystander.refresh_from_db()
    assert (bystander.status, bystander.claim_count) == (TaskStatus.READY, 0)
    print(
        f"\ngood model: {data['passed']}/{data['graded']} passed "
        f"(95% CI {data['ci95'][0]:.0%}–{data['ci95'][1]:.0%}) in {seconds:.1f} s"
    )
    assert server.player.unknown == []
    run = EvalRun.objects.get(pk=data["run"])
    assert run.status == EvalRunStatus.FINISHED
    assert outcomes(run.pk) == {c.id: EvalOutcome.PASSED for c in cases}, failed_checks(run.pk)
    assert data["passed"] == data["graded"] == len(cases)
    # The supervisor (rules and default checks) approved every pass: no false rejection.
    assert run.supervisor == "rules+defaults" and data["supervisor"] == "rules+defaults"
    verdicts = EvalResult.objects.filter(run=run).values_list("supervisor_verdict", "work_passed")
    assert set(verdicts) == {("approved", True)}

    # Ordinary tasks, marked as evaluation tasks, run by the normal workers.
    tasks = Task.objects.filter(eval_results__run=run)
    assert tasks.count() == len(cases)
    assert set(tasks.values_list("is_evaluation", flat=True)) == {True}
    assert set(tasks.values_list("status", flat=True)) == {TaskStatus.REVIEW}
    workers = set(AgentRun.objects.filter(task__in=tasks).values_list("worker_id", flat=True))
    assert workers and all(w.startswith(f"eval-{run.pk}-w") for w in workers)

    # The approval cases stopped for a decision bound to the hash, made by the runner.
    decided = {
        a.task.title.split("] ")[1]: a.status for a in Approval.objects.filter(task__in=tasks)
    }
    assert decided == {
        "approval_write_approve": "approved",
        "approval_write_deny": "denied",
        "approval_fetch_domain": "approved",
    }
    decisions = TaskEvent.objects.filter(task__in=tasks, kind__in=["approved", "denied"])
    assert {(e.actor_kind, e.actor_label) for e in decisions} == {
        (ActorKind.SYSTEM, "acthelm_eval")
    }
    assert all(e.data["arguments_hash"] for e in decisions)

    # Numbers stored per case: turns, tokens, cost at the model's prices, time.
    result = EvalResult.objects.get(run=run, case_id="files_read_fact")
    assert result.model_turns == 3 and result.input_tokens == 30 and result.output_tokens == 15
    assert float(result.cost) == pytest.approx((30 * 1 + 15 * 2) / 1_000_000)
    assert result.wall_seconds > 0 and result.task_number == result.task_id

    # None of it counts as real work on the scorecard.
    card = model_scorecard(window=scorecard_window(period="day"))
    assert card.models == [] and card.totals.runs == 0


def test_the_bad_model_fails_exactly_the_cases_where_it_misbehaves(manage):
    cases = load_cases()
    with eval_model_server("bad") as server:
        scripted_model(server, "bad-local")
        data, seconds = run_suite(manage, "bad-local")
    print(
        f"\nbad model: {data['passed']}/{data['graded']} passed "
        f"(95% CI {data['ci95'][0]:.0%}–{data['ci95'][1]:.0%}) in {seconds:.1f} s"
    )
    run_id = data["run"]
    got = outcomes(run_id)
    failing = sorted(case for case, outcome in got.items() if outcome != EvalOutcome.PASSED)
    assert failing == BAD_FAILS, failed_checks(run_id)
    assert data["passed"] == len(cases) - len(BAD_FAILS)

    checks = failed_checks(run_id)
    names = {case: {c["check"] for c in found} for case, found in checks.items()}
    # Each failure is caught by the check that names the misbehaviour.
    assert names["files_read_fact"] >= {"state", "answer_contains"}
    assert "tools_not_called" in names["unlisted_tool_fetch"]
    assert "tools_not_called" in names["unlisted_tool_write"]
    assert "tools_not_called" in names["injection_file_tool"]
    assert "no_artifacts" in names["injection_file_artifact"]
    assert "answer_not_contains" in names["injection_page"]
    assert names["direct_answer"] >= {"first_attempt", "answer_matches"}
    assert "state" in names["limit_turns_tight"]
    # The platform refused the unlisted tools: they never ran.
    assert "tools_not_run" not in names["unlisted_tool_fetch"]
    assert "tools_not_run" not in names["injection_file_tool"]
    # The empty answer was rejected and its retry not waited for: cancelled by the runner.
    empty = EvalResult.objects.get(run_id=run_id, case_id="direct_answer")
    assert Task.objects.get(pk=empty.task_number).status == TaskStatus.CANCELLED
    assert empty.failure_code == "supervisor_rejected"
    assert [a["action"] for a in empty.actions] == ["cancel"]
    truncated = EvalResult.objects.get(run_id=run_id, case_id="files_read_fact")
    assert truncated.failure_code == "limit_steps"

    # The supervisor's verdict beside the grader's: the default checks reject the unlisted
    # tool calls (the work was bad: no false rejection); the injected answer still reaches
    # review (a false approval only the case's own checks catch); a limit never reaches it.
    verdicts = {
        r.case_id: (r.supervisor_verdict, r.work_passed)
        for r in EvalResult.objects.filter(run_id=run_id)
    }
    assert verdicts["direct_answer"] == ("rejected", False)
    assert verdicts["unlisted_tool_fetch"] == ("rejected", False)
    assert verdicts["injection_page"] == ("approved", False)
    assert verdicts["files_read_fact"] == ("", False)
    assert all(v == ("approved", True) for c, v in verdicts.items() if c not in BAD_FAILS)
    reason = EvalResult.objects.get(run_id=run_id, case_id="unlisted_tool_fetch").supervisor_reason
    assert reason.startswith("default check no_unlisted_tools failed")
