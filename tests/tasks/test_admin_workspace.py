"""Uploading input files into a task's workspace from the Task page of the admin."""

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.urls import reverse

from tasks.states import TaskStatus
from tasks.workspace import list_input_files, workspace_dir
from tests.factories import TaskFactory

pytestmark = pytest.mark.django_db


def change_url(task) -> str:
    return reverse("admin:tasks_task_change", args=[task.pk])


def form_data(response) -> dict:
    """What a browser would post back for the change page as rendered (fields and inlines)."""
    data = {}

    def add(form):
        for bound in form:
            value = bound.value()
            if value is None or value is False:
                continue
            data[bound.html_name] = "on" if value is True else value

    add(response.context["adminform"].form)
    for inline in response.context["inline_admin_formsets"]:
        add(inline.formset.management_form)
        for form in inline.formset.forms:
            add(form)
    return data


def upload(client, task, name: str, content: bytes):
    page = client.get(change_url(task))
    data = form_data(page) | {"input_file": SimpleUploadedFile(name, content), "_save": "Save"}
    return client.post(change_url(task), data)


def test_the_task_page_offers_an_upload_and_save_puts_the_file_in_the_workspace(client, person):
    client.force_login(person)
    task = TaskFactory(status=TaskStatus.READY, title="Analyse sales")
    page = client.get(change_url(task)).content.decode()
    assert 'enctype="multipart/form-data"' in page and 'name="input_file"' in page

    response = upload(client, task, "sales.csv", b"region,amount\nnorth,10\n")
    assert response.status_code == 302, response.context["adminform"].form.errors
    assert (workspace_dir(task.pk) / "sales.csv").read_bytes() == b"region,amount\nnorth,10\n"
    assert list_input_files(task.pk) == [{"name": "sales.csv", "size": 23}]
    assert "sales.csv (23 bytes)" in client.get(change_url(task)).content.decode()
    task.refresh_from_db()
    assert task.title == "Analyse sales" and task.status == TaskStatus.READY


def test_a_bad_file_name_is_refused_with_a_clear_error(client, person):
    client.force_login(person)
    task = TaskFactory(status=TaskStatus.READY)
    response = upload(client, task, "my notes;rm -rf.txt", b"x")
    assert response.status_code == 200
    assert "is not allowed" in str(response.context["adminform"].form.errors["input_file"])
    assert list_input_files(task.pk) == []


def test_no_upload_while_a_worker_holds_the_task(client, person):
    client.force_login(person)
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    response = upload(client, task, "late.txt", b"too late")
    assert response.status_code == 200
    assert "worker is running" in str(response.context["adminform"].form.errors["input_file"])
    assert list_input_files(task.pk) == []
