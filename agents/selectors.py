"""Reads for the console, the CLI and the API that reach past the ledger into runs and turns."""

import mimetypes
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any, TypedDict

from django.db.models import (
    BooleanField,
    Case,
    Count,
    DecimalField,
    F,
    IntegerField,
    OuterRef,
    Prefetch,
    Q,
    QuerySet,
    Subquery,
    Sum,
    Value,
    When,
)
from django.db.models.functions import Coalesce, Left, Length

from agents.engine.run.usage import Usage, task_usage
from agents.failure_codes import FailureCode, failure_words
from agents.models import AgentRun, Artifact, ToolCall, Turn
from agents.states import Role, RunState, RunStatus, Verdict, run_state
from approvals.models import Approval, ReviewDecision
from approvals.states import ApprovalStatus, ReviewChoice
from core.actors import ActorKind
from core.exceptions import InvalidInput
from core.numbers import money_text
from tasks.models import Task, TaskEvent
from tasks.selectors import event_as_dict, task_as_dict, timeline_page, transcript_page
from tasks.states import EventKind
from tasks.workspace import (
    InputFile,
    artifacts_dir,
    list_input_files,
    safe_file_name,
    workspace_dir,
)

# Types a browser could run as a page: a task's file is served as plain text instead.
ACTIVE_TYPES = ("html", "xml", "javascript", "ecmascript", "svg")


@dataclass(frozen=True)
class TaskFile:
    """One of a task's files on disk, found by name inside its own folder (never through a
    symlink), with a content type that is safe to serve."""

    name: str
    path: Path
    content_type: str
    kind: str  # "artifact" | "input"


def _safe_type(content_type: str) -> str:
    content_type = (content_type or "").split(";")[0].strip().lower() or "text/plain"
    if any(word in content_type for word in ACTIVE_TYPES):
        content_type = "text/plain"
    if content_type.startswith("text/"):
        content_type += "; charset=utf-8"
    return content_type


def _inside(folder: Path, name: str) -> Path | None:
    folder = folder.resolve()
    path = folder / name
    if path.is_symlink() or not path.is_file() or path.resolve().parent != folder:
        return None
    return path


def task_file(task_id: int, name: str, *, kind: str) -> TaskFile | None:
    """The task's artifact (kind "artifact") or input file (kind "input") called `name`, or None
    when it has none by that name (or its file is gone)."""
    try:
        name = safe_file_name(name)
    except InvalidInput:
        return None
    if kind == "artifact":
        artifact = Artifact.objects.filter(task_id=task_id, name=name).first()
        if artifact is None:
            return None
        path = _inside(artifacts_dir(task_id, create=False), name)
        content_type = artifact.content_type
    else:
        path = _inside(workspace_dir(task_id, create=False), name)
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
    if path is None:
        return None
    return TaskFile(name=name, path=path, content_type=_safe_type(content_type), kind=kind)


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None


class AcceptedDict(TypedDict):
    """A person's acceptance of a rejected run into review (the `accepted` event)."""

    by: str
    at: str | None
    reason: str


ACCEPTED = "accepted"  # the verdict a person's acceptance shows over the supervisor's rejection


@dataclass(frozen=True)
class ShownVerdict:
    """A run's verdict as every door shows it (the console's review queue, Runs table, result
    panel; `acthelm_task show`; the API): the supervisor's, or — once a person accepted the run
    the supervisor rejected — the person's, who and why. `code` is a `Verdict` value or
    `ACCEPTED`; `words` the one line a person reads."""

    code: str
    words: str
    reason: str
    by: str
    supervisor: str  # the supervisor's own verdict (`Verdict`)
    accepted: AcceptedDict | None = None


def _reason_without_verdict(verdict: str, reason: str) -> str:
    """The supervisor's reason without a leading "approved:" that would repeat the verdict."""
    reason = reason.strip()
    head = f"{verdict}:"
    return reason[len(head) :].strip() if reason.lower().startswith(head) else reason


