from django.urls import include, path

from tasks import views

task_patterns = [
    path("", views.task_list, name="list"),
    path("tasks/new/", views.task_create, name="create"),
    path("tasks/<int:pk>/", views.task_detail, name="detail"),
    path("tasks/<int:pk>/pause/", views.task_pause, name="pause"),
    path("tasks/<int:pk>/withdraw-pause/", views.task_withdraw_pause, name="withdraw_pause"),
    path("tasks/<int:pk>/resume/", views.task_resume, name="resume"),
    path("tasks/<int:pk>/cancel/", views.task_cancel, name="cancel"),
    path("tasks/<int:pk>/close/", views.task_close, name="close"),
    path("tasks/<int:pk>/reopen/", views.task_reopen, name="reopen"),
    path("tasks/<int:pk>/retry/", views.task_retry, name="retry"),
    path("tasks/<int:pk>/delete/", views.task_delete, name="delete"),
    path("tasks/<int:pk>/model-check/", views.task_model_check, name="model_check"),
    path("tasks/<int:pk>/calls/<int:call_pk>/result/", views.task_call_result, name="call_result"),
    path("tasks/<int:pk>/artifacts/<int:artifact_pk>/", views.task_artifact, name="artifact"),
]

urlpatterns = [
    path("", include((task_patterns, "tasks"))),
    path("connections/", include("agents.urls")),
]
