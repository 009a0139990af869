"""The console's admin for tasks: filters, the timeline inline, and actions that call services."""

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import Action, ActionLocation
from django.core.exceptions import PermissionDenied
from django.core.files.uploadedfile import UploadedFile
from django.db.models import Count, Q, QuerySet
from django.db.models.expressions import Combinable
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html_join

from agents.actions import goal as goal_actions
from agents.actions import task_change
from console.actions import ConsoleAction, task_actions
from core.actors import Actor
from core.exceptions import ActhelmError, InvalidInput, NotPermitted, TransitionNotAllowed
from tasks.models import Goal, Task, TaskDependency, TaskEvent
from tasks.states import TaskStatus
from tasks.uploads import upload_refusal
from tasks.workspace import (
    add_input_file,
    list_input_files,
    safe_file_name,
    task_inputs_too_large,
)

BOTH = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]

log = logging.getLogger("acthelm.tasks")

if TYPE_CHECKING:
    from typing import TypedDict

    from django_stubs_ext import WithAnnotations

    # django-stubs makes the admin's and the forms' classes generic in their model; Django's own
    # classes take no subscript at run time.
    EventInlineBase = admin.TabularInline[TaskEvent, Task]
    DependencyInlineBase = admin.TabularInline[TaskDependency, Task]
    TaskFormBase = forms.ModelForm[Task]
    TaskAdminBase = admin.ModelAdmin[Task]
    GoalAdminBase = admin.ModelAdmin[Goal]

    class _OpenTasks(TypedDict):
        _open: int

    # A goal as GoalAdmin's queryset annotates it.
    GoalWithOpenTasks = WithAnnotations[Goal, _OpenTasks]
else:
    EventInlineBase = DependencyInlineBase = admin.TabularInline
    TaskFormBase = forms.ModelForm
    TaskAdminBase = GoalAdminBase = admin.ModelAdmin

# An admin action: the admin, the request, the selected rows.
type AdminAction = Callable[
    [admin.ModelAdmin[Task], HttpRequest, QuerySet[Task]], TemplateResponse | None
]


class TaskEventInline(EventInlineBase):
    model = TaskEvent
    fields = ["created_at", "kind", "actor_kind", "actor_label", "from_status", "to_status", "data"]
    # Every field shown is read-only (the stubs type `fields` wider: it may hold groups).
    readonly_fields = fields  # type: ignore[assignment]
    extra = 0
    can_delete = False
    ordering = ["-id"]
    max_num = 0
    show_change_link = False

    def get_queryset(self, request: HttpRequest) -> QuerySet[TaskEvent]:
        return super().get_queryset(request).order_by("-id")


class DependencyInline(DependencyInlineBase):
    model = TaskDependency
    fk_name = "task"
    extra = 0
    raw_id_fields = ["depends_on"]
    readonly_fields = ["depends_on"]
    can_delete = False
    max_num = 0


def _admin_action(entry: ConsoleAction) -> AdminAction:
    """The admin's bulk action for a registry entry: its service on each selected task. An
    input the entry requires and gives no admin default for (accept's reason) is asked for on
    a page of its own first."""
    defaults = {i.name: i.admin_default for i in entry.inputs if i.admin_default is not None}
    asks = [i for i in entry.inputs if i.required and i.admin_default is None]

    def run(
        modeladmin: "admin.ModelAdmin[Task]", request: HttpRequest, queryset: QuerySet[Task]
    ) -> TemplateResponse | None:
        given = {i.name: request.POST.get(i.name, "").strip() for i in asks}
        if asks and ("apply" not in request.POST or not all(given.values())):
            context = {
                **modeladmin.admin_site.each_context(request),
                "title": entry.admin,
                "entry": entry,
                "asks": asks,
                "tasks": queryset.order_by("id"),
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "missing": "apply" in request.POST,
                "opts": Task._meta,
            }
            return TemplateResponse(request, "admin/tasks/task/action_inputs.html", context)
        actor = Actor.person(request.user)
        inputs = given | {
            name: request.POST.get(name, "").strip() or default
            for name, default in defaults.items()
        }
        done, refused = 0, []
        for task_id in queryset.values_list("pk", flat=True):
            try:
                entry.call(actor=actor, target_id=task_id, **inputs)
                done += 1
            except ActhelmError as exc:
                refused.append(f"#{task_id}: {exc} [{exc.code}]")
        if done:
            modeladmin.message_user(
                request, f"{entry.admin_done}: {done} task(s).", messages.SUCCESS
            )
        for line in refused:
            modeladmin.message_user(request, line, messages.ERROR)
        return None

    run.__name__ = entry.admin_name
    return admin.action(description=entry.admin, location=BOTH)(run)


