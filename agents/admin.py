"""Admin for connections, models, runs and the transcript (read-only: workers write it)."""

from django.contrib import admin, messages

from agents.models import (
    AgentRun,
    Artifact,
    Connection,
    Conversation,
    Model,
    ToolCall,
    ToolServer,
    Turn,
)
from tasks.actors import Actor
from tasks.exceptions import ActhelmError


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
    actions = ["fill_prices"]

    @admin.action(description="Fill empty prices from the price table (genai-prices)")
    def fill_prices(self, request, queryset):
        from agents.costs import model_fill_prices

        for model in queryset:
            try:
                fill = model_fill_prices(actor=Actor.person(request.user), model_id=model.pk)
            except ActhelmError as exc:
                self.message_user(request, f"{model}: {exc}", messages.ERROR)
            else:
                self.message_user(request, f"{fill.model}: {fill.message}")


@admin.register(ToolServer)
class ToolServerAdmin(admin.ModelAdmin):
    """Adding and testing go through agents.toolservers (the same checks as the command)."""

    list_display = ["name", "transport", "trusted", "test_status", "tested_at"]
    list_filter = ["transport", "trusted", "test_status"]
    readonly_fields = ["tools", "test_status", "tested_at", "test_message"]
    actions = ["test_servers"]

    def _manages(self, request) -> bool:
        return request.user.has_perm("agents.manage_toolservers")

    def has_add_permission(self, request):
        return self._manages(request)

    def has_change_permission(self, request, obj=None):
        return self._manages(request)

    def has_delete_permission(self, request, obj=None):
        return self._manages(request)

    def get_form(self, request, obj=None, **kwargs):
        from django import forms

        from agents.toolservers import validate_credential_env, validate_server_name

        form = super().get_form(request, obj, **kwargs)

        class Checked(form):
            def clean_name(self):
                try:
                    return validate_server_name(self.cleaned_data["name"])
                except ActhelmError as exc:
                    raise forms.ValidationError(str(exc)) from None

            def clean_credential_env(self):
                try:
                    return validate_credential_env(self.cleaned_data["credential_env"])
                except ActhelmError as exc:
                    raise forms.ValidationError(str(exc)) from None

        return Checked

    @admin.action(description="Test: connect, list the tools and record them")
    def test_servers(self, request, queryset):
        from agents.toolservers import toolserver_test

        for server in queryset:
            try:
                result = toolserver_test(actor=Actor.person(request.user), name=server.name)
            except ActhelmError as exc:
                self.message_user(request, f"{server}: {exc}", messages.ERROR)
                continue
            level = messages.SUCCESS if result["ok"] else messages.ERROR
            self.message_user(request, f"{server}: {result['test_message']}", level)


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
