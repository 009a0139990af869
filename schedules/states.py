"""The schedules' choices: what a schedule makes, its policies, and what became of each slot."""

from django.db import models


class ScheduleTarget(models.TextChoices):
    TASK = "task", "Task"
    GOAL = "goal", "Goal (planned by the reconciler)"


class OverlapPolicy(models.TextChoices):
    # The default: a slot is skipped while the last task (or goal) this schedule made is open.
    SKIP = "skip", "Skip while the last one is open"
    ALLOW = "allow", "Allow overlapping"


class CatchUpPolicy(models.TextChoices):
    # The default: after downtime, the latest missed slot runs, the earlier ones are recorded.
    LATEST = "latest", "Run the latest missed slot"
    NONE = "none", "Run no missed slot"


class SlotKind(models.TextChoices):
    SCHEDULED = "scheduled", "Scheduled"
    RUN_NOW = "run_now", "Run now"


class SlotOutcome(models.TextChoices):
    CREATED = "created", "Created"
    SKIPPED = "skipped", "Skipped"
    FAILED = "failed", "Failed"


class SkipReason(models.TextChoices):
    OVERLAP = "overlap", "The last one is still open"
    MISSED = "missed", "Missed while no scheduler ran"
    PAUSED = "paused", "The schedule was paused"