# One admin action per registry entry that has one (console.actions).
ADMIN_ACTIONS = {entry.admin_name: entry for entry in task_actions() if entry.admin}


class TaskAdminForm(TaskFormBase):
    """The task's fields, plus one input file that Save copies into the task's workspace."""

    input_file = forms.FileField(
        required=False,
        label="Add an input file",
        help_text="Copied into the task's workspace, where its tools can read it. "
        "A file of the same name is replaced.",
    )

    # No Meta: ModelAdmin.get_form builds the Task form around this class.
    #: Why an upload of this request was dropped while it streamed (set by TaskAdmin.get_form).
    upload_refused: str | None = None

    def clean(self) -> dict[str, Any]:
        # The service's own check, so a bad edit comes back as a form error (not a 500, and
        # never saved): unknown tools, a policy such as "ASK", limits out of range, a model of
        # another connection.
        data = super().clean()
        assert data is not None  # ModelForm.clean returns cleaned_data
        if self.instance.pk:
            changes = {
                name: data[name]
                for name in self.changed_data
                if name in task_change.EDITABLE_FIELDS and name in data
            }
            try:
                task_change.task_edit_check(task=self.instance, changes=changes)
            except InvalidInput as exc:
                raise forms.ValidationError(f"{exc.message} [{exc.code}]") from None
        return data

    def clean_input_file(self) -> "UploadedFile[bytes] | None":
        upload: UploadedFile[bytes] | None = self.cleaned_data.get("input_file")
        if self.upload_refused:  # over a cap: tasks.uploads dropped it while it streamed
            raise forms.ValidationError(self.upload_refused)
        if not upload:
            return None
        if self.instance.pk and self.instance.is_held:
            raise forms.ValidationError(
                "A worker is running this task: add files while it is not running."
            )
        assert upload.name is not None  # FileField takes no upload without a name
        try:
            name = safe_file_name(upload.name)
        except InvalidInput as exc:
            raise forms.ValidationError(exc.message) from None
        if self.instance.pk:
            others = sum(f["size"] for f in list_input_files(self.instance.pk) if f["name"] != name)
            if others + (upload.size or 0) > settings.ACTHELM_TASK_INPUTS_MAX_BYTES:
                raise forms.ValidationError(task_inputs_too_large())
        return upload


