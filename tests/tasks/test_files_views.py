"""A task's files open in the page (console.views.files): Markdown rendered safely, CSV as a table,
text escaped, anything else offered as a download; input files open and download too."""

import pytest
from django.urls import reverse

from tasks.states import TaskStatus
from tasks.workspace import artifacts_dir, workspace_dir
from tests.factories import ArtifactFactory, TaskFactory, UserFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def viewer(client):
    client.force_login(UserFactory(perms=["tasks.view_task"]))
    return client


def _artifact(task, name, content: bytes, content_type):
    (artifacts_dir(task.pk) / name).write_bytes(content)
    return ArtifactFactory(task=task, name=name, size=len(content), content_type=content_type)


def _view(client, task, artifact):
    return client.get(reverse("tasks:artifact_view", args=[task.pk, artifact.pk]))


def test_markdown_opens_rendered_and_its_script_stays_text(viewer):
    task = TaskFactory(status=TaskStatus.REVIEW)
    artifact = _artifact(
        task,
        "summary.md",
        b"# Decisions\n\n<script>alert(1)</script>\n- **April 16**\n",
        "text/markdown",
    )
    page = _view(viewer, task, artifact).content.decode()
    assert "<h1>Decisions</h1>" in page and "<li><strong>April 16</strong></li>" in page
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert(1)" not in page
    assert reverse("tasks:artifact", args=[task.pk, artifact.pk]) in page  # the download


def test_csv_opens_as_a_table_and_a_binary_file_is_offered_as_a_download(viewer):
    task = TaskFactory(status=TaskStatus.REVIEW)
    csv = _artifact(task, "totals.csv", b"region,total\nnorth,<b>12</b>\n", "text/csv")
    page = _view(viewer, task, csv).content.decode()
    assert "<th>region</th>" in page and "<td>&lt;b&gt;12&lt;/b&gt;</td>" in page
    png = _artifact(task, "chart.png", b"\x89PNG\r\n\x1a\n\x00\x00\x00", "image/png")
    page = _view(viewer, task, png).content.decode()
    assert "This file is not text" in page and "Download chart.png" in page


def test_an_input_file_opens_and_downloads_and_a_stray_name_is_404(viewer):
    task = TaskFactory()
    (workspace_dir(task.pk) / "notes.txt").write_text("<i>Launch</i> moved to April 16.\n")
    page = viewer.get(reverse("tasks:input_view", args=[task.pk, "notes.txt"])).content.decode()
    assert "&lt;i&gt;Launch&lt;/i&gt; moved" in page
    response = viewer.get(reverse("tasks:input_download", args=[task.pk, "notes.txt"]))
    assert response["Content-Disposition"].startswith("attachment")
    assert response["Content-Type"] == "application/octet-stream"
    assert b"".join(response.streaming_content).startswith(b"<i>Launch")
    assert viewer.get(f"/tasks/{task.pk}/inputs/..%2Fsecret/").status_code == 404
    assert viewer.get(reverse("tasks:input_view", args=[task.pk, "missing.txt"])).status_code == 404


def test_the_task_page_links_each_file_to_its_preview(viewer):
    task = TaskFactory(status=TaskStatus.REVIEW)
    artifact = _artifact(task, "summary.md", b"# S\n", "text/markdown")
    (workspace_dir(task.pk) / "notes.txt").write_text("n")
    page = viewer.get(reverse("tasks:detail", args=[task.pk])).content.decode()
    assert reverse("tasks:artifact_view", args=[task.pk, artifact.pk]) in page
    assert reverse("tasks:input_view", args=[task.pk, "notes.txt"]) in page


def test_files_need_the_view_permission(client):
    client.force_login(UserFactory(perms=[]))
    task = TaskFactory(status=TaskStatus.REVIEW)
    artifact = _artifact(task, "a.txt", b"x", "text/plain")
    assert _view(client, task, artifact).status_code == 403