def shown_verdict(
    verdict: str, reason: str, accepted: TaskEvent | AcceptedDict | None = None
) -> ShownVerdict | None:
    """The one place a verdict becomes words (None when the run has none). `accepted` is the
    `accepted` event of that run (or its dict), when a person accepted it into review."""
    if not verdict:
        return None
    if accepted is not None:
        if isinstance(accepted, TaskEvent):
            data = accepted.data if isinstance(accepted.data, dict) else {}
            accepted = {
                "by": accepted.actor_label or "a person",
                "at": _iso(accepted.created_at),
                "reason": str(data.get("reason", "")),
            }
        words = f"accepted by {accepted['by']}"
        words += f": {accepted['reason']}" if accepted["reason"] else ""
        return ShownVerdict(
            code=ACCEPTED,
            words=words,
            reason=accepted["reason"],
            by=accepted["by"],
            supervisor=verdict,
            accepted=accepted,
        )
    label = str(Verdict(verdict).label).lower() if verdict in Verdict.values else verdict
    reason = _reason_without_verdict(verdict, reason or "")
    words = f"{label} by the supervisor" + (f": {reason}" if reason else "")
    return ShownVerdict(
        code=verdict, words=words, reason=reason, by="the supervisor", supervisor=verdict
    )


def accepted_events(task_ids: Iterable[int]) -> dict[int, TaskEvent]:
    """The `accepted` event of each run a person accepted into review, by run id (one query)."""
    events = TaskEvent.objects.filter(
        task_id__in=list(task_ids), kind=EventKind.ACCEPTED, run__isnull=False
    ).order_by("id")
    return {e.run_id: e for e in events if e.run_id is not None}


class RunDict(TypedDict):
    """A run as the API's task document and `acthelm_task show` publish it."""

    id: int
    number: int
    attempt: int
    failed_attempt: bool
    status: str
    state: str
    worker_id: str
    connection: str | None
    model: str | None
    started_at: str | None
    finished_at: str | None
    duration_seconds: float | None
    model_turns: int
    input_tokens: int
    output_tokens: int
    network_requests: int
    active_seconds: float
    cost: str | None
    verdict: str | None
    verdict_reason: str | None
    # The verdict as a person reads it: the supervisor's, or the person's who accepted the run
    # over the supervisor's rejection ("accepted by founder: the bullets are right").
    verdict_shown: str | None
    verdict_words: str | None
    accepted: AcceptedDict | None
    error_code: str | None
    error_words: str | None
    error_message: str | None
    answer: str | None


@dataclass(frozen=True)
class RunFacts:
    """What a person reads of a run, computed once for the console's Runs table and the API:
    the attempt it belongs to, its own state word, how long it took, what it cost (None when a
    model turn of the run had no known price) and why it failed, in plain words."""

    run: AgentRun
    # A run that fails is a failed attempt (ACTHELM_MAX_ATTEMPTS counts them); one that stops
    # for a pause, an approval or a hand-back is not, and the next run goes on with its attempt.
    attempt: int
    failed_attempt: bool
    state: RunState
    duration_seconds: float | None  # None while it runs
    cost: Decimal | None
    error_words: str
    verdict: ShownVerdict | None = None

    @property
    def state_label(self) -> str:
        return str(self.state.label)


def task_runs(task_id: int) -> QuerySet[AgentRun]:
    """A task's runs, oldest first, with their model and connection and the number of their
    model turns of unknown cost (`unknown_cost_turns`), in one query."""
    unknown = (
        Turn.objects.filter(run=OuterRef("pk"), role=Role.ASSISTANT, cost__isnull=True)
        .order_by()
        .values("run")
        .annotate(n=Count("id"))
        .values("n")
    )
    return (
        AgentRun.objects.filter(task_id=task_id)
        .select_related("model__connection")
        .annotate(unknown_cost_turns=Coalesce(Subquery(unknown, output_field=IntegerField()), 0))
        .order_by("number")
    )


def is_failed_attempt(run: AgentRun) -> bool:
    """The run failed and its failure counts as an attempt (as `agents.engine.verdict.decide`
    counts)."""
    if run.status != RunStatus.FAILED:
        return False
    known = FailureCode.known(run.error_code)
    return known is None or known.is_attempt


def task_run_facts(task_id: int) -> list[RunFacts]:
    """The facts of a task's runs, oldest first, in one query. Attempts are numbered over the
    task's life: from 1, one more after each failed attempt. A person's retry (which gives the
    task its attempts again) or retry now does not number them afresh: the run after a
    rejected one is the next attempt."""
    facts: list[RunFacts] = []
    attempt = 1
    accepted = accepted_events([task_id])
    for run in task_runs(task_id):
        failed = is_failed_attempt(run)
        facts.append(
            _run_facts(run, attempt=attempt, failed_attempt=failed, accepted=accepted.get(run.pk))
        )
        attempt += failed
    return facts


