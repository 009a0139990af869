from django.contrib import admin

from memory.models import MemoryEntry, MemorySelection


@admin.register(MemoryEntry)
class MemoryEntryAdmin(admin.ModelAdmin):
    list_display = ["title", "scope", "goal", "tag", "active", "updated_at"]
    list_filter = ["scope", "active"]
    search_fields = ["title", "body"]

    def save_model(self, request, obj, form, change):
        if not change:
            obj.author = request.user
        super().save_model(request, obj, form, change)


@admin.register(MemorySelection)
class MemorySelectionAdmin(admin.ModelAdmin):
    list_display = ["run", "position", "title", "rank", "chars"]
    raw_id_fields = ["run", "entry"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