@admin.register(Task)
class TaskAdmin(TaskAdminBase):
    form = TaskAdminForm

    def get_form(
        self, request: HttpRequest, obj: Task | None = None, change: bool = False, **kwargs: Any
    ) -> type[TaskAdminForm]:
        form = super().get_form(request, obj, change, **kwargs)  # a class made for this request
        assert issubclass(form, TaskAdminForm)  # made from self.form
        form.upload_refused = upload_refusal(request)
        return form

    list_display = ["id", "title", "status", "kind", "goal", "connection", "priority", "updated_at"]
    list_filter = ["status", "kind", "is_evaluation", "goal", "connection"]
    search_fields = ["title", "instruction"]
    list_select_related = ["goal", "connection"]
    list_per_page = 50
    show_full_result_count = False
    readonly_fields = [
        "status",
        "origin",
        "claim_count",
        "lease_owner",
        "lease_expires_at",
        "not_before",
        "failed_attempts",
        "lost_count",
        "failure_code",
        "failure_message",
        "feedback",
        "created_by",
        "created_at",
        "updated_at",
        "input_files",
    ]
    raw_id_fields = ["spawned_by"]
    inlines = [DependencyInline, TaskEventInline]
    actions = [_admin_action(entry) for entry in ADMIN_ACTIONS.values()]

    def get_actions(
        self, request: HttpRequest, action_location: ActionLocation = ActionLocation.CHANGE_LIST
    ) -> dict[str, Action | None]:
        """The registry's actions this person may take. Those marked admin_in_state_only (close,
        reopen: the review queue's) appear only where the rows are in a state that allows them:
        the change list filtered to such a state, or the page of such a task."""
        actions = super().get_actions(request, action_location)
        if action_location == ActionLocation.CHANGE_FORM:
            assert request.resolver_match is not None  # the change page's URL was resolved
            object_id = request.resolver_match.kwargs.get("object_id")
            status = (
                Task.objects.filter(pk=object_id).values_list("status", flat=True).first()
                if object_id is not None
                else None
            )
        else:
            status = request.GET.get("status__exact")
        for name, entry in ADMIN_ACTIONS.items():
            if not request.user.has_perm(entry.perm) or (
                entry.admin_in_state_only and status not in entry.states
            ):
                actions.pop(name, None)
        return actions

    def get_ordering(
        self, request: HttpRequest
    ) -> list[str | Combinable] | tuple[str | Combinable, ...]:
        # The review queue: the task that has waited longest comes first.
        if request.GET.get("status__exact") == TaskStatus.REVIEW:
            return ["updated_at", "id"]
        return super().get_ordering(request)

    @admin.display(description="Input files")
    def input_files(self, obj: Task | None) -> str:
        files = list_input_files(obj.pk) if obj and obj.pk else []
        if not files:
            return "none"
        return format_html_join(", ", "{} ({} bytes)", ((f["name"], f["size"]) for f in files))

    def save_model(
        self, request: HttpRequest, obj: Task, form: TaskAdminForm, change: bool
    ) -> None:
        # Write only what this form changed, and never under a worker: a claim that happened
        # after the page was loaded must not be undone by a Save of the old row.
        # agents.actions.task_change.task_update checks the edit, refuses it under a worker and
        # writes the `edited` event.
        changes = {
            name: form.cleaned_data[name]
            for name in form.changed_data
            if name in task_change.EDITABLE_FIELDS
        }
        if changes:
            try:
                task_change.task_update(
                    actor=Actor.person(request.user), task_id=obj.pk, changes=changes
                )
            except (NotPermitted, TransitionNotAllowed) as exc:
                raise PermissionDenied(str(exc)) from None
        upload = form.cleaned_data.get("input_file")
        if upload:
            path = add_input_file(obj.pk, name=upload.name, data=upload)
            log.info(
                "admin.input_file_added",
                extra={"task_id": obj.pk, "file": path.name, "actor": request.user.get_username()},
            )

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False  # tasks are created through the console or acthelm_task create

    def has_delete_permission(self, request: HttpRequest, obj: Task | None = None) -> bool:
        return False  # deletion goes through services.task_delete (done/failed/cancelled only)

    def get_readonly_fields(
        self, request: HttpRequest, obj: Task | None = None
    ) -> list[str] | tuple[str, ...]:
        fields = list(self.readonly_fields)
        if obj is not None and obj.is_held:
            # A worker holds the task: nothing a person edits here may change under it.
            fields += [f.name for f in Task._meta.fields if f.name not in fields]
        return fields


@admin.register(Goal)
class GoalAdmin(GoalAdminBase):
    list_display = ["id", "title", "active", "open_tasks", "created_at"]
    list_filter = ["active"]
    search_fields = ["title"]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Goal]:
        closed = [TaskStatus.DONE, TaskStatus.CANCELLED]
        return (
            super()
            .get_queryset(request)
            .annotate(_open=Count("tasks", filter=~Q(tasks__status__in=closed)))
        )

    @admin.display(description="Open tasks")
    def open_tasks(self, obj: "GoalWithOpenTasks") -> int:
        return obj._open

    def get_readonly_fields(
        self, request: HttpRequest, obj: Goal | None = None
    ) -> list[str] | tuple[str, ...]:
        return ["created_by"]  # the person who created the goal (`goal_create` records them)

    def save_model(self, request: HttpRequest, obj: Goal, form: Any, change: bool) -> None:
        # A new goal goes through the one `goal_create` that every door calls (its permission,
        # its checks, its log), a deactivation through `goal_deactivate`.
        actor = Actor.person(request.user)
        try:
            if not change:
                created = goal_actions.goal_create(
                    actor=actor, title=obj.title, description=obj.description
                )
                if not obj.active:
                    created = goal_actions.goal_deactivate(actor=actor, goal_id=created.pk)
                obj.__dict__.update(created.__dict__)  # the admin logs and links the saved goal
                return
            if "active" in form.changed_data and not obj.active:
                goal_actions.goal_deactivate(actor=actor, goal_id=obj.pk)
        except ActhelmError as exc:
            raise PermissionDenied(str(exc)) from None
        super().save_model(request, obj, form, change)


# Notification targets and the outbox register their own admin.
# The person's page with their Slack user id.
import console.admin_people  # noqa: E402, F401
import tasks.notify.admin  # noqa: E402, F401
