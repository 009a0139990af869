"""Evaluation runs and their per-case results. Registered through agents.models.

A result is written once, when its case's task has settled and was graded; it keeps the task
(for the link and the transcript) and copies of the numbers that were graded, so a report stays
readable after the task is deleted.
"""

from typing import Any

from django.db import models
from django.db.models import Q


class EvalRunStatus(models.TextChoices):
    RUNNING = "running", "Running"
    FINISHED = "finished", "Finished"
    INTERRUPTED = "interrupted", "Interrupted"


class EvalOutcome(models.TextChoices):
    PASSED = "passed", "Passed"
    FAILED = "failed", "Failed"
    # The case did not settle within the run's timeout; its task was cancelled.
    TIMEOUT = "timeout", "Timed out"
    # The environment could not run the case (e.g. loopback fetch not allowed to the workers):
    # not counted in the pass rate.
    SKIPPED = "skipped", "Skipped"


GRADED = (EvalOutcome.PASSED, EvalOutcome.FAILED, EvalOutcome.TIMEOUT)


class EvalRun(models.Model):
    """One `acthelm_eval run`: some cases, repeated N times, on one connection/model."""

    connection = models.ForeignKey(
        "agents.Connection", null=True, on_delete=models.SET_NULL, related_name="eval_runs"
    )
    model = models.ForeignKey(
        "agents.Model", null=True, on_delete=models.SET_NULL, related_name="eval_runs"
    )
    # Names as they were, so the report still reads after a connection is renamed or deleted.
    connection_name = models.CharField(max_length=100)
    model_name = models.CharField(max_length=200)
    cases_pattern = models.CharField(max_length=200, blank=True)
    repeat = models.PositiveIntegerField(default=1)
    # sha256 over the case files that were run: results of different suites are not mixed up.
    suite_sha256 = models.CharField(max_length=64)
    status = models.CharField(
        max_length=16, choices=EvalRunStatus.choices, default=EvalRunStatus.RUNNING
    )
    started_by = models.CharField(max_length=200)
    # The supervisor the workers ran with (agents.eval.runner.supervisor_config), e.g.
    # "rules+defaults" or "rules+defaults+checks+model:conn/model": results of different
    # configurations are reported apart.
    supervisor = models.CharField(max_length=300, blank=True)
    started_at = models.DateTimeField(auto_now_add=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=EvalRunStatus.values), name="evalrun_status_valid"
            ),
            models.CheckConstraint(condition=Q(repeat__gt=0), name="evalrun_repeat_positive"),
        ]

    def __str__(self) -> str:
        return f"eval #{self.pk} {self.connection_name}/{self.model_name}"


class EvalResult(models.Model):
    """The graded outcome of one case in one repetition of a run."""

    # Indexed by evalresult_once_per_case (run, case_id, repetition).
    run = models.ForeignKey(
        EvalRun, on_delete=models.CASCADE, related_name="results", db_index=False
    )
    case_id = models.CharField(max_length=100)
    repetition = models.PositiveIntegerField(default=1)
    task = models.ForeignKey(
        "tasks.Task", null=True, on_delete=models.SET_NULL, related_name="eval_results"
    )
    # The task's id, kept if the task is deleted; None for a skipped case (no task created).
    task_number = models.PositiveBigIntegerField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=EvalOutcome.choices)
    final_state = models.CharField(max_length=20)
    failure_code = models.CharField(max_length=64, blank=True)
    # Every check of the grader: [{"check": ..., "passed": bool, "detail": ...}].
    checks = models.JSONField(default=list)
    # What the runner did as the person of the script: approvals decided, cancels and why.
    actions = models.JSONField(default=list, blank=True)
    # The supervisor's verdict on the graded attempt (approved, unverified, rejected; empty when
    # the run never reached it — a limit, an approval, a failure) and its reason.
    supervisor_verdict = models.CharField(max_length=16, blank=True)
    supervisor_reason = models.TextField(blank=True)
    # The grader's verdict on the work itself: as `outcome`, except that a supervisor's
    # rejection is taken out (a rejected answer is graded as if it had reached review), so a
    # false rejection of good work can be told from bad work. None: not graded.
    work_passed = models.BooleanField(null=True, blank=True)
    model_turns = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    # None when the model has no prices (unknown is not free).
    cost = models.DecimalField(max_digits=14, decimal_places=6, null=True, blank=True)
    active_seconds = models.FloatField(default=0)
    wall_seconds = models.FloatField(default=0)
    graded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run_id", "case_id", "repetition"]
        constraints = [
            models.UniqueConstraint(
                fields=["run", "case_id", "repetition"], name="evalresult_once_per_case"
            ),
            models.CheckConstraint(
                condition=Q(outcome__in=EvalOutcome.values), name="evalresult_outcome_valid"
            ),
        ]
        indexes = [models.Index(fields=["case_id", "run"], name="evalresult_case_idx")]

    def __str__(self) -> str:
        return f"{self.case_id} #{self.repetition}: {self.outcome}"

    @property
    def passed(self) -> bool:
        return self.outcome == EvalOutcome.PASSED

    @property
    def failed_checks(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if not c.get("passed")]

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.output_tokens
