"""``write_artifact``: write one result file into the task's artifacts folder.

The write is atomic: the content goes to a temporary file in the same folder
(name starting with ``.tmp-``, which no artifact name can), is fsync'ed, then
``os.replace``'d over the target and the folder is fsync'ed.  A crash at any
point leaves either the old file or the new one, never half a file; running the
call again rewrites the same file (recovery class ``idempotent``).  Stale
temporary files of the same artifact left by a crash are removed on the next
write.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

from pydantic import Field, field_validator

from .base import (
    ArtifactWritten,
    Tool,
    ToolArgs,
    ToolContext,
    ToolError,
    ToolResult,
)
from .files import resolve_in_workspace
from .recovery_class import RecoveryClass
from .registry import register

ARTIFACT_NAME_RE = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,99}")
CONTENT_TYPE_RE = re.compile(
    r"[a-z0-9][a-z0-9!#$&^_.+-]{0,63}/[a-z0-9][a-z0-9!#$&^_.+-]{0,63}"
    r"(?:\s*;\s*[a-z0-9_.+-]+=[a-z0-9_.+\"-]+){0,4}",
    re.IGNORECASE,
)
TMP_PREFIX = ".tmp-"


def check_artifact_name(name: str) -> str:
    if not isinstance(name, str) or not ARTIFACT_NAME_RE.fullmatch(name):
        raise ToolError(
            "artifact_name_invalid",
            f"Invalid artifact name {name!r}: use 1-100 letters, digits, '.', '_' or '-', "
            "not starting with a dot, without folders (e.g. 'report.md').",
        )
    return name


class WriteArtifactArgs(ToolArgs):
    name: str = Field(
        ...,
        min_length=1,
        max_length=100,
        description="File name: letters, digits, '.', '_', '-'; no folders (e.g. 'summary.md').",
    )
    content: str = Field(..., description="The full text content of the file (UTF-8).")
    content_type: str = Field(
        "text/plain", max_length=200, description="MIME type, e.g. text/markdown, text/csv."
    )

    @field_validator("content_type")
    @classmethod
    def _check_content_type(cls, v: str) -> str:
        v = v.strip()
        if not CONTENT_TYPE_RE.fullmatch(v):
            raise ValueError("content_type must look like 'type/subtype', e.g. 'text/markdown'")
        return v


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:  # pragma: no cover - platform without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _remove_stale_temps(folder: Path, name: str) -> None:
    prefix = f"{TMP_PREFIX}{name}."
    try:
        with os.scandir(folder) as it:
            for entry in it:
                if entry.name.startswith(prefix) and entry.is_file(follow_symlinks=False):
                    with contextlib.suppress(OSError):
                        os.unlink(entry.path)
    except OSError:  # pragma: no cover
        pass


# Beside the artifacts folder (in the task's folder), so that it is never listed as an artifact.
FENCE_FILE = ".artifacts-fence"


class FencedOut(Exception):
    """A newer attempt of the task stamped the artifacts folder: this one may not write."""


@contextlib.contextmanager
def _fence_lock(folder: Path) -> Iterator[None]:
    fd = os.open(folder.parent / f"{FENCE_FILE}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read_fence(folder: Path) -> int:
    try:
        return int((folder.parent / FENCE_FILE).read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


def _write_fence(folder: Path, token: int) -> None:
    tmp = folder.parent / f"{FENCE_FILE}.{os.getpid()}.{threading.get_ident()}"
    tmp.write_text(str(token))
    os.replace(tmp, folder.parent / FENCE_FILE)


def stamp_fence(folder: Path, token: int) -> None:
    """A run of the task with claim counter `token` started: from now on no run with a lower
    counter can replace an artifact file (a fencing token kept beside the files)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    with _fence_lock(folder):
        if _read_fence(folder) < token:
            _write_fence(folder, token)


