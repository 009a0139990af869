"""The evaluation page. Included at /eval/ by the site's URLconf."""

from django.urls import path

from console.views import eval as views

app_name = "eval"

urlpatterns = [
    path("", views.evaluation, name="index"),
]
