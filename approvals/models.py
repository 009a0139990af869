"""A person's decisions on single operations: approvals and needs_review choices."""

from django.conf import settings
from django.db import models
from django.db.models import Q

from approvals.states import ApprovalReason, ApprovalStatus, ReviewChoice


class Approval(models.Model):
    """Bound to one operation: the tool plus the hash of its exact, validated arguments."""

    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="approvals")
    run = models.ForeignKey("agents.AgentRun", on_delete=models.CASCADE, related_name="approvals")
    tool_call = models.OneToOneField(
        "agents.ToolCall", on_delete=models.CASCADE, related_name="approval"
    )
    tool = models.CharField(max_length=100)
    target = models.TextField()
    arguments = models.JSONField()
    arguments_hash = models.CharField(max_length=64)
    reason = models.CharField(max_length=32, choices=ApprovalReason.choices)
    effect = models.TextField()
    status = models.CharField(
        max_length=16, choices=ApprovalStatus.choices, default=ApprovalStatus.PENDING
    )
    # Approved with edited arguments: the operation that runs (validated as a model's call is,
    # and hashed as the engine hashes it); `arguments` and `arguments_hash` stay the proposal.
    edited_arguments = models.JSONField(null=True, blank=True)
    edited_arguments_hash = models.CharField(max_length=64, blank=True)
    # A denial's message (the model receives it as the call's result) or a cancel's reason.
    message = models.TextField(blank=True)
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]
        permissions = [("decide_approval", "Can approve or deny operations")]
        indexes = [
            models.Index(
                fields=["created_at"],
                name="approval_pending_idx",
                condition=Q(status=ApprovalStatus.PENDING),
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=Q(status=ApprovalStatus.PENDING) | Q(decided_at__isnull=False),
                name="approval_decided_has_time",
            ),
            models.CheckConstraint(
                condition=Q(edited_arguments_hash="") | Q(status=ApprovalStatus.APPROVED),
                name="approval_edit_only_when_approved",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.tool} {self.target} ({self.status})"

    @property
    def approved_hash(self) -> str:
        """The hash of the operation a person let run: the edit's, else the proposal's."""
        return self.edited_arguments_hash or self.arguments_hash


class ReviewDecision(models.Model):
    """For an operation whose outcome is unknown after a crash: run it again, or skip it."""

    task = models.ForeignKey(
        "tasks.Task", on_delete=models.CASCADE, related_name="review_decisions"
    )
    tool_call = models.OneToOneField(
        "agents.ToolCall", on_delete=models.CASCADE, related_name="review_decision"
    )
    choice = models.CharField(
        max_length=16, choices=ReviewChoice.choices, default=ReviewChoice.PENDING
    )
    decided_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    decided_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["created_at", "id"]

    def __str__(self) -> str:
        return f"needs_review decision {self.pk} ({self.choice})"