@contextlib.contextmanager
def _fenced(folder: Path, token: int | None) -> Iterator[None]:
    """Hold the folder's fence while the file is replaced; refuse when a newer run stamped it."""
    if token is None:
        yield
        return
    with _fence_lock(folder):
        current = _read_fence(folder)
        if current > token:
            raise FencedOut(f"claim {current} holds the artifacts; this run has claim {token}")
        if current < token:
            _write_fence(folder, token)
        yield


@register
class WriteArtifact(Tool[WriteArtifactArgs]):
    name = "write_artifact"
    description = (
        "Write a text file (a result of the task, e.g. a report or a CSV) to the task's "
        "artifacts. Writing the same name again replaces the file."
    )
    effect = "Writes artifact file {target}"
    recovery_class = RecoveryClass.IDEMPOTENT
    Args = WriteArtifactArgs

    def target(self, args: WriteArtifactArgs) -> str:
        return args.name

    def describe_effect(self, args: WriteArtifactArgs) -> str:
        size = len(args.content.encode("utf-8", "surrogatepass"))
        return f"Writes artifact file {args.name} ({size} bytes, {args.content_type})"

    def preflight(self, args: WriteArtifactArgs, ctx: ToolContext) -> None:
        check_artifact_name(args.name)
        size = len(args.content.encode("utf-8", "surrogatepass"))
        if size > ctx.max_artifact_bytes:
            raise ToolError(
                "artifact_too_large",
                f"The content is {size} bytes; artifacts are limited to "
                f"{ctx.max_artifact_bytes} bytes. Write a shorter file or split it.",
                details={"size": size, "limit": ctx.max_artifact_bytes},
            )

    def run(self, args: WriteArtifactArgs, ctx: ToolContext) -> ToolResult:
        self.preflight(args, ctx)
        try:
            payload = args.content.encode("utf-8")
        except UnicodeEncodeError:
            raise ToolError(
                "invalid_arguments", "The content contains characters that are not valid UTF-8."
            ) from None
        folder = Path(ctx.artifacts_dir)
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ToolError(
                "artifact_write_failed", f"Cannot create the artifacts folder: {exc.strerror}."
            ) from None
        try:
            # Checks the name and that an existing entry is a plain file (not a folder,
            # device or a link leading out).  The write then replaces the entry itself
            # (os.replace never writes through a symlink).
            resolve_in_workspace(folder, args.name, must_exist=False)
        except ToolError as exc:
            raise ToolError(
                "artifact_name_invalid", f"Cannot write artifact {args.name!r}: {exc.message}"
            ) from None
        target = Path(os.path.realpath(folder)) / args.name
        _remove_stale_temps(folder, args.name)
        digest = hashlib.sha256(payload).hexdigest()
        tmp_path: str | None = None
        try:
            fd, tmp_path = tempfile.mkstemp(prefix=f"{TMP_PREFIX}{args.name}.", dir=target.parent)
            with os.fdopen(fd, "wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            os.chmod(tmp_path, 0o644)
            with _fenced(folder, ctx.fence_token):
                os.replace(tmp_path, target)
            tmp_path = None
            _fsync_dir(target.parent)
        except FencedOut:
            raise ToolError(
                "cancelled", "A newer attempt of the task holds its artifacts; nothing was written."
            ) from None
        except OSError as exc:
            raise ToolError(
                "artifact_write_failed", f"Writing artifact {args.name!r} failed: {exc.strerror}."
            ) from None
        finally:
            if tmp_path is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp_path)
        artifact = ArtifactWritten(
            name=args.name,
            path=target,
            size=len(payload),
            sha256=digest,
            content_type=args.content_type,
        )
        return ToolResult(
            text=(
                f"Wrote artifact {args.name} ({len(payload)} bytes, {args.content_type}, "
                f"sha256 {digest[:12]}…)."
            ),
            data={
                "name": args.name,
                "size": len(payload),
                "sha256": digest,
                "content_type": args.content_type,
            },
            artifact=artifact,
        )
