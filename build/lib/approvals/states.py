"""Approval and needs_review decision states. Pure."""

from django.db import models


class ApprovalStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    APPROVED = "approved", "Approved"
    DENIED = "denied", "Denied"
    CANCELLED = "cancelled", "Settled: the task was cancelled"


class ApprovalReason(models.TextChoices):
    POLICY_ASK = "policy_ask", "The tool's policy on this task is 'ask'"
    DOMAIN_NOT_ALLOWED = "domain_not_allowed", "The domain is not in the task's allowed list"


class ReviewChoice(models.TextChoices):
    PENDING = "pending", "Waiting for a decision"
    RUN_AGAIN = "run_again", "Run again"
    SKIP = "skip", "Skip (the model is told the outcome is unknown)"
    CANCELLED = "cancelled", "Settled: the task was cancelled"
