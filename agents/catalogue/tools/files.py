"""Read-only workspace tools: ``list_files``, ``read_file``, ``search_files``.

Every path the model gives goes through :func:`resolve_in_workspace`, which
confines it to the task's workspace:

* the path must be relative, use ``/`` as separator, and contain no ``..``
  component, backslash, NUL or other control character (``%2e%2e`` is *not*
  decoded: it is just an odd file name);
* after resolving every symlink (file or directory component) the real path
  must still be inside the real workspace;
* only regular files and directories are served (FIFOs, sockets and device
  files are refused, so a read can never block or stream ``/dev/zero``);
* files are then opened with ``O_NOFOLLOW | O_NONBLOCK`` and re-checked with
  ``fstat`` so a swap between check and open cannot hand over something else.

Reading is streamed: a huge file is never loaded whole, line ranges are found
by counting newlines in 1 MiB blocks, and over-long lines are cut.
"""

from __future__ import annotations

import codecs
import functools
import os
import re
import stat
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO

import re2
from pydantic import Field

from .base import Tool, ToolArgs, ToolContext, ToolError, ToolResult
from .recovery_class import RecoveryClass
from .registry import register

MAX_PATH_CHARS = 1024
MAX_COMPONENT_BYTES = 255
MAX_PATH_DEPTH = 64
BINARY_SNIFF_BYTES = 8192
BLOCK = 1 << 20

READ_MAX_LINE_BYTES = 16_384  # longer lines are cut when shown
READ_MAX_RETURN_BYTES = 200_000  # cap on text returned by one read_file call
READ_COUNT_TOTAL_MAX_SIZE = 64 << 20  # count total lines only for files up to this size

SEARCH_MAX_FILE_BYTES = 20 << 20
SEARCH_MAX_LINE_CHARS = 4000  # only this much of each line is examined
SEARCH_SHOW_CHARS = 300
SEARCH_TIME_BUDGET = 20.0  # seconds; checked after every line
RE2_MAX_MEM = 32 << 20  # bytes RE2 may use for one compiled pattern
SEARCH_MAX_FILES = 20_000
WALK_MAX_DEPTH = 32

_CONTROL_RE = re.compile(r"[\x00-\x1f\x7f]")


# --------------------------------------------------------------------------- paths


def _inside(real: str, root: str) -> bool:
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


@functools.lru_cache(maxsize=4096)
def _real_path(path: str) -> str:
    return os.path.realpath(path, strict=True)


def _workspace_root(workspace: Path | str) -> str:
    """The workspace's real path. Resolved once a process (a lstat of every component of the
    path, a step's biggest share of its system calls), then only checked to be a folder still —
    never a symlink — at every call: the worker made it, and no tool can replace it."""
    try:
        root = _real_path(os.fspath(workspace))
        if not stat.S_ISDIR(os.lstat(root).st_mode):
            raise FileNotFoundError(root)
    except OSError:
        raise ToolError("path_not_found", "The task workspace does not exist.") from None
    return root


