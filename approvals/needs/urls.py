from django.urls import path

from approvals.needs import views as needs_views

app_name = "needs"

urlpatterns = [
    path("", needs_views.needs_me, name="index"),
    path("counts/", needs_views.nav_counts, name="counts"),
]
