from django.urls import path

from console.views import connections as views

app_name = "agents"

urlpatterns = [
    path("", views.connections, name="connections"),
    path("add/", views.connection_add, name="connection_add"),
    path("prices/", views.model_prices, name="model_prices"),
    path("<int:pk>/test/", views.connection_test, name="connection_test"),
    path(
        "<int:pk>/test/progress/",
        views.connection_test_progress,
        name="connection_test_progress",
    ),
]
