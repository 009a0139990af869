"""The scorecard page. Included at /scorecard/ by the site's URLconf."""

from django.urls import path

from agents import scorecard_views

app_name = "scorecard"

urlpatterns = [
    path("", scorecard_views.scorecard, name="index"),
]
