"""The scorecard page. Included at /scorecard/ by the site's URLconf."""

from django.urls import path

from agents.scorecard import views

app_name = "scorecard"

urlpatterns = [
    path("", views.scorecard, name="index"),
]
