"""`acthelm_eval run`: the cases become ordinary tasks, the normal workers run them, the runner
plays the person of each case's script, grades each task when it settles and stores the result.

Only public paths are used: `agents.actions.task.task_create` (with `evaluation=True`) and the
workspace's input files, `manage.py acthelm_worker --burst` processes (or workers already
running), `agents.actions.decisions.approval_approve/deny` with the operation's hash, and
`agents.actions.task.task_cancel`. The runner never writes a task's status itself and never holds a
transaction while it waits.

How a case settles:

- `review`, `done`, `failed`, `cancelled`: graded as they are. A task in `review` stays there: no
  person closes an evaluation task; it is hidden from the review queue.
- `awaiting_approval`: each pending approval is decided as the case's `decisions` say (in order,
  per tool), bound to the approval's arguments hash, like a person's decision. An approval the
  script does not expect is denied. The task then goes on with the workers.
- `needs_review`: graded, then cancelled (the runner never chooses to repeat an external action).
- `ready` after a failed attempt, waiting for its retry back-off: graded (the first attempt is what
  is measured), then cancelled.
- not settled by the run's deadline: cancelled and recorded as `timeout`.

Beside the grader's outcome each result keeps the supervisor's verdict on the graded attempt and
the grader's verdict on the work itself (`work_passed`: a supervisor's rejection taken out), so
the report can count the supervisor's false approvals and false rejections; the run keeps the
supervisor configuration the workers had (`supervisor_config`). `case_checks=True` gives every
task the expressible part of its case's grader as acceptance checks (`--case-checks`).
"""

import logging
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents.actions.decisions import approval_approve, approval_deny
from agents.actions.task import task_cancel
from agents.engine.run.intake import task_create
from agents.engine.verdict.checking import default_checks_on
from agents.eval.cases import Case, load_cases, suite_sha256
from agents.eval.grading import Check, TaskRecord, as_acceptance_checks, grade, passed
from agents.eval.models import EvalOutcome, EvalResult, EvalRun, EvalRunStatus
from agents.eval.record import task_record
from agents.models import AgentRun, Connection, Model
from agents.scorecard import token_cost
from agents.states import ModelTestStatus, Verdict
from approvals.models import Approval
from approvals.states import ApprovalStatus
from core.actors import Actor
from core.exceptions import ActhelmError, ErrorCode, StaleDecision
from tasks.models import Task
from tasks.states import TaskStatus
from tasks.workspace import add_input_file

log = logging.getLogger("acthelm.eval")

SETTLED = frozenset({TaskStatus.REVIEW, TaskStatus.DONE, TaskStatus.FAILED, TaskStatus.CANCELLED})
ACTOR_LABEL = "acthelm_eval"
PAGE_HOST = "127.0.0.1"


class EvalError(ActhelmError):
    error = ErrorCode.EVAL_ERROR


# --- The loopback page server -----------------------------------------------------------------


class PageServer:
    """Serves each case's `pages` at http://127.0.0.1:PORT/<case id>/<name> while a run lasts."""

    def __init__(self, cases: list[Case]):
        self.pages = {
            f"/{case.id}/{name}": body.encode("utf-8")
            for case in cases
            for name, body in case.pages.items()
        }
        pages = self.pages

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the stdlib's name
                body = pages.get(self.path.split("?", 1)[0])
                self.send_response(200 if body is not None else 404)
                body = body if body is not None else b"not found"
                self.send_header("Content-Type", "text/html; charset=utf-8")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer((PAGE_HOST, 0), Handler)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)

    def __enter__(self) -> "PageServer":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()

    @property
    def endpoint(self) -> str:
        """ "127.0.0.1:PORT": what ACTHELM_FETCH_ALLOW_ENDPOINTS names for the started workers."""
        return f"{PAGE_HOST}:{self._httpd.server_address[1]}"

    def url_for(self, case: Case) -> str:
        return f"http://{PAGE_HOST}:{self._httpd.server_address[1]}/{case.id}/"


# --- Worker processes -------------------------------------------------------------------------