def _run_facts(
    run: AgentRun, *, attempt: int, failed_attempt: bool, accepted: TaskEvent | None = None
) -> RunFacts:
    duration = None
    if run.finished_at is not None and run.started_at is not None:
        duration = max(0.0, (run.finished_at - run.started_at).total_seconds())
    unknown = getattr(run, "unknown_cost_turns", 0) or 0
    return RunFacts(
        run=run,
        attempt=attempt,
        failed_attempt=failed_attempt,
        state=run_state(run.status, run.error_code),
        duration_seconds=duration,
        cost=None if unknown else run.cost,
        error_words=failure_words(run.error_code) if run.error_code else "",
        verdict=shown_verdict(run.verdict, run.verdict_reason, accepted),
    )


class ArtifactDict(TypedDict):
    id: int
    name: str
    size: int
    sha256: str
    content_type: str


def run_as_dict(facts: RunFacts) -> RunDict:
    """A run as JSON, for the API's task and `acthelm_task show` (`task_run_facts`)."""
    run = facts.run
    return {
        "id": run.pk,
        "number": run.number,
        "attempt": facts.attempt,
        "failed_attempt": facts.failed_attempt,
        "status": run.status,
        "state": facts.state.value,
        "worker_id": run.worker_id,
        "connection": run.model.connection.name if run.model is not None else None,
        "model": run.model.name if run.model is not None else None,
        "started_at": _iso(run.started_at),
        "finished_at": _iso(run.finished_at),
        "duration_seconds": facts.duration_seconds,
        "model_turns": run.model_turns,
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
        "network_requests": run.network_requests,
        "active_seconds": run.active_seconds,
        "cost": money_text(facts.cost),
        "verdict": run.verdict or None,
        "verdict_reason": run.verdict_reason or None,
        "verdict_shown": facts.verdict.code if facts.verdict else None,
        "verdict_words": facts.verdict.words if facts.verdict else None,
        "accepted": facts.verdict.accepted if facts.verdict else None,
        "error_code": run.error_code or None,
        "error_words": facts.error_words or None,
        "error_message": run.error_message or None,
        "answer": run.answer or None,
    }


def artifact_as_dict(artifact: Artifact) -> ArtifactDict:
    return {
        "id": artifact.pk,
        "name": artifact.name,
        "size": artifact.size,
        "sha256": artifact.sha256,
        "content_type": artifact.content_type,
    }


def task_result(read: "TaskRead") -> dict[str, Any]:
    """What a task produced: the newest answer and verdict, its artifacts and input files."""
    answer_run, verdict = read.answer_run, read.verdict_run
    verdict_run = verdict.run if verdict else None
    shown = verdict.verdict if verdict else None
    return {
        "answer": answer_run.answer if answer_run else None,
        "verdict": verdict_run.verdict if verdict_run else None,
        "verdict_reason": verdict_run.verdict_reason or None if verdict_run else None,
        "verdict_shown": shown.code if shown else None,
        "verdict_words": shown.words if shown else None,
        "artifacts": [artifact_as_dict(a) for a in read.artifacts],
        "input_files": read.input_files,
    }


def task_cost_subquery() -> Subquery:
    """The sum of a task's turn costs, for ``.annotate()`` on a page of tasks: one query for
    the page, whatever its size (turns are found through the (task, index) unique index).
    None when no turn has a known cost."""
    total = (
        Turn.objects.filter(task=OuterRef("pk"), cost__isnull=False)
        .order_by()
        .values("task")
        .annotate(total=Sum("cost"))
        .values("total")
    )
    return Subquery(total, output_field=DecimalField(max_digits=16, decimal_places=8))


def task_with_history(read: "TaskRead") -> dict[str, Any]:
    """`task_as_dict` with what the task used, its timeline and its runs (`acthelm_task show`):
    the task and its runs as the API shows them; `usage` is `Usage.as_dict` with the cost, where
    the API's task document publishes four counters, and `events` is the timeline read (the
    whole of it for the CLI, where the API pages it)."""
    data = task_as_dict(read.task)
    usage = read.usage
    data["cost"] = money_text(usage.cost)
    data["usage"] = usage.as_dict() | {"cost": money_text(usage.cost)}
    data["events"] = [event_as_dict(e) for e in read.events]
    data["runs"] = [run_as_dict(f) for f in read.runs]
    return data


