from django.urls import path

from approvals import views

app_name = "approvals"

urlpatterns = [
    path("", views.inbox, name="inbox"),
    path("<int:pk>/approve/", views.approve, name="approve"),
    path("<int:pk>/deny/", views.deny, name="deny"),
    path("review/<int:pk>/run-again/", views.run_again, name="run_again"),
    path("review/<int:pk>/skip/", views.skip, name="skip"),
]
