"""Goals, tasks, their dependencies and the append-only timeline of every task."""

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.db import models
from django.db.models import Q
from django.db.models.expressions import Combinable

from core.actors import ActorKind
from tasks.limits import BY_FIELD
from tasks.states import HELD, EventKind, TaskKind, TaskOrigin, TaskStatus


def default_tools() -> list[str]:
    return list(settings.ACTHELM_DEFAULT_TOOLS)


def _limit_field(
    name: str,
) -> "models.PositiveIntegerField[float | int | str | Combinable, int]":
    """A whole-number limit column, its default from the limits table."""
    return models.PositiveIntegerField(default=BY_FIELD[name].default)


class Goal(models.Model):
    title = models.CharField(max_length=200)
    description = models.TextField(blank=True)
    active = models.BooleanField(default=True)
    # The acceptance checks of the work planned for this goal (agents.engine.verdict.acceptance):
    # the default of
    # a person's task with this goal, and what a follow-up with `inherit_checks` adds. Validated
    # by agents.actions.goal.goal_create, hence not editable in the admin.
    acceptance_checks = models.JSONField(default=list, blank=True, editable=False)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]

    def __str__(self) -> str:
        return self.title


class Task(models.Model):
    title = models.CharField(max_length=200)
    instruction = models.TextField()
    # Indexed by task_goal_status_idx (goal, status).
    goal = models.ForeignKey(
        Goal,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="tasks",
        db_index=False,
    )
    kind = models.CharField(max_length=16, choices=TaskKind.choices, default=TaskKind.WORK)
    origin = models.CharField(max_length=16, choices=TaskOrigin.choices, default=TaskOrigin.PERSON)
    # The planning task whose propose_task call created this one (a linked follow-up).
    spawned_by = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="follow_ups"
    )
    tags = ArrayField(models.CharField(max_length=50), default=list, blank=True)
    # Created by `acthelm_eval run` to measure a model: run by the normal workers like any task,
    # but kept out of the review queue, the inbox, the task list's default view and the
    # scorecard's real-work figures.
    is_evaluation = models.BooleanField(default=False, editable=False)

    # Written only by tasks.transitions.
    status = models.CharField(
        max_length=20, choices=TaskStatus.choices, default=TaskStatus.READY, editable=False
    )
    depends_on = models.ManyToManyField(
        "self", symmetrical=False, through="TaskDependency", related_name="dependants", blank=True
    )
    priority = models.IntegerField(default=0, help_text="Higher runs first.")
    not_before = models.DateTimeField(null=True, blank=True, editable=False)

    # The fencing counter: incremented by every claim, never decreased.
    claim_count = models.PositiveIntegerField(default=0, editable=False)
    lease_owner = models.CharField(max_length=200, blank=True, editable=False)
    lease_expires_at = models.DateTimeField(null=True, blank=True, editable=False)
    # The newest person's event that takes the task from the worker holding it (anything but a
    # pause request or its withdrawal): the fence compares it with the run's claim event in the
    # same row it locks (docs/worker.md). No index: person events are rare.
    last_person_event_id = models.BigIntegerField(null=True, blank=True, editable=False)
    failed_attempts = models.PositiveIntegerField(default=0, editable=False)
    lost_count = models.PositiveIntegerField(default=0, editable=False)

    # Limits (tasks/limits.py), copied from the ACTHELM_LIMIT_* defaults when the task is created.
    limit_turns = _limit_field("limit_turns")
    limit_runtime_seconds = _limit_field("limit_runtime_seconds")
    limit_output_tokens = _limit_field("limit_output_tokens")
    limit_token_budget = _limit_field("limit_token_budget")
    limit_tool_output_chars = _limit_field("limit_tool_output_chars")
    limit_network_requests = _limit_field("limit_network_requests")
    limit_artifact_bytes = _limit_field("limit_artifact_bytes")
    limit_mcp_calls = _limit_field("limit_mcp_calls")
    # A money budget in US dollars; empty = no budget.
    limit_cost = models.DecimalField(max_digits=12, decimal_places=4, null=True, blank=True)

    # 64: the longest tool name model APIs accept (MCP tools are SERVER__TOOL).
    tools = ArrayField(models.CharField(max_length=64), default=default_tools, blank=True)
    # {"tool_name": "allow" | "ask"}; a tool missing here is allowed.
    tool_policies = models.JSONField(default=dict, blank=True)
    allowed_domains = ArrayField(models.CharField(max_length=253), default=list, blank=True)
    # What "finished" means (agents.engine.verdict.acceptance): [{"kind", "value", "artifact"?}],
    # validated when
    # the task is created; the supervisor runs them before its rules.
    acceptance_checks = models.JSONField(default=list, blank=True, editable=False)

    connection = models.ForeignKey(
        "agents.Connection", null=True, blank=True, on_delete=models.PROTECT, related_name="tasks"
    )
    model = models.ForeignKey(
        "agents.Model", null=True, blank=True, on_delete=models.PROTECT, related_name="tasks"
    )

    failure_code = models.CharField(max_length=64, blank=True, editable=False)
    failure_message = models.TextField(blank=True, editable=False)
    # A person's feedback on reopen, or the supervisor's on rejection; given to the next attempt.
    feedback = models.TextField(blank=True, editable=False)

    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-id"]
        permissions = [
            ("close_task", "Can close a task in review"),
            ("operate_task", "Can pause, resume, cancel, retry and reopen tasks"),
        ]
        indexes = [
            # The claim: due ready tasks by priority, then age.
            models.Index(
                fields=["-priority", "id"],
                name="task_claimable_idx",
                condition=Q(status=TaskStatus.READY),
            ),
            models.Index(fields=["status", "-id"], name="task_status_idx"),
            # No index on lease_expires_at: the heartbeat rewrites it every few seconds, and an
            # index on it would turn each of those updates into a non-HOT one. Held tasks are
            # few; recovery finds them through task_status_idx.
            models.Index(fields=["goal", "status"], name="task_goal_status_idx"),
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status__in=TaskStatus.values), name="task_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status__in=sorted(HELD))
                | (Q(lease_expires_at__isnull=False) & ~Q(lease_owner="")),
                name="task_held_has_lease",
            ),
            models.CheckConstraint(
                condition=Q(limit_turns__gt=0)
                & Q(limit_runtime_seconds__gt=0)
                & Q(limit_output_tokens__gt=0)
                & Q(limit_token_budget__gt=0),
                name="task_limits_positive",
            ),
            models.CheckConstraint(
                condition=Q(limit_cost__isnull=True) | Q(limit_cost__gt=0),
                name="task_limit_cost_positive",
            ),
        ]

    def __str__(self) -> str:
        return f"#{self.pk} {self.title}"

    @property
    def is_held(self) -> bool:
        return self.status in HELD


