"""Operations: health and metrics for machines, the worker page for people."""

from django.urls import path

from console.views import ops as ops_views

app_name = "ops"

urlpatterns = [
    path("favicon.ico", ops_views.favicon, name="favicon"),
    path("healthz", ops_views.healthz, name="healthz"),
    path("metrics", ops_views.metrics, name="metrics"),
    path("workers/", ops_views.workers, name="workers"),
]
