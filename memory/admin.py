from typing import TYPE_CHECKING, Any

from django.contrib import admin
from django.http import HttpRequest

from memory.models import MemoryEntry, MemorySelection

# ModelAdmin is generic in django-stubs only (django_stubs_ext.monkeypatch is not applied).
if TYPE_CHECKING:
    _EntryAdmin = admin.ModelAdmin[MemoryEntry]
    _SelectionAdmin = admin.ModelAdmin[MemorySelection]
else:
    _EntryAdmin = _SelectionAdmin = admin.ModelAdmin


@admin.register(MemoryEntry)
class MemoryEntryAdmin(_EntryAdmin):
    list_display = ["title", "scope", "goal", "tag", "active", "updated_at"]
    list_filter = ["scope", "active"]
    search_fields = ["title", "body"]

    def save_model(self, request: HttpRequest, obj: MemoryEntry, form: Any, change: bool) -> None:
        # The admin lets in only a signed-in staff member: the user is never anonymous here.
        if not change and request.user.is_authenticated:
            obj.author = request.user
        super().save_model(request, obj, form, change)


@admin.register(MemorySelection)
class MemorySelectionAdmin(_SelectionAdmin):
    list_display = ["run", "position", "title", "rank", "chars"]
    raw_id_fields = ["run", "entry"]

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: MemorySelection | None = None
    ) -> bool:
        return False
