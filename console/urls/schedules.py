from django.urls import path

from console.views import schedules as views

app_name = "schedules"

urlpatterns = [
    path("", views.schedule_list, name="list"),
    path("new/", views.schedule_create, name="create"),
    path("<int:pk>/", views.schedule_detail, name="detail"),
    *(
        path(
            f"<int:pk>/{name.replace('_', '-')}/",
            views.schedule_action,
            {"action": name},
            name=name,
        )
        for name in views.ACTIONS
    ),
]
