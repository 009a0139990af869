"""Showing a file in the page: what an artifact or an input file is, rendered safely and bounded.

A file's text is hostile (a model or an uploader wrote it). Everything here escapes first and
formats after: Markdown becomes a small set of tags this module writes itself (headings,
paragraphs, lists, quotes, code, emphasis, links to http(s) addresses), never the file's own HTML;
CSV becomes a table of escaped cells; anything else that is text is shown as escaped text; a file
that is not text is only offered as a download. At most PREVIEW_BYTES are read, at most
CSV_ROWS x CSV_COLUMNS cells and DIFF_LINES diff lines are shown.
"""

import csv
import difflib
import io
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from django.utils.html import escape
from django.utils.safestring import SafeString, mark_safe

from agents.models import Artifact, ToolCall
from agents.states import ToolCallStatus
from core.exceptions import InvalidInput
from tasks.workspace import artifacts_dir, safe_file_name

PREVIEW_BYTES = 256 * 1024
CSV_ROWS = 200
CSV_COLUMNS = 30
CELL_CHARS = 500
DIFF_LINES = 400
# A longer line is shown escaped but not formatted (the inline patterns stay linear on it).
INLINE_CHARS = 2000

MARKDOWN_SUFFIXES = (".md", ".markdown")
CSV_SUFFIXES = (".csv",)
TEXT_SUFFIXES = (".txt", ".json", ".log", ".yaml", ".yml", ".py", ".toml", ".ini", ".tsv", ".xml")


@dataclass
class Preview:
    """How a file is shown: kind is "markdown", "csv", "text" or "download"."""

    kind: str
    html: SafeString | str = ""
    text: str = ""
    rows: list[list[str]] | None = None
    truncated: bool = False
    note: str = ""


def kind_of(name: str, content_type: str = "") -> str:
    name = name.lower()
    content_type = (content_type or "").split(";")[0].strip().lower()
    if name.endswith(MARKDOWN_SUFFIXES) or content_type == "text/markdown":
        return "markdown"
    if name.endswith(CSV_SUFFIXES) or content_type == "text/csv":
        return "csv"
    if name.endswith(TEXT_SUFFIXES) or content_type.startswith("text/"):
        return "text"
    if content_type in ("application/json", "application/x-ndjson"):
        return "text"
    return "download"


def read_bounded(path: Path, limit: int = PREVIEW_BYTES) -> tuple[bytes, bool]:
    """The file's first `limit` bytes, and whether there was more."""
    with path.open("rb") as handle:
        data = handle.read(limit + 1)
    return data[:limit], len(data) > limit


def decode(data: bytes) -> str | None:
    """UTF-8 text, or None for a file that is not text (a NUL, or not UTF-8 at all)."""
    if b"\x00" in data:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        if exc.start >= len(data) - 3:  # cut inside a character at the bound
            return data[: exc.start].decode("utf-8", errors="replace")
        return None


def preview_bytes(name: str, content_type: str, data: bytes, truncated: bool) -> Preview:
    kind = kind_of(name, content_type)
    text = decode(data) if kind != "download" else None
    if text is None:
        return Preview(kind="download", note="This file is not text; download it to open it.")
    if kind == "markdown":
        return Preview(kind="markdown", html=render_markdown(text), text=text, truncated=truncated)
    if kind == "csv":
        rows, cut = csv_rows(text)
        return Preview(kind="csv", rows=rows, text=text, truncated=truncated or cut)
    return Preview(kind="text", text=text, truncated=truncated)


def preview_file(path: Path, name: str, content_type: str = "") -> Preview:
    data, truncated = read_bounded(path)
    return preview_bytes(name, content_type, data, truncated)


# --- CSV ------------------------------------------------------------------------------------------


def csv_rows(text: str) -> tuple[list[list[str]], bool]:
    """At most CSV_ROWS rows of at most CSV_COLUMNS cells of at most CELL_CHARS characters; the
    first row is the header. Returns the rows and whether anything was cut."""
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    rows: list[list[str]] = []
    cut = False
    reader = csv.reader(io.StringIO(text), dialect)
    try:
        for row in reader:
            if len(rows) >= CSV_ROWS:
                cut = True
                break
            if len(row) > CSV_COLUMNS:
                row, cut = row[:CSV_COLUMNS], True
            clipped = [cell[:CELL_CHARS] for cell in row]
            cut = cut or clipped != row
            rows.append(clipped)
    except csv.Error:
        cut = True
    return rows, cut


# --- Markdown -------------------------------------------------------------------------------------