class TaskDependency(models.Model):
    # Indexed by task_dependency_unique (task, depends_on).
    task = models.ForeignKey(
        Task, on_delete=models.CASCADE, related_name="dependency_links", db_index=False
    )
    depends_on = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="dependant_links")

    class Meta:
        verbose_name_plural = "task dependencies"
        constraints = [
            models.UniqueConstraint(fields=["task", "depends_on"], name="task_dependency_unique"),
            models.CheckConstraint(
                condition=~Q(task=models.F("depends_on")), name="task_dependency_not_self"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.task_id} waits for {self.depends_on_id}"


class TaskEvent(models.Model):
    """One line of a task's timeline. Append-only: a trigger refuses UPDATE."""

    # Every step inserts events: each index here is maintained per row, so none is kept that
    # another covers — the task's events by event_task_idx (task, id), the person's by a partial
    # index the worker's rows never enter, /metrics and the scorecard by (kind, created_at).
    task = models.ForeignKey(Task, on_delete=models.CASCADE, related_name="events", db_index=False)
    run = models.ForeignKey(
        "agents.AgentRun", null=True, blank=True, on_delete=models.SET_NULL, related_name="events"
    )
    kind = models.CharField(max_length=32, choices=EventKind.choices)
    actor_kind = models.CharField(max_length=16, choices=ActorKind.choices)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        db_index=False,
    )
    actor_label = models.CharField(max_length=200, blank=True)
    from_status = models.CharField(max_length=20, blank=True)
    to_status = models.CharField(max_length=20, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]
        indexes = [
            models.Index(fields=["task", "id"], name="event_task_idx"),
            # /metrics counts events by kind on every scrape: an index-only scan, not 2M rows;
            # the scorecard reads closings by kind within a time window.
            models.Index(fields=["kind", "created_at"], name="event_kind_created_idx"),
            # A user's deletion sets their events' actor_user to NULL: found by this index,
            # which no worker's event enters.
            models.Index(
                fields=["actor_user"],
                name="event_actor_user_idx",
                condition=Q(actor_user__isnull=False),
            ),
            models.Index(
                fields=["task", "id"],
                name="event_task_person_idx",
                condition=Q(actor_kind=ActorKind.PERSON),
            ),
        ]

    def __str__(self) -> str:
        return f"{self.kind} by {self.actor_label or self.actor_kind}"


# Notifications (targets and the outbox) live in tasks.notify; imported here so Django registers
# them with the tasks app.
from tasks.notify.models import Notification, NotificationTarget  # noqa: E402, F401
