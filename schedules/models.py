"""Schedule (a template and when to create it) and ScheduleSlot (what became of each slot: the
task or goal it created, or why it was skipped). A slot's row is written in the transaction that
creates its task, and (schedule, slot time) is unique for the scheduled slots, so a slot cannot
create two tasks whoever races for it. The link to the task lives here, so the ledger does not
know schedules."""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models

from schedules.states import (
    CatchUpPolicy,
    OverlapPolicy,
    ScheduleTarget,
    SkipReason,
    SlotKind,
    SlotOutcome,
)


class Schedule(models.Model):
    name = models.CharField(max_length=100, unique=True)
    target = models.CharField(
        max_length=8, choices=ScheduleTarget.choices, default=ScheduleTarget.TASK
    )
    cron = models.CharField(
        max_length=100, help_text="Minute hour day-of-month month day-of-week, e.g. 0 8 * * 1-5."
    )
    timezone = models.CharField(max_length=64, default="UTC", help_text="e.g. Europe/Berlin.")
    # The template: what `task_create` (or `goal_create`) is given for each slot.
    title = models.CharField(max_length=160)
    instruction = models.TextField(help_text="The task's instruction, or the goal's description.")
    goal = models.ForeignKey(
        "tasks.Goal",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="The goal each task is for (a task schedule).",
    )
    connection = models.ForeignKey(
        "agents.Connection", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    model = models.ForeignKey(
        "agents.Model", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    # None: the default tools (ACTHELM_DEFAULT_TOOLS) at each slot.
    tools = models.JSONField(null=True, blank=True)
    tool_policies = models.JSONField(default=dict, blank=True)
    allowed_domains = models.JSONField(default=list, blank=True)
    tags = ArrayField(models.CharField(max_length=50), default=list, blank=True)
    limits = models.JSONField(default=dict, blank=True)
    acceptance_checks = models.JSONField(default=list, blank=True)
    priority = models.IntegerField(default=0)
    # The policies a person sets.
    overlap = models.CharField(
        max_length=8, choices=OverlapPolicy.choices, default=OverlapPolicy.SKIP
    )
    catch_up = models.CharField(
        max_length=8, choices=CatchUpPolicy.choices, default=CatchUpPolicy.LATEST
    )
    paused = models.BooleanField(default=False)
    ends_at = models.DateTimeField(null=True, blank=True, help_text="No slot after this time.")
    # Where the schedule is: written by `schedules.services` only. `next_slot_at` is the first
    # slot not yet decided (None: ended); `last_slot_at` the latest slot decided. Slots move
    # forward from these, never from the clock, so a clock that jumps back repeats nothing.
    next_slot_at = models.DateTimeField(null=True, blank=True, editable=False)
    last_slot_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]
        indexes = [
            # The tick's search: active schedules whose next slot is due.
            models.Index(
                fields=["next_slot_at"],
                name="schedule_due_idx",
                condition=models.Q(paused=False, next_slot_at__isnull=False),
            )
        ]

    def __str__(self) -> str:
        return self.name


class ScheduleSlot(models.Model):
    schedule = models.ForeignKey(Schedule, on_delete=models.CASCADE, related_name="slots")
    slot_at = models.DateTimeField(help_text="The slot's time (a run now: when it was asked).")
    kind = models.CharField(max_length=12, choices=SlotKind.choices, default=SlotKind.SCHEDULED)
    outcome = models.CharField(max_length=8, choices=SlotOutcome.choices)
    # Skipped: a SkipReason; failed: the error's code.
    reason = models.CharField(max_length=64, blank=True)
    detail = models.TextField(blank=True)
    # Slots this row stands for: a row of missed (or paused) slots records them together.
    count = models.PositiveIntegerField(default=1)
    task = models.OneToOneField(
        "tasks.Task",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="schedule_slot",
    )
    goal = models.OneToOneField(
        "tasks.Goal",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="schedule_slot",
    )
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    recorded_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-slot_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["schedule", "slot_at"],
                condition=models.Q(kind=SlotKind.SCHEDULED),
                name="schedule_slot_once",
            ),
            models.CheckConstraint(
                condition=models.Q(outcome=SlotOutcome.CREATED)
                | (models.Q(task__isnull=True) & models.Q(goal__isnull=True)),
                name="schedule_slot_only_created_links",
            ),
            models.CheckConstraint(
                condition=~models.Q(outcome=SlotOutcome.SKIPPED)
                | models.Q(reason__in=SkipReason.values),
                name="schedule_slot_skip_has_reason",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.schedule} @ {self.slot_at:%Y-%m-%d %H:%M} {self.outcome}"

    @property
    def reason_text(self) -> str:
        """A skip's reason in words; a failure's code as it is."""
        if self.reason in SkipReason.values:
            return str(SkipReason(self.reason).label)
        return self.reason
