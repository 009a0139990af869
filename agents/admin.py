"""Admin for connections, models, runs and the transcript (read-only: workers write it)."""

from django.contrib import admin

from agents.models import AgentRun, Artifact, Connection, Conversation, Model, ToolCall, Turn


class ReadOnlyAdmin(admin.ModelAdmin):
    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class ModelInline(admin.TabularInline):
    model = Model
    extra = 0
    fields = ["name", "context_window", "supports_tools", "test_status", "tested_at"]
    readonly_fields = ["test_status", "tested_at"]


@admin.register(Connection)
class ConnectionAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "kind",
        "cost_tier",
        "priority",
        "enabled",
        "cooldown_until",
        "last_error_code",
    ]
    list_filter = ["kind", "cost_tier", "enabled"]
    readonly_fields = ["cooldown_until", "last_error_code", "last_error_message", "last_error_at"]
    inlines = [ModelInline]


@admin.register(Model)
class ModelAdmin(admin.ModelAdmin):
    list_display = [
        "name",
        "connection",
        "context_window",
        "supports_tools",
        "test_status",
        "tested_at",
    ]
    list_filter = ["test_status", "connection"]
    list_select_related = ["connection"]
    readonly_fields = ["test_status", "tested_at", "test_message"]


@admin.register(AgentRun)
class AgentRunAdmin(ReadOnlyAdmin):
    list_display = [
        "id",
        "task",
        "number",
        "status",
        "worker_id",
        "model",
        "verdict",
        "error_code",
        "started_at",
        "finished_at",
    ]
    list_filter = ["status", "verdict", "error_code"]
    list_select_related = ["task", "model", "model__connection"]
    raw_id_fields = ["task", "claim_event"]
    show_full_result_count = False


@admin.register(Turn)
class TurnAdmin(ReadOnlyAdmin):
    list_display = ["id", "task", "index", "role", "stop_reason", "discarded"]
    raw_id_fields = ["task", "run"]
    show_full_result_count = False


@admin.register(ToolCall)
class ToolCallAdmin(ReadOnlyAdmin):
    list_display = ["id", "task", "tool", "status", "recovery_class", "run_count"]
    list_filter = ["tool", "status"]
    raw_id_fields = ["task", "run", "turn"]
    show_full_result_count = False


@admin.register(Artifact)
class ArtifactAdmin(ReadOnlyAdmin):
    list_display = ["id", "task", "name", "size", "content_type", "updated_at"]
    raw_id_fields = ["task", "run", "tool_call"]


@admin.register(Conversation)
class ConversationAdmin(ReadOnlyAdmin):
    list_display = ["task", "system_prompt_sha256", "plan_updated_at"]
    raw_id_fields = ["task"]
