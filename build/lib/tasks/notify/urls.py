from django.urls import path

from tasks.notify import views

app_name = "notify"

urlpatterns = [
    path("", views.notifications, name="deliveries"),
]