def _check_relpath(relpath: Any) -> list[str]:
    """Syntax checks; returns the meaningful components (no '' or '.')."""
    if not isinstance(relpath, str):
        raise ToolError("path_invalid", "The path must be a string.")
    if "\x00" in relpath:
        raise ToolError("path_invalid", "The path contains a NUL byte.")
    if _CONTROL_RE.search(relpath):
        raise ToolError("path_invalid", "The path contains control characters.")
    if "\\" in relpath:
        raise ToolError(
            "path_invalid", "The path contains a backslash; use '/' to separate folders."
        )
    if len(relpath) > MAX_PATH_CHARS:
        raise ToolError("path_invalid", f"The path is longer than {MAX_PATH_CHARS} characters.")
    if relpath.startswith("/"):
        raise ToolError(
            "path_outside_workspace",
            f"Absolute paths are not allowed: {relpath!r}. Use a path relative to the workspace.",
        )
    parts = [p for p in relpath.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise ToolError(
            "path_outside_workspace",
            f"'..' is not allowed in paths: {relpath!r}. Use a path inside the workspace.",
        )
    if len(parts) > MAX_PATH_DEPTH:
        raise ToolError("path_invalid", f"The path has more than {MAX_PATH_DEPTH} components.")
    for p in parts:
        if len(p.encode("utf-8", "surrogatepass")) > MAX_COMPONENT_BYTES:
            raise ToolError(
                "path_invalid", f"A path component is longer than {MAX_COMPONENT_BYTES} bytes."
            )
    return parts


def check_workspace_path(relpath: str) -> None:
    """The path's own shape, without touching the disk: a relative path inside the workspace.
    The file tools' preflight, so that a call a person is asked about (or a person's edit of
    one) is refused when no approval could make its path valid."""
    _check_relpath(relpath)


def resolve_in_workspace(workspace: Path | str, relpath: str, *, must_exist: bool = True) -> Path:
    """Resolve ``relpath`` inside ``workspace`` or raise ToolError.

    Returns the real path (all symlinks resolved).  With ``must_exist=False`` the
    last component may be missing (used for files about to be written); if it
    exists it must be a regular file.  Codes: ``path_invalid``,
    ``path_outside_workspace``, ``path_not_found``, ``path_not_regular``.
    """
    return _resolve(_workspace_root(workspace), relpath, must_exist=must_exist)


def _resolve(root: str, relpath: str, *, must_exist: bool = True) -> Path:
    """`resolve_in_workspace` under a workspace root already resolved (`_workspace_root`): a
    tool that needs the root itself resolves it once, not twice."""
    parts = _check_relpath(relpath)
    if not parts:
        return Path(root)
    candidate = os.path.join(root, *parts)
    try:
        real = os.path.realpath(candidate)
    except (OSError, ValueError):  # pragma: no cover - realpath is non-strict
        raise ToolError("path_invalid", f"Cannot resolve the path {relpath!r}.") from None
    if not _inside(real, root):
        raise ToolError(
            "path_outside_workspace",
            f"The path {relpath!r} leads outside the workspace (through a symlink); refused.",
        )
    try:
        st = os.stat(real)
    except FileNotFoundError:
        if not must_exist:
            parent = os.path.dirname(real)
            if not os.path.isdir(parent):
                raise ToolError(
                    "path_not_found", f"The folder for {relpath!r} does not exist."
                ) from None
            return Path(real)
        raise ToolError(
            "path_not_found",
            f"No such file or folder in the workspace: {relpath!r}. "
            "Use list_files to see what exists.",
        ) from None
    except OSError as exc:  # ELOOP, ENAMETOOLONG, ENOTDIR, EACCES ...
        raise ToolError("path_invalid", f"Cannot access {relpath!r}: {exc.strerror}.") from None
    if stat.S_ISREG(st.st_mode) or (must_exist and stat.S_ISDIR(st.st_mode)):
        return Path(real)
    if stat.S_ISDIR(st.st_mode):
        raise ToolError("path_is_directory", f"{relpath!r} is a folder, not a file.")
    raise ToolError(
        "path_not_regular",
        f"{relpath!r} is not a regular file or folder (device, FIFO or socket); refused.",
    )


def _rel(root: str, real: str) -> str:
    """`real`, a resolved path inside the resolved `root`, relative to it with "/" between its
    parts. By its prefix: a listing computes this for every entry, and relpath (both paths
    made absolute and split) cost more than the listing's own system calls."""
    if real == root:
        return "."
    prefix = root if root.endswith(os.sep) else root + os.sep
    rel = real[len(prefix) :] if real.startswith(prefix) else os.path.relpath(real, root)
    return rel if os.sep == "/" else Path(rel).as_posix()


def open_regular_file(real: Path | str, relpath: str = "") -> tuple[BinaryIO, int]:
    """Open a resolved path read-only without following a final symlink or blocking.

    Returns the binary file object and its size; refuses anything not a regular file.
    """
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    flags |= getattr(os, "O_CLOEXEC", 0)
    label = relpath or os.path.basename(os.fspath(real))
    try:
        fd = os.open(real, flags)
    except FileNotFoundError:
        raise ToolError("path_not_found", f"No such file: {label!r}.") from None
    except OSError as exc:
        raise ToolError("path_invalid", f"Cannot open {label!r}: {exc.strerror}.") from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ToolError("path_is_directory", f"{label!r} is a folder, not a file.")
        if not stat.S_ISREG(st.st_mode):
            raise ToolError("path_not_regular", f"{label!r} is not a regular file; refused.")
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb"), st.st_size
    except BaseException:
        os.close(fd)
        raise


def looks_binary(head: bytes) -> bool:
    """NUL bytes, or not valid UTF-8 (a multibyte char cut at the end is tolerated)."""
    if b"\x00" in head:
        return True
    try:
        codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
    except UnicodeDecodeError:
        return True
    return False


def _human(size: int) -> str:
    value = float(size)
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{size} bytes" if unit == "bytes" else f"{value:.1f} {unit} ({size} bytes)"
        value /= 1024
    return f"{size} bytes"  # pragma: no cover


def _kind_of_mode(mode: int) -> str:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    return "other"


def _walk(root: str, start: str, recursive: bool) -> Iterator[tuple[str, os.DirEntry[str], int]]:
    """Pre-order, name-sorted walk that never follows symlinks.

    Yields (path relative to the root, entry, depth).
    """

    def visit(folder: str, depth: int) -> Iterator[tuple[str, os.DirEntry[str], int]]:
        try:
            with os.scandir(folder) as it:
                entries = sorted(it, key=lambda e: e.name)
        except OSError:
            return
        for entry in entries:
            yield _rel(root, entry.path), entry, depth
            if recursive and depth < WALK_MAX_DEPTH:
                try:
                    is_dir = entry.is_dir(follow_symlinks=False)
                except OSError:
                    is_dir = False
                if is_dir:
                    yield from visit(entry.path, depth + 1)

    yield from visit(start, 0)


# --------------------------------------------------------------------------- list_files


class ListFilesArgs(ToolArgs):
    path: str = Field(".", description="Folder (or file) relative to the workspace root.")
    recursive: bool = Field(False, description="Also list the contents of sub-folders.")
    max_entries: int = Field(500, ge=1, le=5000, description="Maximum entries to return.")


@register
class ListFiles(Tool[ListFilesArgs]):
    name = "list_files"
    description = (
        "List files and folders in the task workspace (the task's input files). "
        "Paths are relative to the workspace root; returns kind and size of each entry. "
        "Symlinks are shown but never followed."
    )
    effect = "Lists the files in workspace folder {target}"
    recovery_class = RecoveryClass.READ_ONLY
    Args = ListFilesArgs

    def preflight(self, args: ListFilesArgs, ctx: ToolContext) -> None:
        check_workspace_path(args.path)

    def run(self, args: ListFilesArgs, ctx: ToolContext) -> ToolResult:
        root = _workspace_root(ctx.workspace)
        real = str(_resolve(root, args.path))
        entries: list[dict[str, Any]] = []
        truncated = False
        if os.path.isfile(real):
            st = os.stat(real)
            entries.append({"path": _rel(root, real), "kind": "file", "size": st.st_size})
        else:
            for rel, entry, _depth in _walk(root, real, args.recursive):
                if len(entries) >= args.max_entries:
                    truncated = True
                    break
                entries.append(self._describe(root, rel, entry))
                if len(entries) % 1000 == 0:
                    ctx.check_cancelled()
        shown = _rel(root, real)
        header = f"Contents of {shown!r}{' (recursive)' if args.recursive else ''}: "
        header += f"{len(entries)} entr{'y' if len(entries) == 1 else 'ies'}"
        if truncated:
            header += f" (stopped at max_entries={args.max_entries}; more exist)"
        lines = [header]
        for e in entries:
            if e["kind"] == "file":
                lines.append(f"file     {e['path']}  {e['size']} bytes")
            elif e["kind"] == "dir":
                lines.append(f"dir      {e['path']}/")
            elif e["kind"] == "symlink":
                if e.get("refused"):
                    lines.append(f"symlink  {e['path']}  (points outside the workspace; refused)")
                else:
                    lines.append(
                        f"symlink  {e['path']} -> {e.get('target', '?')}"
                        f" ({e.get('target_kind', 'missing')})"
                    )
            else:
                lines.append(f"other    {e['path']}  (not a regular file; cannot be read)")
        if not entries:
            lines.append("(empty)")
        return ToolResult(
            text="\n".join(lines),
            data={"path": shown, "entries": entries, "truncated": truncated},
        )

    @staticmethod
    def _describe(root: str, rel: str, entry: os.DirEntry[str]) -> dict[str, Any]:
        try:
            if entry.is_symlink():
                info: dict[str, Any] = {"path": rel, "kind": "symlink"}
                target = os.path.realpath(entry.path)
                if not _inside(target, root):
                    info["refused"] = True
                    return info
                info["target"] = _rel(root, target)
                try:
                    info["target_kind"] = _kind_of_mode(os.stat(target).st_mode)
                except OSError:
                    info["target_kind"] = "missing"
                return info
            st = entry.stat(follow_symlinks=False)
        except OSError:
            return {"path": rel, "kind": "other"}
        kind = _kind_of_mode(st.st_mode)
        out: dict[str, Any] = {"path": rel, "kind": kind}
        if kind == "file":
            out["size"] = st.st_size
        return out


# --------------------------------------------------------------------------- read_file


class ReadFileArgs(ToolArgs):
    path: str = Field(..., min_length=1, description="File path relative to the workspace root.")
    start_line: int = Field(1, ge=1, description="First line to return (1-based).")
    max_lines: int = Field(400, ge=1, le=2000, description="Maximum number of lines to return.")


def _skip_lines(f: BinaryIO, count: int) -> tuple[int, int]:
    """Move past ``count`` newlines from the current position (block-wise).

    Returns (newlines skipped, offset of the byte after the last skipped newline).
    """
    skipped = 0
    offset = f.tell()
    while skipped < count:
        block = f.read(BLOCK)
        if not block:
            break
        n = block.count(b"\n")
        need = count - skipped
        if n < need:
            skipped += n
            offset += len(block)
            continue
        idx = -1
        for _ in range(need):
            idx = block.index(b"\n", idx + 1)
        skipped += need
        offset += idx + 1
    f.seek(offset)
    return skipped, offset


def _count_newlines_from(f: BinaryIO) -> tuple[int, bytes]:
    """Count newlines from the current position to EOF; returns (count, last byte)."""
    total = 0
    last = b""
    while True:
        block = f.read(BLOCK)
        if not block:
            return total, last
        total += block.count(b"\n")
        last = block[-1:]


def _read_line(f: BinaryIO, limit: int) -> tuple[bytes, int]:
    """Read one line, keeping at most ``limit`` bytes. Returns (kept, bytes dropped)."""
    line = f.readline(limit)
    if not line or line.endswith(b"\n") or len(line) < limit:
        return line, 0
    dropped = 0
    while True:
        more = f.readline(BLOCK)
        if not more:
            break
        if more.endswith(b"\n"):
            dropped += len(more) - 1
            break
        dropped += len(more)
    return line, dropped


def _read_window(
    f: BinaryIO, start_line: int, max_lines: int, ctx: ToolContext
) -> tuple[list[str], list[int], bool]:
    """Up to ``max_lines`` lines from the current position, line ``start_line`` first: each
    cut at ``READ_MAX_LINE_BYTES``, together at most ``READ_MAX_RETURN_BYTES`` (but at least
    one line).  Returns (the lines, the numbers of those cut, whether the byte cap stopped it).
    """
    lines: list[str] = []
    cut_lines: list[int] = []
    returned_bytes = 0
    while len(lines) < max_lines:
        raw, dropped = _read_line(f, READ_MAX_LINE_BYTES)
        if not raw:
            break
        if lines and returned_bytes + len(raw) > READ_MAX_RETURN_BYTES:
            return lines, cut_lines, True
        line_no = start_line + len(lines)
        text = raw.decode("utf-8", "replace")
        if line_no == 1 and text.startswith("\ufeff"):
            text = text[1:]
        text = text.rstrip("\n").rstrip("\r")
        if dropped:
            cut_lines.append(line_no)
            text += f" …[line cut: {dropped} more bytes]"
        lines.append(text)
        returned_bytes += len(raw)
        if len(lines) % 1000 == 0:
            ctx.check_cancelled()
    return lines, cut_lines, False


def _total_lines(
    f: BinaryIO, size: int, start_line: int, lines_read: int, more: bool
) -> int | None:
    """The file's line count where it is cheap or needed: counted in files up to
    ``READ_COUNT_TOTAL_MAX_SIZE`` and when ``start_line`` is past the end; else known only
    when the read reached the end."""
    if size <= READ_COUNT_TOTAL_MAX_SIZE or (not lines_read and start_line > 1):
        f.seek(0)
        n, last = _count_newlines_from(f)
        return n + (1 if size and last != b"\n" else 0)
    if not more:
        return start_line + lines_read - 1
    return None


@register
class ReadFile(Tool[ReadFileArgs]):
    name = "read_file"
    reads_files = True
    description = (
        "Read a text file from the task workspace, a range of lines at a time. "
        "Returns numbered lines; use start_line to continue where a previous read stopped. "
        "Binary files are refused."
    )
    effect = "Reads workspace file {target}"
    recovery_class = RecoveryClass.READ_ONLY
    Args = ReadFileArgs

    def preflight(self, args: ReadFileArgs, ctx: ToolContext) -> None:
        check_workspace_path(args.path)

    def run(self, args: ReadFileArgs, ctx: ToolContext) -> ToolResult:
        root = _workspace_root(ctx.workspace)
        real = _resolve(root, args.path)
        rel = _rel(root, str(real))
        f, size = open_regular_file(real, args.path)
        with f:
            head = f.read(BINARY_SNIFF_BYTES)
            if looks_binary(head):
                raise ToolError(
                    "path_is_binary",
                    f"{rel!r} looks like a binary file ({_human(size)}); only text files "
                    "can be read.",
                    details={"size": size},
                )
            f.seek(0)
            _skip_lines(f, args.start_line - 1)
            lines, cut_lines, stopped_by_bytes = _read_window(
                f, args.start_line, args.max_lines, ctx
            )
            more = stopped_by_bytes or bool(f.read(1))
            total_lines = _total_lines(f, size, args.start_line, len(lines), more)

        data: dict[str, Any] = {
            "path": rel,
            "size": size,
            "start_line": args.start_line,
            "end_line": None,
            "lines_returned": len(lines),
            "total_lines": total_lines,
            "more": more,
            "next_start_line": None,
            "cut_lines": cut_lines,
        }
        if not lines:
            if size == 0:
                text = f"{rel} is empty (0 bytes)."
            else:
                text = (
                    f"{rel} has {total_lines} lines; start_line {args.start_line} is past the end."
                )
            return ToolResult(text=text, data=data)

        end_line = args.start_line + len(lines) - 1
        data["end_line"] = end_line
        header = f"{rel} ({_human(size)}), lines {args.start_line}-{end_line}"
        if total_lines is not None:
            header += f" of {total_lines}"
        body = "\n".join(f"{args.start_line + i:>6}\t{t}" for i, t in enumerate(lines))
        if stopped_by_bytes:
            footer = (
                f"[stopped at the {READ_MAX_RETURN_BYTES}-byte limit per read; "
                f"continue with start_line={end_line + 1}]"
            )
        elif more:
            footer = f"[more lines follow; continue with start_line={end_line + 1}]"
        else:
            footer = "[end of file]"
        if more:
            data["next_start_line"] = end_line + 1
        return ToolResult(text=f"{header}\n{body}\n{footer}", data=data)


# --------------------------------------------------------------------------- search_files


class SearchFilesArgs(ToolArgs):
    pattern: str = Field(..., min_length=1, max_length=1000, description="Text or regex to find.")
    path: str = Field(".", description="Folder or file to search, relative to the workspace.")
    regex: bool = Field(
        False,
        description=(
            "Treat pattern as a regular expression (Python syntax, run by a linear-time "
            "engine: no lookarounds or backreferences)."
        ),
    )
    case_sensitive: bool = Field(False, description="Match case exactly.")
    max_matches: int = Field(100, ge=1, le=1000, description="Stop after this many matches.")


def _re2_error_text(exc: Exception) -> str:
    detail = exc.args[0] if exc.args else exc
    if isinstance(detail, bytes):
        detail = detail.decode("utf-8", "replace")
    return str(detail)


def compile_search_pattern(pattern: str, regex: bool, case_sensitive: bool) -> Any:
    """The pattern compiled for RE2, a regex engine that never backtracks.

    RE2 searches in time linear in the line's length whatever the pattern (``(a|a)*b`` or
    ``(.*a){8}x`` cost what ``ab`` costs), and it releases the GIL while it searches, so the
    worker's heartbeat thread keeps running. The Python dialect is checked first (so the
    model gets Python's error messages for Python syntax); lookarounds and backreferences,
    which need backtracking, are refused with ``regex_invalid``.
    """
    if regex:
        try:
            re.compile(pattern, 0 if case_sensitive else re.IGNORECASE)
        except (re.error, OverflowError, RecursionError) as exc:
            raise ToolError(
                "regex_invalid", f"Invalid regular expression {pattern!r}: {exc}."
            ) from None
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = case_sensitive
    options.literal = not regex
    options.max_mem = RE2_MAX_MEM
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        raise ToolError(
            "regex_invalid",
            f"The regular expression {pattern!r} cannot be used: {_re2_error_text(exc)}. "
            "Searches use a linear-time engine: lookarounds ((?=, (?!, (?<=), "
            "backreferences (\\1) and repetition counts above 1000 are not supported.",
        ) from None


def _search_candidates(root: str, real: str) -> Iterator[tuple[str, str]]:
    """(relative path, path) of each file to search: the one named, or the regular files
    under the folder named (symlinks are not followed)."""
    if os.path.isfile(real):
        return iter([(_rel(root, real), real)])
    return (
        (rel, entry.path)
        for rel, entry, _ in _walk(root, real, True)
        if not entry.is_symlink() and entry.is_file(follow_symlinks=False)
    )


def _unsearchable(f: BinaryIO, size: int) -> str | None:
    """Why an open file is skipped (too large, binary), or None with ``f`` back at its start."""
    if size > SEARCH_MAX_FILE_BYTES:
        return "too_large"
    head = f.read(BINARY_SNIFF_BYTES)
    if looks_binary(head):
        return "binary"
    f.seek(0)
    return None


def _search_file(
    f: BinaryIO,
    rel: str,
    rx: Any,
    matches: list[dict[str, Any]],
    max_matches: int,
    deadline: float,
    ctx: ToolContext,
) -> tuple[bool, bool]:
    """Append the file's matching lines to ``matches`` until ``max_matches`` or the deadline.

    Returns (the file goes on after the last match allowed, the deadline passed)."""
    line_no = 0
    while True:
        raw, _dropped = _read_line(f, SEARCH_MAX_LINE_CHARS * 4)
        if not raw:
            return False, False
        line_no += 1
        text = raw.decode("utf-8", "replace")[:SEARCH_MAX_LINE_CHARS]
        text = text.rstrip("\r\n")
        if rx.search(text):
            shown = text.strip()
            if len(shown) > SEARCH_SHOW_CHARS:
                shown = shown[:SEARCH_SHOW_CHARS] + " …"
            matches.append({"path": rel, "line": line_no, "text": shown})
            if len(matches) >= max_matches:
                return bool(f.read(1)), False
        # One line costs at most a linear-time search of a bounded line, so the
        # budget holds whatever the pattern and input.
        if time.monotonic() > deadline:
            return False, True
        if line_no % 1000 == 0:
            ctx.check_cancelled()


def _search_text(data: dict[str, Any], max_matches: int) -> str:
    matches, files_searched, skipped = data["matches"], data["files_searched"], data["skipped"]
    lines = [
        f"{len(matches)} match{'es' if len(matches) != 1 else ''} for {data['pattern']!r} "
        f"in {files_searched} file{'s' if files_searched != 1 else ''}"
    ]
    if data["truncated"]:
        lines[0] += f" (stopped at max_matches={max_matches}; there may be more)"
    if data["timed_out"]:
        lines[0] += f" (stopped after {SEARCH_TIME_BUDGET:.0f} s; results are partial)"
    lines.extend(f"{m['path']}:{m['line']}: {m['text']}" for m in matches)
    if skipped:
        shown_skips = ", ".join(f"{s['path']} ({s['reason']})" for s in skipped[:20])
        more = f" and {len(skipped) - 20} more" if len(skipped) > 20 else ""
        lines.append(f"Skipped {len(skipped)} file(s): {shown_skips}{more}")
    return "\n".join(lines)


@register
class SearchFiles(Tool[SearchFilesArgs]):
    name = "search_files"
    reads_files = True
    description = (
        "Search the text files of the task workspace for a string (or a regex with "
        "regex=true). Returns matching lines as path:line: text. Symlinks are not followed; "
        "binary files and files "
        f"over {SEARCH_MAX_FILE_BYTES >> 20} MiB are skipped; only the first "
        f"{SEARCH_MAX_LINE_CHARS} characters of each line are examined; a search stops after "
        f"{SEARCH_TIME_BUDGET:.0f} s with partial results."
    )
    effect = "Searches workspace files under {target}"
    recovery_class = RecoveryClass.READ_ONLY
    Args = SearchFilesArgs

    def preflight(self, args: SearchFilesArgs, ctx: ToolContext) -> None:
        check_workspace_path(args.path)

    def run(self, args: SearchFilesArgs, ctx: ToolContext) -> ToolResult:
        rx = compile_search_pattern(args.pattern, args.regex, args.case_sensitive)
        root = _workspace_root(ctx.workspace)
        real = str(_resolve(root, args.path))
        deadline = time.monotonic() + SEARCH_TIME_BUDGET
        matches: list[dict[str, Any]] = []
        skipped: list[dict[str, str]] = []
        files_searched = 0
        truncated = False
        timed_out = False

        for rel, path in _search_candidates(root, real):
            ctx.check_cancelled()
            if len(matches) >= args.max_matches:
                truncated = True
                break
            if time.monotonic() > deadline:
                timed_out = True
                break
            if files_searched >= SEARCH_MAX_FILES:
                truncated = True
                break
            try:
                f, size = open_regular_file(path, rel)
            except ToolError as exc:
                skipped.append({"path": rel, "reason": exc.code})
                continue
            with f:
                reason = _unsearchable(f, size)
                if reason is not None:
                    skipped.append({"path": rel, "reason": reason})
                    continue
                files_searched += 1
                more, timed_out = _search_file(f, rel, rx, matches, args.max_matches, deadline, ctx)
                truncated = more or truncated
                if timed_out:
                    break

        data: dict[str, Any] = {
            "pattern": args.pattern,
            "matches": matches,
            "files_searched": files_searched,
            "skipped": skipped,
            "truncated": truncated,
            "timed_out": timed_out,
        }
        return ToolResult(text=_search_text(data, args.max_matches), data=data)
