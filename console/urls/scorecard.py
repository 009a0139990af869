"""The scorecard page. Included at /scorecard/ by the site's URLconf."""

from django.urls import path

from console.views import scorecard as views

app_name = "scorecard"

urlpatterns = [
    path("", views.scorecard, name="index"),
]