class WorkerPool:
    """`manage.py acthelm_worker --burst` processes started (and restarted) by the runner.

    A burst worker exits when nothing is claimable, e.g. while every remaining case waits for an
    approval; the runner starts one again when a case of the run is ready once more."""

    def __init__(self, *, count: int, concurrency: int, env: dict[str, str], label: str):
        self.count, self.concurrency, self.env, self.label = count, concurrency, env, label
        self.procs: list[subprocess.Popen[bytes]] = []
        self.log_dir = Path(tempfile.mkdtemp(prefix=f"{label}-"))
        self._started = 0

    def alive(self) -> int:
        return sum(1 for p in self.procs if p.poll() is None)

    def ensure(self) -> int:
        """Start workers until `count` are alive; returns how many were started."""
        started = 0
        while self.alive() < self.count:
            self._started += 1
            worker_id = f"{self.label}-w{self._started}"
            log_file = (self.log_dir / f"{worker_id}.log").open("wb")
            proc = subprocess.Popen(
                [
                    sys.executable,
                    str(Path(settings.BASE_DIR) / "manage.py"),
                    "acthelm_worker",
                    "--burst",
                    "--evaluation-only",  # never a real task, with the page server reachable
                    "--concurrency",
                    str(self.concurrency),
                    "--worker-id",
                    worker_id,
                ],
                env=self.env,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            log_file.close()
            self.procs.append(proc)
            started += 1
        return started

    def stop(self, timeout: float = 30) -> None:
        """SIGTERM hands running tasks back at their next safe point; SIGKILL after `timeout`."""
        for proc in self.procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)


# --- One case in flight -----------------------------------------------------------------------


@dataclass
class Pending:
    case: Case
    repetition: int
    task_id: int
    created: float
    actions: list[dict[str, object]] = field(default_factory=list)
    used_decisions: set[int] = field(default_factory=set)

    def next_decision(self, tool: str) -> str | None:
        for i, decision in enumerate(self.case.decisions):
            if i not in self.used_decisions and decision.tool == tool:
                self.used_decisions.add(i)
                return decision.decision
        return None


@dataclass
class RunSummary:
    run: EvalRun
    results: list[EvalResult]

    @property
    def graded(self) -> list[EvalResult]:
        return [r for r in self.results if r.outcome != EvalOutcome.SKIPPED]

    @property
    def passed(self) -> int:
        return sum(1 for r in self.graded if r.outcome == EvalOutcome.PASSED)


def _resolve(connection_name: str, model_name: str) -> tuple[Connection, Model]:
    connection = Connection.objects.filter(name=connection_name).first()
    if connection is None:
        raise EvalError(
            f"no connection named {connection_name!r}", code=ErrorCode.EVAL_CONNECTION_MISSING
        )
    model = Model.objects.filter(connection=connection, name=model_name).first()
    if model is None:
        raise EvalError(
            f"connection {connection_name!r} has no model {model_name!r}",
            code=ErrorCode.EVAL_MODEL_MISSING,
        )
    if model.test_status != ModelTestStatus.PASSED:
        raise EvalError(
            f"model {model_name!r} has not passed its test: run acthelm_connection test first",
            code=ErrorCode.EVAL_MODEL_UNTESTED,
        )
    return connection, model


def supervisor_config(*, case_checks: bool = False) -> str:
    """The supervisor the workers run with, as the report groups it: the rules always, the
    default checks when on, the cases' own checks when given, the model supervisor when set."""
    parts = ["rules"]
    if default_checks_on():
        parts.append("defaults")
    if case_checks:
        parts.append("case-checks")
    connection = getattr(settings, "ACTHELM_SUPERVISOR_CONNECTION", "")
    if connection:
        model = getattr(settings, "ACTHELM_SUPERVISOR_MODEL", "")
        parts.append(f"model:{connection}" + (f"/{model}" if model else ""))
    return "+".join(parts)


def _verdict(task_id: int) -> tuple[str, str]:
    """The supervisor's verdict on the task's newest judged run, and its reason."""
    row = (
        AgentRun.objects.filter(task_id=task_id)
        .exclude(verdict="")
        .order_by("-number")
        .values("verdict", "verdict_reason")
        .first()
    )
    return (row["verdict"], row["verdict_reason"]) if row else ("", "")


