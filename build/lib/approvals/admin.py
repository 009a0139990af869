"""Approvals and needs_review decisions: read-only records, never added, edited or deleted here."""

from django.contrib import admin

from approvals.models import Approval, ReviewDecision


@admin.register(Approval)
class ApprovalAdmin(admin.ModelAdmin):
    """Read-only record; decisions are made in the approvals inbox, which carries the hash."""

    list_display = ["id", "task", "tool", "target", "status", "decided_by", "created_at"]
    list_filter = ["status", "tool"]
    raw_id_fields = ["task", "run", "tool_call"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # the audit of who decided what: never deleted here


@admin.register(ReviewDecision)
class ReviewDecisionAdmin(admin.ModelAdmin):
    list_display = ["id", "task", "tool_call", "choice", "decided_by", "created_at"]
    list_filter = ["choice"]
    raw_id_fields = ["task", "tool_call"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False  # the audit of who decided what: never deleted here
