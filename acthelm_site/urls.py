from django.contrib import admin
from django.urls import include, path

from acthelm_site.api.endpoints import api

admin.site.site_header = "Acthelm"
admin.site.site_title = "Acthelm console"
admin.site.index_title = "Administration"

urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/", api.urls),
    path("", include("console.urls")),
]
