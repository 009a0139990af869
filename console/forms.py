"""Forms of the console's task pages. They only parse input; the services decide (a new task:
`agents.actions.task.task_create_by_name`, as for the API and the CLI)."""

import re
from decimal import Decimal
from typing import TYPE_CHECKING, Any, cast

from django import forms
from django.conf import settings
from django.core.exceptions import ValidationError
from django.core.files.uploadedfile import UploadedFile
from django.db.models import QuerySet

from agents.catalogue.tools import tool_names
from agents.engine.verdict.acceptance import (
    check_text,
    checks_from_lines,
    kind_names,
    validate_checks,
)
from agents.models import Connection, Model
from core.exceptions import InvalidInput
from core.numbers import INT32_MAX, INT32_MIN
from tasks.limits import BY_FIELD, LIMIT_FIELDS
from tasks.models import Goal, Task
from tasks.services import default_limits

_SPLIT = re.compile(r"[\s,]+")


def split_words(value: str) -> list[str]:
    return [part for part in _SPLIT.split(value or "") if part]


class MultipleFileInput(forms.ClearableFileInput):
    allow_multiple_selected = True


class MultipleFileField(forms.FileField):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("widget", MultipleFileInput())
        super().__init__(*args, **kwargs)

    def clean(self, data: Any, initial: Any | None = None) -> "list[UploadedFile[bytes]]":
        single = super().clean
        if isinstance(data, list | tuple):
            return [single(item, initial) for item in data if item]
        return [single(data, initial)] if data else []


# ModelChoiceField is generic in django-stubs only (django_stubs_ext.monkeypatch is not applied).
if TYPE_CHECKING:
    _ModelChoiceField = forms.ModelChoiceField[Model]
else:
    _ModelChoiceField = forms.ModelChoiceField


class ModelChoice(_ModelChoiceField):
    def label_from_instance(self, obj: Model) -> str:
        return f"{obj.connection.name}/{obj.name} ({obj.get_test_status_display().lower()})"


def model_queryset() -> QuerySet[Model]:
    return Model.objects.select_related("connection").order_by("connection__name", "name")


class TaskCreateForm(forms.Form):
    title = forms.CharField(max_length=200)
    instruction = forms.CharField(widget=forms.Textarea(attrs={"rows": 6}))
    goal = forms.ModelChoiceField(queryset=Goal.objects.none(), required=False, empty_label="none")
    priority = forms.IntegerField(
        initial=0, min_value=INT32_MIN, max_value=INT32_MAX, help_text="Higher runs first."
    )
    tools = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    ask_tools = forms.MultipleChoiceField(
        required=False,
        widget=forms.CheckboxSelectMultiple,
        label="Ask a person first",
    )
    allowed_domains = forms.CharField(
        required=False,
        widget=forms.Textarea(attrs={"rows": 2}),
        help_text="Domains fetch_url may reach without asking; one per line or comma-separated.",
    )
    connection = forms.ModelChoiceField(
        queryset=Connection.objects.none(), required=False, empty_label="default"
    )
    model = ModelChoice(
        queryset=Model.objects.none(),
        required=False,
        empty_label="default",
        help_text="Default: the best tested, zero-cost model; tool-capable when the task has tools "
        "(with none ticked, a model CLI's may be chosen).",
    )
    tags = forms.CharField(required=False, help_text="Comma-separated.")
    # The metaclass moves every declared field into `base_fields`: `self.files` stays the form's
    # uploads, which is what django-stubs types that name as.
    files = MultipleFileField(  # type: ignore[assignment]
        required=False, help_text="Copied into the task's workspace."
    )
    acceptance_checks = forms.CharField(
        required=False,
        label="Acceptance checks",
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "artifact=summary.md"}),
        help_text="What finished means, checked before the task reaches review: one KIND=VALUE "
        "per line, e.g. artifact=summary.md, answer_contains=42, "
        "artifact_contains=summary.md:total, tool_ran=read_file, answer_not_echo. Kinds: "
        + kind_names()
        + ".",
    )

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        choices = [(name, name) for name in tool_names()]
        # `fields` holds them as plain Fields: the declarations above say which kind each is.
        fields = self.fields
        cast(forms.MultipleChoiceField, fields["tools"]).choices = choices
        cast(forms.MultipleChoiceField, fields["ask_tools"]).choices = choices
        fields["tools"].initial = list(settings.ACTHELM_DEFAULT_TOOLS)
        goal = cast("forms.ModelChoiceField[Goal]", fields["goal"])
        goal.queryset = Goal.objects.filter(active=True).order_by("title")
        connection = cast("forms.ModelChoiceField[Connection]", fields["connection"])
        connection.queryset = Connection.objects.order_by("name")
        cast(ModelChoice, fields["model"]).queryset = model_queryset()
        for field, value in default_limits().items():
            if BY_FIELD[field].money:
                self.fields[field] = forms.DecimalField(
                    required=False,
                    min_value=Decimal("0.0001"),
                    max_digits=12,
                    decimal_places=4,
                    initial=value,
                    label=BY_FIELD[field].label,
                )
                continue
            # Empty means the default (service_kwargs leaves it out).
            self.fields[field] = forms.IntegerField(
                min_value=1,
                max_value=INT32_MAX,
                initial=value,
                required=False,
                label=BY_FIELD[field].label,
            )

    def limit_fields(self) -> list[forms.BoundField]:
        return [self[field] for field in LIMIT_FIELDS]

    def clean_acceptance_checks(self) -> list[str]:
        lines = checks_from_lines(self.cleaned_data.get("acceptance_checks") or "")
        try:
            validate_checks(lines)
        except InvalidInput as exc:
            raise ValidationError(exc.message) from None
        return lines

    def service_kwargs(self) -> dict[str, Any]:
        data = self.cleaned_data
        return {
            "title": data["title"],
            "instruction": data["instruction"],
            "goal": data.get("goal"),
            "priority": data.get("priority") or 0,
            "tools": list(data.get("tools") or []),
            "tool_policies": {tool: "ask" for tool in data.get("ask_tools") or []},
            "allowed_domains": split_words(data.get("allowed_domains", "")),
            "connection": data.get("connection"),
            "model": data.get("model"),
            "tags": [t.strip() for t in (data.get("tags") or "").split(",") if t.strip()],
            "limits": {field: data[field] for field in LIMIT_FIELDS if data.get(field)},
            "acceptance_checks": list(data.get("acceptance_checks") or []),
        }


