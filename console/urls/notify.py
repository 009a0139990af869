from django.urls import path

from console.views import notify as views

app_name = "notify"

urlpatterns = [
    path("", views.notifications, name="deliveries"),
]
