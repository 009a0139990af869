"""Admin for connections, models, runs and the transcript (read-only: workers write it).

Edits of connections and models go through agents.catalogue.connections (connection_update,
model_update):
the same validators as the console and the CLI, and a model whose test no longer says anything
(a new URL, command or credential; a new name or tool support) is untested again.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.forms.models import BaseInlineFormSet
from django.http import HttpRequest

from agents.catalogue import connections, toolservers
from agents.catalogue.connection_rules import executable_refusal_for
from agents.catalogue.prices import model_fill_prices
from agents.catalogue.providers import UnknownProviderKind, get_provider_class
from agents.catalogue.toolservers import validate_server_name
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
from agents.permissions import MANAGE_CONNECTIONS, MANAGE_TOOLSERVERS
from core.actors import Actor
from core.exceptions import ActhelmError, NotPermitted

if TYPE_CHECKING:
    # django-stubs types each admin by its model; Django's classes take no type arguments at
    # run time, so the typed bases exist for mypy only.
    ReadOnlyAdminBase = admin.ModelAdmin[Any]
    ConnectionAdminBase = admin.ModelAdmin[Connection]
    ModelAdminBase = admin.ModelAdmin[Model]
    ToolServerAdminBase = admin.ModelAdmin[ToolServer]
    ModelInlineBase = admin.TabularInline[Model, Connection]
else:
    ReadOnlyAdminBase = ConnectionAdminBase = ModelAdminBase = ToolServerAdminBase = (
        admin.ModelAdmin
    )
    ModelInlineBase = admin.TabularInline


class ReadOnlyAdmin(ReadOnlyAdminBase):
    def has_add_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: object = None) -> bool:
        return False


def _through_service[R](func: Callable[..., R], **kwargs: Any) -> R:
    try:
        return func(**kwargs)
    except NotPermitted as exc:
        raise PermissionDenied(str(exc)) from None


def _changes(form: forms.BaseForm, editable: Collection[str]) -> dict[str, Any]:
    return {name: form.cleaned_data[name] for name in form.changed_data if name in editable}


class ModelInline(ModelInlineBase):
    model = Model
    extra = 0
    fields = ["name", "context_window", "supports_tools", "test_status", "tested_at", "streams"]
    readonly_fields = ["test_status", "tested_at", "streams"]


@admin.action(description="Override the probe: count as tool-capable (recorded with your name)")
def override_tools(
    modeladmin: admin.ModelAdmin[Model], request: HttpRequest, queryset: QuerySet[Model]
) -> None:
    actor = Actor.person(request.user)
    for model_id in queryset.values_list("pk", flat=True):
        try:
            model = _through_service(
                connections.model_override_tools, actor=actor, model_id=model_id
            )
        except ActhelmError as exc:
            modeladmin.message_user(request, f"{exc} [{exc.code}]", messages.ERROR)
            continue
        modeladmin.message_user(request, f"{model}: tool-capable by your override.")


@admin.register(Connection)
class ConnectionAdmin(ConnectionAdminBase):
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

    def get_form(
        self,
        request: HttpRequest,
        obj: Connection | None = None,
        change: bool = False,
        **kwargs: Any,
    ) -> type[forms.ModelForm[Connection]]:
        """Connection.clean() checks the settings; this form checks who saves a command that
        runs (as the services do: a new connection, or a new kind or command)."""
        form = super().get_form(request, obj, change=change, **kwargs)
        actor = Actor.person(request.user)

        # A base that is a value (the form the admin built for this request): mypy cannot
        # follow it, and checks this class's methods against an unknown base.
        class Checked(form):  # type: ignore[misc, valid-type]
            def clean(self) -> dict[str, Any]:
                data: dict[str, Any] = super().clean()
                if obj is not None and not {"kind", "command"} & set(self.changed_data):
                    return data
                try:
                    runs_command = get_provider_class(data.get("kind") or "").needs_command
                except UnknownProviderKind:
                    return data  # Connection.clean() names the kinds
                problem = executable_refusal_for(actor, data.get("command"))
                if runs_command and problem and "command" not in self.errors:
                    self.add_error("command", f"{problem} [executable_not_allowed]")
                return data

        return Checked

    def save_model(
        self, request: HttpRequest, obj: Connection, form: forms.ModelForm[Connection], change: bool
    ) -> None:
        if not change:
            # A new connection: Connection.clean ran the services' validator; its models start
            # untested.
            if not request.user.has_perm(MANAGE_CONNECTIONS):
                raise PermissionDenied
            obj.save()
            return
        _through_service(
            connections.connection_update,
            actor=Actor.person(request.user),
            connection_id=obj.pk,
            changes=_changes(form, connections.CONNECTION_EDITABLE),
        )
        obj.refresh_from_db()

    def save_formset(
        self,
        request: HttpRequest,
        form: forms.ModelForm[Connection],
        formset: BaseInlineFormSet[Any, Connection, Any],
        change: bool,
    ) -> None:
        if formset.model is not Model:
            return super().save_formset(request, form, formset, change)
        actor = Actor.person(request.user)
        instances = formset.save(commit=False)
        changed = {obj.pk: fields for obj, fields in formset.changed_objects}
        for obj in formset.deleted_objects:
            obj.delete()
        for obj in instances:
            if obj.pk is None:
                obj.save()
                continue
            sub = next(f for f in formset.forms if f.instance.pk == obj.pk)
            _through_service(
                connections.model_update,
                actor=actor,
                model_id=obj.pk,
                changes={
                    name: sub.cleaned_data[name]
                    for name in changed.get(obj.pk, [])
                    if name in connections.MODEL_EDITABLE
                },
            )
        return None


@admin.register(Model)
class ModelAdmin(ModelAdminBase):
    list_display = [
        "name",
        "connection",
        "context_window",
        "supports_tools",
        "test_status",
        "tested_at",
        "streams",
    ]
    list_filter = ["test_status", "connection"]
    list_select_related = ["connection"]
    readonly_fields = [
        "test_status",
        "tested_at",
        "test_message",
        "streams",
        "tools_override_by",
        "tools_override_at",
    ]
    actions = [override_tools, "fill_prices"]

    def save_model(
        self, request: HttpRequest, obj: Model, form: forms.ModelForm[Model], change: bool
    ) -> None:
        if not change:
            obj.save()
            return
        _through_service(
            connections.model_update,
            actor=Actor.person(request.user),
            model_id=obj.pk,
            changes=_changes(form, connections.MODEL_EDITABLE),
        )
        obj.refresh_from_db()

    def get_readonly_fields(
        self, request: HttpRequest, obj: Model | None = None
    ) -> list[str] | tuple[str, ...]:
        # A model's test belongs to its connection: a model never moves to another one.
        return [*self.readonly_fields, "connection"] if obj else self.readonly_fields

    @admin.action(description="Fill empty prices from the price table (genai-prices)")
    def fill_prices(self, request: HttpRequest, queryset: QuerySet[Model]) -> None:
        for model in queryset:
            try:
                fill = model_fill_prices(actor=Actor.person(request.user), model_id=model.pk)
            except ActhelmError as exc:
                self.message_user(request, f"{model}: {exc}", messages.ERROR)
            else:
                self.message_user(request, f"{fill.model}: {fill.message}")


@admin.register(ToolServer)
class ToolServerAdmin(ToolServerAdminBase):
    """Adding, changing and testing go through agents.catalogue.toolservers (the same checks as the
    command): a stdio command is for superusers or ACTHELM_MCP_EXECUTABLES, an edit of what the
    server runs or reaches resets its test, and a stdio server is tested on a worker host."""

    list_display = ["name", "transport", "trusted", "test_status", "tested_at", "changed_by"]
    list_filter = ["transport", "trusted", "test_status"]
    readonly_fields = [
        "tools",
        "test_status",
        "tested_at",
        "test_message",
        "created_by",
        "changed_by",
        "changed_at",
    ]
    actions = ["test_servers"]

    def _manages(self, request: HttpRequest) -> bool:
        return request.user.has_perm(MANAGE_TOOLSERVERS)

    def has_add_permission(self, request: HttpRequest) -> bool:
        return self._manages(request)

    def has_change_permission(self, request: HttpRequest, obj: ToolServer | None = None) -> bool:
        return self._manages(request)

    def has_delete_permission(self, request: HttpRequest, obj: ToolServer | None = None) -> bool:
        return self._manages(request)

    def get_readonly_fields(
        self, request: HttpRequest, obj: ToolServer | None = None
    ) -> list[str] | tuple[str, ...]:
        # The name is its tools' prefix (SERVER__TOOL): tasks name them, so it never changes.
        return [*self.readonly_fields, "name"] if obj else self.readonly_fields

    def get_form(
        self,
        request: HttpRequest,
        obj: ToolServer | None = None,
        change: bool = False,
        **kwargs: Any,
    ) -> type[forms.ModelForm[ToolServer]]:
        form = super().get_form(request, obj, change=change, **kwargs)
        actor = Actor.person(request.user)

        # A base that is a value (the form the admin built for this request): mypy cannot
        # follow it, and checks this class's methods against an unknown base.
        class Checked(form):  # type: ignore[misc, valid-type]
            def clean_name(self) -> str:
                try:
                    return validate_server_name(self.cleaned_data["name"])
                except ActhelmError as exc:
                    raise forms.ValidationError(str(exc)) from None

            def clean(self) -> dict[str, Any]:
                data: dict[str, Any] = super().clean()
                if self.errors:
                    return data
                if obj is not None and not set(self.changed_data) & set(toolservers.EDITABLE):
                    return data
                check_command = obj is None or bool(
                    {"transport", "command", "credential_env"} & set(self.changed_data)
                )
                try:
                    data |= toolservers.toolserver_check(
                        actor=actor,
                        transport=data.get("transport", ""),
                        command=data.get("command"),
                        url=data.get("url", ""),
                        credential_env=data.get("credential_env", ""),
                        # Cleaned without errors: a required field is there.
                        timeout_seconds=data["timeout_seconds"],
                        check_command=check_command,
                    )
                except ActhelmError as exc:
                    field = exc.field if exc.field in self.fields else None
                    if exc.field == "timeout":
                        field = "timeout_seconds"
                    self.add_error(field, f"{exc} [{exc.code}]")
                return data

        return Checked

    def save_model(
        self,
        request: HttpRequest,
        obj: ToolServer,
        form: forms.ModelForm[ToolServer],
        change: bool,
    ) -> None:
        actor = Actor.person(request.user)
        data = form.cleaned_data
        if not change:
            server = _through_service(
                toolservers.toolserver_add,
                actor=actor,
                name=data["name"],
                transport=data["transport"],
                command=data.get("command"),
                url=data.get("url", ""),
                credential_env=data.get("credential_env", ""),
                trusted=data.get("trusted", False),
                timeout_seconds=data.get("timeout_seconds"),
            )
            obj.pk = server.pk
        else:
            _through_service(
                toolservers.toolserver_update,
                actor=actor,
                name=obj.name,
                changes=_changes(form, toolservers.EDITABLE),
            )
        obj.refresh_from_db()

    @admin.action(description="Test: connect, list the tools and record them")
    def test_servers(self, request: HttpRequest, queryset: QuerySet[ToolServer]) -> None:
        for server in queryset:
            try:
                result = toolservers.toolserver_test(
                    actor=Actor.person(request.user), name=server.name, in_web_process=True
                )
            except ActhelmError as exc:
                self.message_user(request, f"{server}: {exc} [{exc.code}]", messages.ERROR)
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