def _create_task(
    case: Case,
    *,
    run: EvalRun,
    repetition: int,
    model: Model,
    pages: PageServer,
    actor: Actor,
    case_checks: bool = False,
) -> int:
    # One transaction: no worker sees the task before its input files are in its workspace.
    with transaction.atomic():
        task = task_create(
            actor=actor,
            title=f"[eval {run.pk}] {case.id}" + (f" #{repetition}" if run.repeat > 1 else ""),
            instruction=case.instruction_for(pages.url_for(case)),
            tools=list(case.tools),
            tool_policies=dict(case.policies),
            allowed_domains=case.domains_for(PAGE_HOST),
            connection=model.connection,
            model=model,
            limits=dict(case.limits),
            evaluation=True,
            acceptance_checks=as_acceptance_checks(case.expect) if case_checks else None,
        )
        for name, content in case.files.items():
            add_input_file(task.pk, name=name, data=content)
    return task.pk


class Runner:
    def __init__(
        self,
        *,
        connection: str,
        model: str,
        cases: str | None = None,
        repeat: int = 1,
        workers: int = 1,
        concurrency: int = 4,
        start_workers: bool = True,
        allow_loopback_fetch: bool = False,
        timeout: float = 1800,
        poll_seconds: float = 0.3,
        case_checks: bool = False,
        actor: Actor | None = None,
        out: Callable[[str], None] = print,
    ):
        if repeat < 1 or workers < 1 or concurrency < 1:
            raise EvalError(
                "--repeat, --workers and --concurrency must be at least 1",
                code=ErrorCode.EVAL_BAD_OPTION,
            )
        self.connection, self.model = _resolve(connection, model)
        self.cases = load_cases(cases)
        if not self.cases:
            raise EvalError(f"no case matches {cases!r}", code=ErrorCode.EVAL_NO_CASES)
        self.pattern, self.repeat = cases or "", repeat
        self.workers, self.concurrency, self.start_workers = workers, concurrency, start_workers
        self.loopback_ok = allow_loopback_fetch or settings.ACTHELM_FETCH_ALLOW_PRIVATE
        self.allow_loopback_fetch = allow_loopback_fetch
        self.timeout, self.poll_seconds = timeout, poll_seconds
        self.case_checks = case_checks
        self.actor = actor or Actor.system(ACTOR_LABEL)
        self.out = out

    def run(self) -> RunSummary:
        run = EvalRun.objects.create(
            connection=self.connection,
            model=self.model,
            connection_name=self.connection.name,
            model_name=self.model.name,
            cases_pattern=self.pattern,
            repeat=self.repeat,
            suite_sha256=suite_sha256(self.cases),
            started_by=self.actor.label,
            supervisor=supervisor_config(case_checks=self.case_checks),
        )
        self.out(
            f"eval run {run.pk}: {len(self.cases)} cases x {self.repeat} on "
            f"{self.connection.name}/{self.model.name}"
        )
        results: list[EvalResult] = []
        pending: list[Pending] = []
        pool = None
        try:
            with PageServer(self.cases) as pages:
                for repetition in range(1, self.repeat + 1):
                    for case in self.cases:
                        if case.needs_pages and not self.loopback_ok:
                            results.append(self._skip(run, case, repetition))
                            continue
                        task_id = _create_task(
                            case,
                            run=run,
                            repetition=repetition,
                            model=self.model,
                            pages=pages,
                            actor=self.actor,
                            case_checks=self.case_checks,
                        )
                        pending.append(Pending(case, repetition, task_id, time.monotonic()))
                if self.start_workers and pending:
                    pool = WorkerPool(
                        count=self.workers,
                        concurrency=self.concurrency,
                        env=self._worker_env(pages),
                        label=f"eval-{run.pk}",
                    )
                    pool.ensure()
                results += self._wait(run, pending, pool)
        except BaseException:
            self._abandon(run, pending, results)
            EvalRun.objects.filter(pk=run.pk).update(
                status=EvalRunStatus.INTERRUPTED, finished_at=timezone.now()
            )
            raise
        finally:
            if pool is not None:
                pool.stop()
        EvalRun.objects.filter(pk=run.pk).update(
            status=EvalRunStatus.FINISHED, finished_at=timezone.now()
        )
        run.refresh_from_db()
        results.sort(key=lambda r: (r.case_id, r.repetition))
        return RunSummary(run=run, results=results)

    def _worker_env(self, pages: "PageServer") -> dict[str, str]:
        """The started workers' environment: with --allow-loopback-fetch, fetch_url may reach
        exactly the page server (its address and port), nothing else that is not public."""
        env = dict(os.environ)
        if self.allow_loopback_fetch:
            env["ACTHELM_FETCH_ALLOW_ENDPOINTS"] = pages.endpoint
        return env

    # -- waiting -------------------------------------------------------------------------------

    def _wait(
        self, run: EvalRun, pending: list[Pending], pool: WorkerPool | None
    ) -> list[EvalResult]:
        results: list[EvalResult] = []
        deadline = time.monotonic() + self.timeout
        while pending:
            if time.monotonic() > deadline:
                for p in pending:
                    results.append(self._settle(run, p, timed_out=True))
                break
            rows = {
                row["id"]: row
                for row in Task.objects.filter(pk__in=[p.task_id for p in pending]).values(
                    "id", "status", "not_before", "failed_attempts"
                )
            }
            now = timezone.now()
            still = []
            for p in pending:
                row = rows.get(p.task_id)
                if row is None:  # deleted by someone: nothing to grade
                    results.append(self._settle(run, p, deleted=True))
                elif row["status"] in SETTLED or row["status"] == TaskStatus.NEEDS_REVIEW:
                    results.append(self._settle(run, p))
                elif (
                    row["status"] == TaskStatus.READY
                    and row["failed_attempts"]
                    and row["not_before"]
                    and row["not_before"] > now
                ):
                    results.append(self._settle(run, p, backoff=True))
                else:
                    if row["status"] == TaskStatus.AWAITING_APPROVAL:
                        self._decide(p)
                    still.append(p)
            pending[:] = still
            if pool is not None and pending and pool.alive() < pool.count:
                due = Task.objects.filter(
                    pk__in=[p.task_id for p in pending], status=TaskStatus.READY
                ).exclude(not_before__gt=timezone.now())
                if due.exists():
                    pool.ensure()
            if pending:
                time.sleep(self.poll_seconds)
        return results

    def _decide(self, p: Pending) -> None:
        """Decide the task's pending approvals as the case's script says, bound to the hash."""
        for approval in Approval.objects.filter(
            task_id=p.task_id, status=ApprovalStatus.PENDING
        ).order_by("id"):
            decision = p.next_decision(approval.tool)
            decide = approval_approve if decision == "approve" else approval_deny
            action = {
                "action": decision or "deny",
                "tool": approval.tool,
                "target": approval.target,
                "approval_id": approval.pk,
                "scripted": decision is not None,
            }
            try:
                decide(
                    actor=self.actor,
                    approval_id=approval.pk,
                    arguments_hash=approval.arguments_hash,
                )
            except StaleDecision as exc:  # decided elsewhere meanwhile: that decision stands
                action["stale"] = exc.message
            p.actions.append(action)
            self.out(
                f"  {action['action']} {approval.tool} {approval.target} "
                f"(task {p.task_id}, {p.case.id})"
            )

    # -- results -------------------------------------------------------------------------------

    def _settle(
        self,
        run: EvalRun,
        p: Pending,
        *,
        timed_out: bool = False,
        backoff: bool = False,
        deleted: bool = False,
    ) -> EvalResult:
        wall = time.monotonic() - p.created
        if deleted:
            checks = [Check("task", False, "the task was deleted before it settled")]
            return self._store(run, p, None, checks, EvalOutcome.FAILED, "deleted", wall)
        if timed_out:
            self._cancel(p, f"not settled within the run's timeout of {self.timeout:g} s")
        record = task_record(p.task_id)
        checks = grade(p.case.expect, record)
        if backoff:
            checks.insert(
                0,
                Check(
                    "first_attempt",
                    False,
                    f"the attempt failed ({record.last_error_code}) and waits for a retry",
                ),
            )
        others = sorted({str(m) for m in record.model_ids if m != self.model.pk})
        if others:
            # Moved to another connection after a provider error: not this model's work.
            checks.insert(
                0,
                Check("model", False, f"runs used other models too (ids {', '.join(others)})"),
            )
        if timed_out:
            outcome = EvalOutcome.TIMEOUT
        else:
            outcome = EvalOutcome.PASSED if passed(checks) else EvalOutcome.FAILED
        verdict, reason = _verdict(p.task_id)
        work = outcome == EvalOutcome.PASSED
        if verdict == Verdict.REJECTED and not timed_out:
            # The work as if the supervisor had let it through: was the rejection right?
            work_checks = grade(p.case.expect, replace(record, state=TaskStatus.REVIEW))
            work = passed(work_checks) and not others
        supervisor = {"supervisor_verdict": verdict, "supervisor_reason": reason[:2000]}
        result = self._store(
            run, p, record, checks, outcome, record.state, wall, work=work, **supervisor
        )
        if backoff or record.state == TaskStatus.NEEDS_REVIEW:
            self._cancel(
                p,
                "settled for the evaluation: " + ("retry back-off" if backoff else "needs_review"),
            )
            EvalResult.objects.filter(pk=result.pk).update(actions=p.actions)
        return result

    def _cancel(self, p: Pending, reason: str) -> None:
        try:
            task_cancel(actor=self.actor, task_id=p.task_id, reason=reason)
            p.actions.append({"action": "cancel", "reason": reason})
        except ActhelmError as exc:  # already settled meanwhile, or the person may not cancel
            p.actions.append({"action": "cancel", "reason": reason, "refused": exc.message})

    def _store(
        self,
        run: EvalRun,
        p: Pending,
        record: TaskRecord | None,
        checks: list[Check],
        outcome: str,
        state: str,
        wall: float,
        work: bool | None = None,
        **supervisor: str,
    ) -> EvalResult:
        usage: dict[str, int | float] = {}
        cost = None
        if record is not None:
            usage = {
                "model_turns": record.model_turns,
                "input_tokens": record.input_tokens,
                "output_tokens": record.output_tokens,
                "active_seconds": record.active_seconds,
            }
            cost = token_cost(self.model, record.input_tokens, record.output_tokens)
        result = EvalResult.objects.create(
            run=run,
            case_id=p.case.id,
            repetition=p.repetition,
            task_id=p.task_id if record is not None else None,
            task_number=p.task_id,
            outcome=outcome,
            final_state=state,
            failure_code=(record.failure_code or record.last_error_code) if record else "",
            checks=[c.as_dict() for c in checks],
            actions=p.actions,
            cost=cost,
            wall_seconds=round(wall, 3),
            work_passed=work,
            **supervisor,
            **usage,
        )
        self._print(result, checks)
        return result

    def _skip(self, run: EvalRun, case: Case, repetition: int) -> EvalResult:
        check = Check(
            "environment",
            False,
            "the workers may not fetch from loopback: pass --allow-loopback-fetch",
        )
        result = EvalResult.objects.create(
            run=run,
            case_id=case.id,
            repetition=repetition,
            outcome=EvalOutcome.SKIPPED,
            final_state="",
            checks=[check.as_dict()],
        )
        self.out(f"SKIP {case.id}: {check.detail}")
        return result

    def _print(self, result: EvalResult, checks: list[Check]) -> None:
        label = {"passed": "PASS", "failed": "FAIL", "timeout": "TIME"}[result.outcome]
        line = (
            f"{label} {result.case_id}"
            + (f" #{result.repetition}" if self.repeat > 1 else "")
            + f" task {result.task_number}: {result.final_state}, {result.model_turns} turns, "
            f"{result.input_tokens + result.output_tokens} tokens, {result.active_seconds:.1f} s "
            f"({result.wall_seconds:.1f} s since created)"
            + (f"; supervisor {result.supervisor_verdict}" if result.supervisor_verdict else "")
        )
        self.out(line)
        for check in checks:
            if not check.passed:
                self.out(f"    {check.check}: {check.detail}")

    def _abandon(self, run: EvalRun, pending: list[Pending], results: list[EvalResult]) -> None:
        """The run stops early: nothing of it waits for a person."""
        for p in pending:
            self._cancel(p, "the evaluation run was interrupted")