_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_BULLET = re.compile(r"^\s*[-*+]\s+(.*)$")
_NUMBERED = re.compile(r"^\s*\d{1,9}[.)]\s+(.*)$")
_RULE = re.compile(r"^\s*([-*_])(\s*\1){2,}\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_CODE_SPAN = re.compile(r"`([^`\n]+)`")
_BOLD = re.compile(r"\*\*(?=\S)(.+?)(?<=\S)\*\*|__(?=\S)(.+?)(?<=\S)__")
_ITALIC = re.compile(r"(?<![*\w])\*(?=\S)(.+?)(?<=\S)\*(?!\*)|(?<![_\w])_(?=\S)(.+?)(?<=\S)_(?!\w)")
# Applied to escaped text: the URL cannot contain a quote or a tag (they are entities by then),
# nor a placeholder (a code span inside the address is no address).
_LINK = re.compile(r"\[([^\]\n]+)\]\((https?://[^\s()\x00]+)\)")
# A span already formatted, kept out of the later patterns' reach: NUL, its index, NUL (the file's
# own NULs are removed first, so only these are in the text).
_PLACEHOLDER = "\x00{}\x00"
_PLACEHOLDERS = re.compile(r"\x00(\d+)\x00")


def _emphasis(html: str) -> str:
    html = _BOLD.sub(lambda m: f"<strong>{m.group(1) or m.group(2)}</strong>", html)
    return _ITALIC.sub(lambda m: f"<em>{m.group(1) or m.group(2)}</em>", html)


def _inline(line: str) -> str:
    """One line of Markdown as HTML: escape first, then format the escaped text.

    A code span, then a link, becomes a placeholder so that no later pattern formats inside it;
    a link's text may hold code spans and emphasis. Each span's own placeholders are filled in
    when it is made, so one pass at the end fills in every span, however nested."""
    if len(line) > INLINE_CHARS:
        return escape(line)
    spans: list[str] = []

    def fill(html: str) -> str:
        return _PLACEHOLDERS.sub(lambda m: spans[int(m.group(1))], html)

    def hold(html: str) -> str:
        spans.append(html)
        return _PLACEHOLDER.format(len(spans) - 1)

    def link(match: re.Match[str]) -> str:
        text = fill(_emphasis(match.group(1)))
        return hold(f'<a href="{match.group(2)}" rel="nofollow noopener noreferrer">{text}</a>')

    html = _CODE_SPAN.sub(lambda m: hold(f"<code>{m.group(1)}</code>"), escape(line))
    html = _LINK.sub(link, html)
    return fill(_emphasis(html))


class _Markdown:
    """The block structure of `render_markdown`: paragraphs, lists, quotes and fenced code are
    gathered line by line and written out (`flush`) when a block ends."""

    def __init__(self) -> None:
        self.out: list[str] = []
        self.paragraph: list[str] = []
        self.items: list[str] = []
        self.list_tag = ""
        self.quote: list[str] = []
        self.code: list[str] | None = None

    def flush(self) -> None:
        if self.paragraph:
            self.out.append("<p>" + "<br>".join(_inline(p) for p in self.paragraph) + "</p>")
            self.paragraph.clear()
        if self.items:
            tag = self.list_tag
            self.out.append(f"<{tag}>" + "".join(f"<li>{i}</li>" for i in self.items) + f"</{tag}>")
            self.items.clear()
            self.list_tag = ""
        if self.quote:
            quoted = "<br>".join(_inline(q) for q in self.quote)
            self.out.append("<blockquote>" + quoted + "</blockquote>")
            self.quote.clear()

    def end_code(self) -> None:
        assert self.code is not None
        self.out.append("<pre><code>" + escape("\n".join(self.code)) + "</code></pre>")
        self.code = None

    def line(self, line: str) -> None:
        if self.code is not None:
            if _FENCE.match(line):
                self.end_code()
            else:
                self.code.append(line)
        elif _FENCE.match(line):
            self.flush()
            self.code = []
        elif not line.strip():
            self.flush()
        elif not self.standalone(line) and not self.list_item(line):
            self.text(line)

    def standalone(self, line: str) -> bool:
        """A heading or a rule: a block of one line."""
        if heading := _HEADING.match(line):
            self.flush()
            level = len(heading.group(1))
            self.out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
            return True
        if _RULE.match(line):
            self.flush()
            self.out.append("<hr>")
            return True
        return False

    def list_item(self, line: str) -> bool:
        bullet, numbered = _BULLET.match(line), _NUMBERED.match(line)
        item = bullet or numbered
        if item is None:
            return False
        tag = "ul" if bullet else "ol"
        if self.paragraph or self.quote or (self.items and self.list_tag != tag):
            self.flush()
        self.list_tag = tag
        self.items.append(_inline(item.group(1)))
        return True

    def text(self, line: str) -> None:
        """A quoted line, a list item's continuation, or a paragraph's line."""
        if line.lstrip().startswith(">"):
            if self.paragraph or self.items:
                self.flush()
            self.quote.append(line.lstrip()[1:].lstrip())
        elif self.items:  # a continuation line of the last item
            self.items[-1] += " " + _inline(line.strip())
        else:
            if self.quote:
                self.flush()
            self.paragraph.append(line.strip())


def render_markdown(text: str) -> SafeString:
    """A safe subset of Markdown. The file's own HTML is shown as text, never as markup."""
    text = text.replace("\x00", "")  # the placeholders' marker
    markdown = _Markdown()
    for line in text.replace("\r\n", "\n").split("\n"):
        markdown.line(line)
    if markdown.code is not None:  # an unclosed fence: the rest is code
        markdown.end_code()
    markdown.flush()
    return mark_safe("\n".join(markdown.out))  # noqa: S308 - every piece of text was escaped above


# --- What changed since the previous run ----------------------------------------------------------


def unified_diff(before: str, after: str, *, name: str) -> tuple[str, bool]:
    """A unified diff (text; the template escapes it) of at most DIFF_LINES lines, of at most
    PREVIEW_BYTES characters of each side."""
    cut = len(before) > PREVIEW_BYTES or len(after) > PREVIEW_BYTES
    lines = list(
        difflib.unified_diff(
            before[:PREVIEW_BYTES].splitlines(),
            after[:PREVIEW_BYTES].splitlines(),
            fromfile=f"{name} (previous run)",
            tofile=f"{name} (this run)",
            lineterm="",
            n=2,
        )
    )
    return "\n".join(lines[:DIFF_LINES]), cut or len(lines) > DIFF_LINES


def artifact_change(task_id: int, name: str) -> dict[str, int | str | bool] | None:
    """What write_artifact changed in `name` since the previous run: the newest content this
    task's newest writing run wrote, against the newest content an earlier run wrote. None when
    no earlier run wrote it (or nothing changed)."""
    writes = ToolCall.objects.filter(
        task_id=task_id,
        tool="write_artifact",
        status=ToolCallStatus.SUCCEEDED,
        arguments__name=name,
    ).order_by("-run__number", "-position")
    latest = writes.values("run__number", "arguments").first()
    if latest is None or latest["run__number"] is None:
        return None
    earlier = (
        writes.filter(run__number__lt=latest["run__number"])
        .values("run__number", "arguments")
        .first()
    )
    if earlier is None:
        return None
    after = str((latest["arguments"] or {}).get("content", ""))
    before = str((earlier["arguments"] or {}).get("content", ""))
    if after == before:
        return {"previous_run": earlier["run__number"], "run": latest["run__number"], "diff": ""}
    diff, cut = unified_diff(before, after, name=name)
    return {
        "previous_run": earlier["run__number"],
        "run": latest["run__number"],
        "diff": diff,
        "truncated": cut,
    }


def proposed_file(tool: str, arguments: object) -> dict[str, str | int | Preview] | None:
    """The file a pending write_artifact would write, shown as the file (bounded), for its
    approval card; None for any other operation."""
    if tool != "write_artifact" or not isinstance(arguments, dict):
        return None
    name, content = str(arguments.get("name") or ""), arguments.get("content")
    if not isinstance(content, str):
        return None
    content_type = str(arguments.get("content_type") or "text/plain")
    data = content.encode("utf-8", errors="replace")
    shown = preview_bytes(name, content_type, data[:PREVIEW_BYTES], len(data) > PREVIEW_BYTES)
    if shown.kind == "download":  # what the model wrote is text: show it as text
        shown = Preview(kind="text", text=content[:PREVIEW_BYTES], truncated=shown.truncated)
    return {"name": name, "content_type": content_type, "size": len(data), "preview": shown}


# The rejected run's artifacts on the task page: the first few, each read up to INLINE_BYTES.
INLINE_ARTIFACTS = 5
INLINE_BYTES = 16 * 1024


def artifact_previews(task_id: int, artifacts: Iterable[Artifact]) -> list[dict[str, object]]:
    """The first INLINE_ARTIFACTS of `artifacts`, each with its preview (bounded to INLINE_BYTES;
    a file that is gone or not a regular file in the task's folder is shown as missing)."""
    folder = artifacts_dir(task_id, create=False).resolve()
    shown: list[dict[str, object]] = []
    for artifact in list(artifacts)[:INLINE_ARTIFACTS]:
        path = folder / artifact.name
        try:
            safe_file_name(artifact.name)
            if path.is_symlink() or not path.is_file() or path.resolve().parent != folder:
                raise FileNotFoundError(artifact.name)
            data, truncated = read_bounded(path, INLINE_BYTES)
        except (InvalidInput, OSError):
            found = Preview(kind="download", note="The file is missing.")
        else:
            found = preview_bytes(artifact.name, artifact.content_type, data, truncated)
        shown.append({"artifact": artifact, "preview": found})
    return shown
