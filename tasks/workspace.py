"""Where a task's files live: one folder per task under ACTHELM_MEDIA_ROOT, with the input files
the agent may read (`workspace/`) and the artifacts it writes (`artifacts/`)."""

from __future__ import annotations

import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

from django.conf import settings
from django.core.files.base import File

from core.exceptions import InvalidInput

_CHUNK = 1 << 20
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class InputFile(TypedDict):
    """One input file of a task's workspace, as the pages, the API and the CLI show it."""

    name: str
    size: int  # bytes


def task_dir(task_id: int) -> Path:
    return Path(settings.ACTHELM_MEDIA_ROOT) / "tasks" / str(int(task_id))


def workspace_dir(task_id: int, *, create: bool = True) -> Path:
    path = task_dir(task_id) / "workspace"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def artifacts_dir(task_id: int, *, create: bool = True) -> Path:
    path = task_dir(task_id) / "artifacts"
    if create:
        path.mkdir(parents=True, exist_ok=True)
    return path


def safe_file_name(name: str) -> str:
    name = Path(name or "").name
    if not _SAFE_NAME.match(name):
        raise InvalidInput(
            f"file name {name!r} is not allowed: use letters, digits, '.', '_' and '-' only"
        )
    return name


def add_input_file(
    task_id: int,
    *,
    name: str,
    source: Path | None = None,
    data: bytes | str | File[bytes] | None = None,
) -> Path:
    """Copy a file into the task's workspace (from a path, or from bytes / an uploaded file),
    counting while it streams: a file over ACTHELM_INPUT_FILE_MAX_BYTES, or one that would take
    the task's files over ACTHELM_TASK_INPUTS_MAX_BYTES, is refused (InvalidInput on `files`)
    and nothing of it stays."""
    name = safe_file_name(name)
    folder = workspace_dir(task_id)
    target = folder / name
    if source is not None:
        source = Path(source)
        if not source.is_file():
            raise InvalidInput(f"{source} is not a regular file")
    per_file = settings.ACTHELM_INPUT_FILE_MAX_BYTES
    room = settings.ACTHELM_TASK_INPUTS_MAX_BYTES - sum(
        f["size"] for f in list_input_files(task_id) if f["name"] != name
    )
    written = 0
    try:
        with target.open("wb") as out:
            for chunk in _chunks(source, data):
                written += len(chunk)
                if written > per_file:
                    raise InvalidInput(input_file_too_large(name), field="files")
                if written > room:
                    raise InvalidInput(task_inputs_too_large(), field="files")
                out.write(chunk)
    except BaseException:
        target.unlink(missing_ok=True)
        raise
    return target


def input_file_too_large(name: str) -> str:
    cap = settings.ACTHELM_INPUT_FILE_MAX_BYTES
    return f"input file {name} is larger than {cap} bytes (ACTHELM_INPUT_FILE_MAX_BYTES)"


def task_inputs_too_large() -> str:
    cap = settings.ACTHELM_TASK_INPUTS_MAX_BYTES
    return f"a task's input files may have {cap} bytes in all (ACTHELM_TASK_INPUTS_MAX_BYTES)"


def _chunks(source: Path | None, data: bytes | str | File[bytes] | None) -> Iterator[bytes]:
    if source is not None:
        with source.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                yield chunk
    elif data is None:
        raise TypeError("an input file needs its source or its data")
    elif isinstance(data, bytes | str):
        yield data.encode() if isinstance(data, str) else data
    else:
        yield from data.chunks()


def list_input_files(task_id: int) -> list[InputFile]:
    folder = workspace_dir(task_id, create=False)
    if not folder.is_dir():
        return []
    return [
        {"name": p.name, "size": p.stat().st_size}
        for p in sorted(folder.iterdir())
        if p.is_file() and not p.is_symlink()
    ]


def remove_task_files(task_id: int) -> None:
    shutil.rmtree(task_dir(task_id), ignore_errors=True)