# --- The supervisor's rejection, for a person to overrule -------------------------------------

TASK_CHECK = "task check"
DEFAULT_CHECK = "default check"


class FailedCheck(TypedDict):
    """An acceptance check that failed a run: its text form, why, and whose check it is."""

    check: str
    detail: str
    source: str  # TASK_CHECK (the task's own acceptance checks) or DEFAULT_CHECK


def failed_checks(checks: object) -> list[FailedCheck]:
    """The failed ones among a verdict's check results (`CheckResult.as_dict`, as the `rejected`
    event records them); data of another shape is skipped, not trusted."""
    out: list[FailedCheck] = []
    for c in checks if isinstance(checks, list) else []:
        if not isinstance(c, dict) or c.get("passed") or c.get("unverified"):
            continue
        out.append(
            {
                "check": str(c.get("check", "?"))[:1000],
                "detail": str(c.get("detail", ""))[:1000],
                "source": DEFAULT_CHECK if c.get("default") else TASK_CHECK,
            }
        )
    return out


#: What a person decides about a rejected run's task after the rejection, besides accepting
#: it: reopening it with feedback (after an accept) or running it again (a retry, a retry now, a
#: change and retry). An accept comes after none of them.
LATER_DECISIONS = (EventKind.REOPENED, EventKind.RETRIED)


@dataclass(frozen=True)
class Rejection:
    """The supervisor's rejection of a task's newest run: the run (its answer), the reason, the
    checks that failed, the person's acceptance of it into review, once there is one, and the
    newest decision a person made about the task since (`LATER_DECISIONS`)."""

    run: AgentRun
    reason: str
    failed_checks: list[FailedCheck]
    accepted: TaskEvent | None = None
    later_decision: TaskEvent | None = None

    @property
    def acceptable(self) -> bool:
        """A person may still accept the run into review: once, and over no later decision."""
        return self.accepted is None and self.later_decision is None

    def as_dict(self) -> dict[str, Any]:
        accepted = self.accepted
        return {
            "run_id": self.run.pk,
            "run": self.run.number,
            "reason": self.reason,
            "failed_checks": self.failed_checks,
            "accepted": None
            if accepted is None
            else {
                "by": accepted.actor_label,
                "at": _iso(accepted.created_at),
                "reason": accepted.data.get("reason", ""),
            },
        }


def last_rejection(task: Task, *, newest_run: AgentRun | None = None) -> Rejection | None:
    """The rejection of `task`'s newest run (read here unless the caller has it), or None when
    that run was not rejected by the supervisor (or there is no run). One or two queries: the
    run's rejection and acceptance, and a person's reopen or retry since the run began."""
    run = newest_run or task.runs.order_by("-number").first()
    if run is None or run.verdict != Verdict.REJECTED:
        return None
    events = list(
        TaskEvent.objects.filter(task_id=task.pk)
        .filter(
            Q(run_id=run.pk, kind__in=(EventKind.REJECTED, EventKind.ACCEPTED))
            | Q(
                kind__in=LATER_DECISIONS,
                actor_kind=ActorKind.PERSON,
                created_at__gte=run.started_at,
            )
        )
        .order_by("-id")[:100]
    )
    rejected = next((e for e in events if e.kind == EventKind.REJECTED), None)
    accepted = next((e for e in events if e.kind == EventKind.ACCEPTED), None)
    since = rejected.pk if rejected is not None else 0
    later = next((e for e in events if e.kind in LATER_DECISIONS and e.pk > since), None)
    data = rejected.data if rejected is not None and isinstance(rejected.data, dict) else {}
    return Rejection(
        run=run,
        reason=run.verdict_reason or str(data.get("reason", "")),
        failed_checks=failed_checks(data.get("checks")),
        accepted=accepted,
        later_decision=later,
    )


# --- A task as every door reads it ------------------------------------------------------------

# A tool call's result in a transcript page: its head; the whole result has its own page.
RESULT_HEAD_CHARS = 4000


