"""The evaluation page. Included at /eval/ by the site's URLconf."""

from django.urls import path

from agents import eval_views

app_name = "eval"

urlpatterns = [
    path("", eval_views.evaluation, name="index"),
]
