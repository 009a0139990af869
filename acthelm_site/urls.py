from django.contrib import admin
from django.urls import path
from django.views.generic import RedirectView

admin.site.site_header = "Acthelm"
admin.site.site_title = "Acthelm console"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("", RedirectView.as_view(url="/admin/", permanent=False)),
]
