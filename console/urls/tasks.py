from django.urls import include, path

from console.actions import task_actions
from console.views import files as file_views
from console.views import goals as goal_views
from console.views import review as review_views
from console.views import tasks as views

task_patterns = [
    path("", views.task_list, name="list"),
    path("tasks/new/", views.task_create, name="create"),
    path("tasks/<int:pk>/", views.task_detail, name="detail"),
    # One URL per task-wide action, all served by the one view: /tasks/7/withdraw-pause/.
    *(
        path(
            f"tasks/<int:pk>/{action.slug}/",
            views.task_action,
            {"action": action.name},
            name=action.name,
        )
        for action in task_actions()
    ),
    path("tasks/<int:pk>/model-check/", views.task_model_check, name="model_check"),
    path("tasks/<int:pk>/retry-now/", views.task_retry_now, name="retry_now"),
    path("tasks/<int:pk>/edit/", views.task_edit, name="edit"),
    path("tasks/<int:pk>/live/", views.task_live, name="live"),
    path("tasks/<int:pk>/calls/<int:call_pk>/result/", views.task_call_result, name="call_result"),
    path("tasks/<int:pk>/artifacts/<int:artifact_pk>/", views.task_artifact, name="artifact"),
    path(
        "tasks/<int:pk>/artifacts/<int:artifact_pk>/view/",
        file_views.artifact_view,
        name="artifact_view",
    ),
    path("tasks/<int:pk>/inputs/<str:name>/", file_views.input_view, name="input_view"),
    path(
        "tasks/<int:pk>/inputs/<str:name>/download/",
        file_views.input_download,
        name="input_download",
    ),
    path("goals/<int:pk>/", goal_views.goal_detail, name="goal"),
    path("review/", review_views.review_queue, name="review"),
    path("review/bulk/", review_views.review_bulk, name="review_bulk"),
]

urlpatterns = [
    path("", include((task_patterns, "tasks"))),
    path("connections/", include("console.urls.connections")),
]
