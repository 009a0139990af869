"""API tokens in the admin: created through acthelm_site.api.tokens (the token is shown once, on
the page that answers the creation, and stored nowhere), revoked by an action."""

from django import forms
from django.contrib import admin, messages
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.template.response import TemplateResponse

from acthelm_site.api import tokens
from acthelm_site.api.models import ApiToken
from core.exceptions import NotPermitted


class ApiTokenCreateForm(forms.ModelForm):
    """Who the token is for: active staff only (acthelm_site.api.tokens), and only oneself unless
    the person creating it is a superuser. ``creator`` is set by the admin."""

    creator = None

    class Meta:
        model = ApiToken
        fields = ["user", "name"]

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        holders = get_user_model().objects.filter(is_active=True, is_staff=True)
        if self.creator is not None and not self.creator.is_superuser:
            holders = holders.filter(pk=self.creator.pk)
        self.fields["user"].queryset = holders

    def clean(self):
        data = super().clean()
        user, name = data.get("user"), (data.get("name") or "").strip()
        if user and name and user.api_tokens.filter(name=name, revoked_at__isnull=True).exists():
            self.add_error("name", f"{user.get_username()} already has a live token named {name!r}")
        return data


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
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

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = type(
                "ApiTokenCreateForm", (ApiTokenCreateForm,), {"creator": request.user}
            )
        return super().get_form(request, obj, change=change, **kwargs)

    def get_readonly_fields(self, request, obj=None):
        return self.readonly_fields if obj is not None else []

    def get_fields(self, request, obj=None):
        return ["user", "name"] if obj is None else self.readonly_fields

    def has_delete_permission(self, request, obj=None):
        return False  # revoke instead: the row records who had access and when it was used

    def save_model(self, request, obj, form, change):
        if change:
            return
        # The form validated the name (and, through the model's constraint, that the person has
        # no live token of that name); the service draws the secret and stores its hash.
        try:
            new = tokens.token_create(
                user=form.cleaned_data["user"],
                name=form.cleaned_data["name"],
                created_by=request.user,
            )
        except NotPermitted as exc:
            raise PermissionDenied(str(exc)) from None
        obj.pk, obj.prefix, obj.created_at = new.token.pk, new.token.prefix, new.token.created_at
        request._acthelm_new_token = new

    def response_add(self, request, obj, post_url_continue=None):
        """The only page that ever shows the token: rendered, not redirected, so it passes
        through no message storage, cookie or log."""
        new = getattr(request, "_acthelm_new_token", None)
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
    def revoke(self, request, queryset):
        done = 0
        for token in queryset.filter(revoked_at__isnull=True):
            tokens.token_revoke(token_id=token.pk)
            done += 1
        self.message_user(request, f"{done} token(s) revoked.", messages.SUCCESS)
