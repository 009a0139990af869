"""Uploads are bounded while they stream: Django's upload handlers write a file to memory or to a
temporary file before any view runs, so the caps on input files (ACTHELM_INPUT_FILE_MAX_BYTES per
file, ACTHELM_TASK_INPUTS_MAX_BYTES for one request's files together) are counted here, chunk by
chunk, ahead of the handlers that store. A file that goes over is skipped — the rest of it is read
and dropped, never stored — and the request carries the reason, which the console's form and the
API turn into a field error on `files` (`upload_refusal`). `tasks.workspace.add_input_file` counts
again when the file is copied into a task's workspace (the CLI and the admin reach it directly).
"""

from typing import Any, NoReturn

from django.conf import settings
from django.core.files.uploadhandler import FileUploadHandler, SkipFile
from django.http import HttpRequest

from tasks.workspace import input_file_too_large, task_inputs_too_large

REFUSAL = "acthelm_upload_refused"


class BoundedUploadHandler(FileUploadHandler):
    """First in FILE_UPLOAD_HANDLERS: passes each chunk on, until a cap is passed."""

    def __init__(self, request: HttpRequest | None = None) -> None:
        super().__init__(request)
        self.total = 0
        self.size = 0

    def new_file(self, *args: Any, **kwargs: Any) -> None:
        super().new_file(*args, **kwargs)
        self.size = 0

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes:
        self.size += len(raw_data)
        self.total += len(raw_data)
        if self.size > settings.ACTHELM_INPUT_FILE_MAX_BYTES:
            self._refuse(input_file_too_large(str(self.file_name)))
        if self.total > settings.ACTHELM_TASK_INPUTS_MAX_BYTES:
            self._refuse(task_inputs_too_large())
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None  # the next handler stores the file

    def _refuse(self, message: str) -> NoReturn:
        if self.request is not None and not getattr(self.request, REFUSAL, None):
            setattr(self.request, REFUSAL, message)
        raise SkipFile(message)


def upload_refusal(request: HttpRequest) -> str | None:
    """Why an uploaded file of this request was dropped while it streamed, or None."""
    return getattr(request, REFUSAL, None)
