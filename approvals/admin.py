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


@admin.register(ReviewDecision)
class ReviewDecisionAdmin(admin.ModelAdmin):
    list_display = ["id", "task", "tool_call", "choice", "decided_by", "created_at"]
    list_filter = ["choice"]
    raw_id_fields = ["task", "tool_call"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