CONTINUE, START_OVER = "continue", "start_over"


class TaskEditForm(forms.Form):
    """Change a task that is not running: its instruction, acceptance checks, tools and limits
    (`agents.actions.task_change.task_update` checks and records the change). Only the fields the
    person changed are passed on."""

    instruction = forms.CharField(widget=forms.Textarea(attrs={"rows": 6}))
    acceptance_checks = TaskCreateForm.base_fields["acceptance_checks"]
    tools = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    ask_tools = forms.MultipleChoiceField(
        required=False, widget=forms.CheckboxSelectMultiple, label="Ask a person first"
    )
    # How "Save and retry now" runs it again (`agents.actions.task_change.task_change_and_retry`).
    then = forms.ChoiceField(
        required=False,
        initial=CONTINUE,
        widget=forms.RadioSelect,
        label="How the retry goes on",
        choices=[
            (
                CONTINUE,
                "Continue the conversation: the model keeps what it has done and is told, in "
                "one message, the task as changed and the checks now in force",
            ),
            (
                START_OVER,
                "Start over: a fresh conversation from the new instruction (the earlier runs "
                "stay on record)",
            ),
        ],
    )

    def __init__(self, *args: Any, task: Task, **kwargs: Any) -> None:
        policies = task.tool_policies or {}
        initial = {
            "instruction": task.instruction,
            "acceptance_checks": "\n".join(check_text(c) for c in task.acceptance_checks or []),
            "tools": list(task.tools),
            "ask_tools": sorted(t for t, p in policies.items() if p == "ask"),
            **{field: getattr(task, field) for field in LIMIT_FIELDS},
        }
        kwargs["initial"] = initial
        super().__init__(*args, **kwargs)
        self.task = task
        choices = [(name, name) for name in sorted({*tool_names(), *task.tools})]
        cast(forms.MultipleChoiceField, self.fields["tools"]).choices = choices
        cast(forms.MultipleChoiceField, self.fields["ask_tools"]).choices = choices
        for field in LIMIT_FIELDS:
            limit = BY_FIELD[field]
            if limit.money:
                self.fields[field] = forms.DecimalField(
                    required=False,
                    min_value=Decimal("0.0001"),
                    max_digits=12,
                    decimal_places=4,
                    label=limit.label,
                    help_text="Empty: no budget.",
                )
            else:
                self.fields[field] = forms.IntegerField(
                    min_value=1, max_value=INT32_MAX, label=limit.label
                )

    def limit_fields(self) -> list[forms.BoundField]:
        return [self[field] for field in LIMIT_FIELDS]

    def clean_acceptance_checks(self) -> list[str]:
        return checks_from_lines(self.cleaned_data.get("acceptance_checks") or "")

    def start_over(self) -> bool:
        return self.cleaned_data.get("then") == START_OVER

    def changes(self) -> dict[str, Any]:
        """What the person changed, as `task_update` takes it."""
        data, changed = self.cleaned_data, set(self.changed_data)
        out: dict[str, Any] = {}
        if "instruction" in changed:
            out["instruction"] = data["instruction"]
        if "acceptance_checks" in changed:
            out["acceptance_checks"] = list(data["acceptance_checks"])
        if "tools" in changed:
            out["tools"] = list(data["tools"])
        if changed & {"tools", "ask_tools"}:
            tools = set(data["tools"])
            out["tool_policies"] = {t: "ask" for t in data["ask_tools"] if t in tools}
        for field in LIMIT_FIELDS:
            if field in changed:
                out[field] = data.get(field)
        return out
