"""The person's admin page shows and edits their Slack user id (`SlackIdentity`): the only way
a Slack click becomes a person's decision."""

from typing import TYPE_CHECKING

from django.contrib import admin
from django.contrib.auth.admin import UserAdmin
from django.contrib.auth.models import User

from console.models import SlackIdentity

if TYPE_CHECKING:
    _Inline = admin.StackedInline[SlackIdentity, User]
    _UserAdmin = UserAdmin[User]
else:
    _Inline = admin.StackedInline
    _UserAdmin = UserAdmin


class SlackIdentityInline(_Inline):
    model = SlackIdentity
    can_delete = True
    max_num = 1
    extra = 1
    fields = ["slack_user_id", "updated_at"]
    readonly_fields = ["updated_at"]
    verbose_name = "Slack user"
    verbose_name_plural = "Slack user (decides from Slack's Approve / Deny buttons)"


class PersonAdmin(_UserAdmin):
    inlines = [SlackIdentityInline]
    list_display = ["username", "email", "first_name", "last_name", "is_staff", "slack_user_id"]
    list_select_related = ["slack_identity"]
    search_fields = [
        "username",
        "first_name",
        "last_name",
        "email",
        "slack_identity__slack_user_id",
    ]

    @admin.display(description="Slack user id")
    def slack_user_id(self, obj: User) -> str:
        identity = getattr(obj, "slack_identity", None)
        return identity.slack_user_id if identity else ""


if admin.site.is_registered(User):
    admin.site.unregister(User)
admin.site.register(User, PersonAdmin)