@dataclass(frozen=True)
class TaskRead:
    """A task as the console's task page, the API's task document and `acthelm_task show` read
    it, in a fixed number of queries; each door only formats it. `turns` is a transcript page
    (each turn's tool calls with the head of their result, `result_head`, its length,
    `full_result_chars`, and whether the model read another text, `full_differs`), empty when
    the transcript was not asked for; `events` a timeline page, or the whole timeline."""

    task: Task
    runs: list[RunFacts]
    turns: list[Turn]
    older_turns: int | None
    pending_approvals: list[Approval]
    pending_reviews: list[ReviewDecision]
    events: list[TaskEvent]
    older_events: int | None
    usage: Usage
    plan: Any
    artifacts: list[Artifact]
    input_files: list[InputFile]
    rejection: Rejection | None

    @property
    def answer_run(self) -> AgentRun | None:
        """The newest run with an answer."""
        return next((f.run for f in reversed(self.runs) if f.run.answer), None)

    @property
    def verdict_run(self) -> RunFacts | None:
        """The newest run with a verdict."""
        return next((f for f in reversed(self.runs) if f.run.verdict), None)


def task_read(
    task_id: int,
    *,
    transcript: bool = True,
    all_turns: bool = False,
    turns_before: int | None = None,
    events_before: int | None = None,
    all_events: bool = False,
) -> TaskRead | None:
    """The task `task_id` as every door reads it (`TaskRead`), None for an unknown task. The
    transcript is the newest 100 turns (500 with `all_turns`) below `turns_before`, the
    timeline the newest 200 events below `events_before` (all of them with `all_events`). The
    pending operations are those of the newest page's calls (the run stops at them: they are in
    its newest model turn), else read."""
    unknown_cost = (
        Turn.objects.filter(task=OuterRef("pk"), role=Role.ASSISTANT, cost__isnull=True)
        .order_by()
        .values("task")
        .annotate(n=Count("id"))
        .values("n")
    )
    task = (
        Task.objects.select_related("goal", "connection", "model__connection", "conversation")
        .annotate(unknown_cost_turns=Subquery(unknown_cost))
        .filter(pk=task_id)
        .first()
    )
    if task is None:
        return None
    runs = task_run_facts(task.pk)
    turns: list[Turn] = []
    older_turns = None
    if transcript:
        turns, older_turns = transcript_page(
            task.turns.prefetch_related(Prefetch("tool_calls", queryset=_transcript_calls())),
            all_turns=all_turns,
            before=turns_before,
        )
    if transcript and turns_before is None:
        calls = [call for turn in turns for call in turn.tool_calls.all()]
        approvals = [
            approval
            for call in calls
            if (approval := getattr(call, "approval", None)) is not None
            and approval.status == ApprovalStatus.PENDING
        ]
        reviews = [
            decision
            for call in calls
            if (decision := getattr(call, "review_decision", None)) is not None
            and decision.choice == ReviewChoice.PENDING
        ]
    else:
        approvals = list(
            Approval.objects.filter(task=task, status=ApprovalStatus.PENDING).order_by("id")
        )
        reviews = list(
            ReviewDecision.objects.filter(task=task, choice=ReviewChoice.PENDING)
            .select_related("tool_call")
            .defer("tool_call__result", "tool_call__result_for_model")
            .order_by("id")
        )
    if all_events:
        events, older_events = list(task.events.order_by("id")), None
    else:
        events, older_events = timeline_page(task, before=events_before)
    conversation = getattr(task, "conversation", None)
    return TaskRead(
        task=task,
        runs=runs,
        turns=turns,
        older_turns=older_turns,
        pending_approvals=approvals,
        pending_reviews=reviews,
        events=events,
        older_events=older_events,
        usage=task_usage(task.pk),
        plan=conversation.plan if conversation is not None else None,
        artifacts=list(task.artifacts.order_by("name")),
        input_files=list_input_files(task.pk),
        rejection=last_rejection(task, newest_run=runs[-1].run) if runs else None,
    )


def _transcript_calls() -> QuerySet[ToolCall]:
    return (
        ToolCall.objects.defer("result")
        .select_related("approval__decided_by", "review_decision__decided_by")
        .annotate(
            result_head=Left("result", RESULT_HEAD_CHARS),
            full_result_chars=Length("result"),
            full_differs=Case(
                When(result=F("result_for_model"), then=Value(False)),
                default=Value(True),
                output_field=BooleanField(),
            ),
        )
        .order_by("position")
    )
