"""Approvals and needs_review decisions: read-only records, never added, edited or deleted here."""

from typing import TYPE_CHECKING

from django.contrib import admin
from django.http import HttpRequest

from approvals.models import Approval, ReviewDecision

# ModelAdmin is generic in django-stubs only (django_stubs_ext.monkeypatch is not applied).
if TYPE_CHECKING:
    _ApprovalAdmin = admin.ModelAdmin[Approval]
    _ReviewDecisionAdmin = admin.ModelAdmin[ReviewDecision]
else:
    _ApprovalAdmin = _ReviewDecisionAdmin = admin.ModelAdmin


@admin.register(Approval)
class ApprovalAdmin(_ApprovalAdmin):
    """Read-only record; decisions are made in the approvals inbox, which carries the hash."""

    list_display = ["id", "task", "tool", "target", "status", "decided_by", "created_at"]
    list_filter = ["status", "tool"]
    raw_id_fields = ["task", "run", "tool_call"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Approval | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Approval | None = None) -> bool:
        return False  # the audit of who decided what: never deleted here


@admin.register(ReviewDecision)
class ReviewDecisionAdmin(_ReviewDecisionAdmin):
    list_display = ["id", "task", "tool_call", "choice", "decided_by", "created_at"]
    list_filter = ["choice"]
    raw_id_fields = ["task", "tool_call"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: ReviewDecision | None = None
    ) -> bool:
        return False

    def has_delete_permission(
        self, request: HttpRequest, obj: ReviewDecision | None = None
    ) -> bool:
        return False  # the audit of who decided what: never deleted here
