"""A task whose newest run the supervisor rejected, made by the engine's own end of a run
(`agents.engine.verdict.outcomes.handle` with a rejecting verdict) over a real run row and a real
artifact file: waiting for its retry, or failed after its attempts."""

import hashlib
from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from agents.engine.verdict.checking import CheckResult
from agents.engine.verdict.outcomes import Outcome, handle
from agents.engine.verdict.supervisor import SupervisorVerdict
from agents.models import AgentRun, Artifact
from core.actors import Actor
from tasks.models import Task
from tasks.states import TaskStatus
from tasks.transitions import lock_task
from tasks.workspace import artifacts_dir
from tests.factories import AgentRunFactory, TaskFactory

INSTRUCTION = "Summarise notes.txt in three bullet points and write them to summary.md"
ANSWER = "The summary is in report.md:\n- one\n- two\n- three"
REPORT = "# Summary\n\n- one\n- two\n- three\n"
NAMED_OUTPUT = CheckResult(
    "named_output=summary.md",
    False,
    "the instruction asks for summary.md; artifacts: report.md",
    default=True,
)
OWN_CHECK = CheckResult("answer_contains=four", False, "the answer does not contain 'four'")
PASSED = CheckResult("answer_not_echo", True, "not an echo", default=True)


def reject(
    task: Task, *, answer: str = ANSWER, checks=(NAMED_OUTPUT, OWN_CHECK, PASSED)
) -> AgentRun:
    """Run `task` (ready) once: a run that wrote report.md and answered, rejected by `checks`."""
    number = task.runs.count() + 1
    Task.objects.filter(pk=task.pk).update(
        status=TaskStatus.IN_PROGRESS,
        lease_owner="w-test",
        lease_expires_at=timezone.now() + timedelta(seconds=60),
        claim_count=number,
        not_before=None,
    )
    run = AgentRunFactory(task=task, number=number, claim_count=number, answer=answer)
    path = artifacts_dir(task.pk) / "report.md"
    path.write_text(REPORT)
    Artifact.objects.update_or_create(
        task=task,
        name="report.md",
        defaults={
            "run": run,
            "path": str(path),
            "size": len(REPORT),
            "sha256": hashlib.sha256(REPORT.encode()).hexdigest(),
            "content_type": "text/markdown",
        },
    )
    failed = [c for c in checks if c.failed]
    reason = "; ".join(
        f"{'default check' if c.default else 'acceptance check'} {c.check} failed: {c.detail}"
        for c in failed
    )
    verdict = SupervisorVerdict(False, reason or "the answer is empty", checks=tuple(checks))
    with transaction.atomic():
        handle(
            lock_task(task.pk),
            run,
            actor=Actor.worker("w-test"),
            outcome=Outcome(Outcome.FINAL, answer=answer),
            verdict=verdict,
        )
    run.refresh_from_db()
    return run


def rejected_task(*, failed: bool = False, **kwargs) -> Task:
    """A task whose newest run was rejected: ready with its retry scheduled, or (`failed`)
    failed after its last attempt."""
    kwargs.setdefault("instruction", INSTRUCTION)
    kwargs.setdefault("tools", ["read_file", "list_files", "write_artifact"])
    attempts = settings.ACTHELM_MAX_ATTEMPTS if failed else 0
    task = TaskFactory(status=TaskStatus.READY, failed_attempts=attempts, **kwargs)
    reject(task)
    task.refresh_from_db()
    assert task.status == (TaskStatus.FAILED if failed else TaskStatus.READY), task.status
    return task
