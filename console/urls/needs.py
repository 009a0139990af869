from django.urls import path

from console.views import needs as needs_views

app_name = "needs"

urlpatterns = [
    path("", needs_views.needs_me, name="index"),
    path("counts/", needs_views.nav_counts, name="counts"),
]
