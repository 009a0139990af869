"""What agents are told before they start: memory entries by scope, and what each run was given."""

from django.conf import settings
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector
from django.db import models
from django.db.models import Q


class MemoryScope(models.TextChoices):
    GLOBAL = "global", "Every task"
    GOAL = "goal", "Tasks of one goal"
    TAG = "tag", "Tasks with a tag"


class MemoryEntry(models.Model):
    scope = models.CharField(max_length=16, choices=MemoryScope.choices, default=MemoryScope.GLOBAL)
    goal = models.ForeignKey(
        "tasks.Goal", null=True, blank=True, on_delete=models.CASCADE, related_name="memory"
    )
    tag = models.CharField(max_length=50, blank=True)
    title = models.CharField(max_length=200)
    body = models.TextField()
    active = models.BooleanField(default=True)
    author = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name_plural = "memory entries"
        ordering = ["-updated_at"]
        indexes = [
            GinIndex(
                SearchVector("title", "body", config="english"),
                name="memory_search_idx",
            ),
        ]
        constraints = [
            models.CheckConstraint(
                condition=(Q(scope=MemoryScope.GLOBAL) & Q(goal__isnull=True) & Q(tag=""))
                | (Q(scope=MemoryScope.GOAL) & Q(goal__isnull=False) & Q(tag=""))
                | (Q(scope=MemoryScope.TAG) & Q(goal__isnull=True) & ~Q(tag="")),
                name="memory_scope_consistent",
            ),
        ]

    def __str__(self) -> str:
        return self.title


class MemorySelection(models.Model):
    """Which entries a run was given, in the order they appear in its system prompt."""

    # Indexed by memory_selection_unique (run, position).
    run = models.ForeignKey(
        "agents.AgentRun", on_delete=models.CASCADE, related_name="memory", db_index=False
    )
    entry = models.ForeignKey(MemoryEntry, null=True, on_delete=models.SET_NULL, related_name="+")
    position = models.PositiveIntegerField()
    rank = models.FloatField(default=0)
    title = models.CharField(max_length=200)
    chars = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["run_id", "position"]
        constraints = [
            models.UniqueConstraint(fields=["run", "position"], name="memory_selection_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.title} for run {self.run_id}"
