"""A task's files in the page: an artifact or an input file shown as what it is (escaped text,
safe Markdown, a CSV table; anything else offered as a download), bounded
(`console.preview`); an artifact that a reopened task rewrote also shows what
changed since the previous run."""

from pathlib import Path

from django.http import FileResponse, Http404, HttpResponse
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_GET

from agents.models import Artifact
from console import preview
from console.http import AuthenticatedHttpRequest
from console.shared import console_view
from core.exceptions import InvalidInput
from tasks.models import Task
from tasks.workspace import artifacts_dir, safe_file_name, workspace_dir


def _file_in(folder: Path, name: str) -> Path:
    """`name` inside `folder`, a regular file and no symlink, else 404."""
    try:
        name = safe_file_name(name)
    except InvalidInput:
        raise Http404("no such file") from None
    folder = folder.resolve()
    path = folder / name
    if path.is_symlink() or not path.is_file() or path.resolve().parent != folder:
        raise Http404("the file is missing")
    return path


def _page(
    request: AuthenticatedHttpRequest,
    task: Task,
    *,
    name: str,
    path: Path,
    content_type: str,
    download: str,
    **extra: object,
) -> HttpResponse:
    context = {
        "task": task,
        "name": name,
        "size": path.stat().st_size,
        "content_type": content_type,
        "preview": preview.preview_file(path, name, content_type),
        "download_url": download,
        "preview_bytes": preview.PREVIEW_BYTES,
        "csv_rows": preview.CSV_ROWS,
        **extra,
    }
    return render(request, "console/file_preview.html", context)


@require_GET
@console_view()
def artifact_view(request: AuthenticatedHttpRequest, pk: int, artifact_pk: int) -> HttpResponse:
    task = get_object_or_404(Task.objects.only("id", "title", "status"), pk=pk)
    artifact = get_object_or_404(Artifact, pk=artifact_pk, task_id=pk)
    path = _file_in(artifacts_dir(pk, create=False), artifact.name)
    return _page(
        request,
        task,
        name=artifact.name,
        path=path,
        content_type=artifact.content_type,
        download=reverse("tasks:artifact", args=[pk, artifact.pk]),
        change=preview.artifact_change(pk, artifact.name),
        artifact=artifact,
    )


@require_GET
@console_view()
def input_view(request: AuthenticatedHttpRequest, pk: int, name: str) -> HttpResponse:
    task = get_object_or_404(Task.objects.only("id", "title", "status"), pk=pk)
    path = _file_in(workspace_dir(pk, create=False), name)
    return _page(
        request,
        task,
        name=path.name,
        path=path,
        content_type="",
        download=reverse("tasks:input_download", args=[pk, path.name]),
        input_file=True,
    )


@require_GET
@console_view()
def input_download(request: AuthenticatedHttpRequest, pk: int, name: str) -> FileResponse:
    """An input file, always as an attachment of an inert type."""
    get_object_or_404(Task.objects.only("id"), pk=pk)
    path = _file_in(workspace_dir(pk, create=False), name)
    response = FileResponse(
        path.open("rb"),
        as_attachment=True,
        filename=path.name,
        content_type="application/octet-stream",
    )
    response["X-Content-Type-Options"] = "nosniff"
    response["Content-Security-Policy"] = "sandbox; default-src 'none'"
    return response
