"""A notification's link to one decision, and Slack's interactivity requests. Included at
/decide/ by the console's URLconf."""

from django.urls import path

from console.views import links, slack

app_name = "decisions"

urlpatterns = [
    path("slack/interactivity/", slack.interactivity, name="slack_interactivity"),
    path("<str:kind>/<str:token>/", links.decision_link, name="link"),
]
