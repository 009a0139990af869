"""API tokens in the admin: created through acthelm_site.api.tokens (the token is shown once, on
the page that answers the creation, and stored nowhere), revoked by an action."""

from typing import TYPE_CHECKING, Any

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied
from django.db.models import QuerySet
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse

from acthelm_site.api import tokens
from acthelm_site.api.models import ApiToken
from core.exceptions import NotPermitted

if TYPE_CHECKING:
    # Generic to the checker only (django-stubs): at run time ModelForm and ModelAdmin take no
    # parameter, and django_stubs_ext (which could patch them) is a development dependency.
    _TokenModelForm = forms.ModelForm[ApiToken]
    _TokenModelAdmin = admin.ModelAdmin[ApiToken]
    from django.contrib.admin.options import _FieldGroups
else:
    _TokenModelForm = forms.ModelForm
    _TokenModelAdmin = admin.ModelAdmin

# The request attribute that carries a new token from save_model to response_add, and no further.
NEW_TOKEN = "_acthelm_new_token"


def _person(request: HttpRequest) -> User:
    """Who uses the admin: its site lets only active staff in."""
    user = request.user
    assert user.is_authenticated  # the admin site's own check, before any of its pages
    return user


class ApiTokenCreateForm(_TokenModelForm):
    """Who the token is for: active staff only (acthelm_site.api.tokens), and only oneself unless
    the person creating it is a superuser. ``creator`` is set by the admin."""

    creator: User | None = None

    class Meta:
        model = ApiToken
        fields = ["user", "name"]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        holders = get_user_model().objects.filter(is_active=True, is_staff=True)
        if self.creator is not None and not self.creator.is_superuser:
            holders = holders.filter(pk=self.creator.pk)
        field = self.fields["user"]
        assert isinstance(field, forms.ModelChoiceField)  # the form field of a ForeignKey
        field.queryset = holders

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        assert data is not None  # a ModelForm's clean returns its cleaned_data
        user, name = data.get("user"), (data.get("name") or "").strip()
        if user and name and user.api_tokens.filter(name=name, revoked_at__isnull=True).exists():
            self.add_error("name", f"{user.get_username()} already has a live token named {name!r}")
        return data


@admin.register(ApiToken)
class ApiTokenAdmin(_TokenModelAdmin):
    list_display = ["display", "name", "user", "created_at", "last_used_at", "revoked_at"]
    list_filter = [("revoked_at", admin.EmptyFieldListFilter)]
    search_fields = ["name", "prefix", "user__username"]
    list_select_related = ["user"]
    actions = ["revoke"]
    readonly_fields = [
        "user",
        "name",
        "display",
        "created_by",
        "created_at",
        "last_used_at",
        "revoked_at",
    ]

    def get_form(
        self, request: HttpRequest, obj: ApiToken | None = None, change: bool = False, **kwargs: Any
    ) -> type[_TokenModelForm]:
        if obj is None:
            kwargs["form"] = type(
                "ApiTokenCreateForm", (ApiTokenCreateForm,), {"creator": _person(request)}
            )
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(
        self, request: HttpRequest, obj: ApiToken | None = None
    ) -> list[str] | tuple[str, ...]:
        return self.readonly_fields if obj is not None else []

    def get_fields(self, request: HttpRequest, obj: ApiToken | None = None) -> "_FieldGroups":
        return ["user", "name"] if obj is None else list(self.readonly_fields)

    def has_delete_permission(self, request: HttpRequest, obj: ApiToken | None = None) -> bool:
        return False  # revoke instead: the row records who had access and when it was used

    def save_model(
        self, request: HttpRequest, obj: ApiToken, form: ApiTokenCreateForm, change: bool
    ) -> None:
        if change:
            return
        # The form validated the name (and, through the model's constraint, that the person has
        # no live token of that name); the service draws the secret and stores its hash.
        try:
            new = tokens.token_create(
                user=form.cleaned_data["user"],
                name=form.cleaned_data["name"],
                created_by=_person(request),
            )
        except NotPermitted as exc:
            raise PermissionDenied(str(exc)) from None
        obj.pk, obj.prefix, obj.created_at = new.token.pk, new.token.prefix, new.token.created_at
        setattr(request, NEW_TOKEN, new)

    def response_add(
        self, request: HttpRequest, obj: ApiToken, post_url_continue: str | None = None
    ) -> HttpResponse:
        """The only page that ever shows the token: rendered, not redirected, so it passes
        through no message storage, cookie or log."""
        new: tokens.NewToken | None = getattr(request, NEW_TOKEN, None)
        if new is None:
            return super().response_add(request, obj, post_url_continue)
        context = {
            **self.admin_site.each_context(request),
            "opts": self.model._meta,
            "token": new.token,
            "secret": new.secret,
            "title": "API token created",
        }
        response = TemplateResponse(request, "api/token_created.html", context)
        response["Cache-Control"] = "no-store"
        return response

    @admin.action(description="Revoke selected tokens", permissions=["change"])
    def revoke(self, request: HttpRequest, queryset: QuerySet[ApiToken]) -> None:
        done = 0
        for token in queryset.filter(revoked_at__isnull=True):
            tokens.token_revoke(token_id=token.pk)
            done += 1
        self.message_user(request, f"{done} token(s) revoked.", messages.SUCCESS)
