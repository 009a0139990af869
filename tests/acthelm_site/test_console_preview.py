"""console.preview: a file shown in the page is escaped and bounded — Markdown as a
small safe subset (never the file's own HTML), CSV as cells, anything not text as a download —
and a rewritten artifact shows what changed since the previous run."""

import pytest

from agents.states import ToolCallStatus
from console import preview
from tasks.states import TaskStatus
from tests.console.scenes import run_for
from tests.factories import TaskFactory, ToolCallFactory, TurnFactory


def test_markdown_is_formatted_and_its_html_is_only_text():
    html = preview.render_markdown(
        "# Title <b>x</b>\n\nSome **bold**, _it_ and `<i>code</i>`.\n\n"
        "<script>alert(1)</script>\n<img src=x onerror=alert(2)>\n\n"
        "- one\n- [a link](https://example.org/a_b?x=1&y=2)\n\n"
        '[bad](javascript:alert(3)) [quote](https://e.org/"onmouseover=alert(4))\n\n'
        "```\n<script>in code</script>\n```\n> said\n"
    )
    assert "<h1>Title &lt;b&gt;x&lt;/b&gt;</h1>" in html
    assert "<strong>bold</strong>" in html and "<em>it</em>" in html
    assert "<code>&lt;i&gt;code&lt;/i&gt;</code>" in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html and "<script" not in html
    assert "<img" not in html and "&lt;img" in html
    assert (
        '<a href="https://example.org/a_b?x=1&amp;y=2" rel="nofollow noopener noreferrer">' in html
    )
    assert "javascript:" not in html.split("[bad]")[0] and 'href="javascript' not in html
    assert '"onmouseover' not in html  # a quote cannot leave the attribute
    assert "<pre><code>&lt;script&gt;in code&lt;/script&gt;</code></pre>" in html
    assert "<blockquote>said</blockquote>" in html


LINK = '<a href="http://x" rel="nofollow noopener noreferrer">'


@pytest.mark.parametrize(
    ("markdown", "expected"),
    [
        # A code span inside a link (issue 32: it showed the placeholder, NUL 0 NUL).
        ("[see `code`](http://x)", f"<p>{LINK}see <code>code</code></a></p>"),
        (
            "[`a` and `b<i>`](http://x)",
            f"<p>{LINK}<code>a</code> and <code>b&lt;i&gt;</code></a></p>",
        ),
        ("[**bold** `c`](http://x)", f"<p>{LINK}<strong>bold</strong> <code>c</code></a></p>"),
        (
            "**[`c`](http://x)** and _`d`_",
            f"<p><strong>{LINK}<code>c</code></a></strong> and <em><code>d</code></em></p>",
        ),
        (
            "`x` [a](http://x) `y` [`b`](http://x)",
            f"<p><code>x</code> {LINK}a</a> <code>y</code> {LINK}<code>b</code></a></p>",
        ),
        # A code span holding a link's syntax stays code; one in the address is no link.
        ("`[a](http://x)`", "<p><code>[a](http://x)</code></p>"),
        ("[a](http://x/`y`)", "<p>[a](http://x/<code>y</code>)</p>"),
        ("- [`k`](http://x)", f"<ul><li>{LINK}<code>k</code></a></li></ul>"),
        ("> [`q`](http://x)", f"<blockquote>{LINK}<code>q</code></a></blockquote>"),
        ("# [`h`](http://x)", f"<h1>{LINK}<code>h</code></a></h1>"),
        # The file's own NULs cannot forge a placeholder.
        ("\x000\x00 `c` [\x001\x00](http://x)", f"<p>0 <code>c</code> {LINK}1</a></p>"),
    ],
)
def test_nested_inline_markdown_is_filled_in_and_escaped(markdown, expected):
    html = preview.render_markdown(markdown)
    assert html == expected
    assert "\x00" not in html


def test_csv_is_a_bounded_table_of_cells():
    rows, cut = preview.csv_rows('region,total\nnorth,"<b>12</b>"\n')
    assert rows == [["region", "total"], ["north", "<b>12</b>"]] and not cut
    many = "a,b\n" + "1,2\n" * (preview.CSV_ROWS + 5)
    rows, cut = preview.csv_rows(many)
    assert len(rows) == preview.CSV_ROWS and cut
    wide, cut = preview.csv_rows(",".join(["x"] * 100) + "\n")
    assert len(wide[0]) == preview.CSV_COLUMNS and cut


@pytest.mark.parametrize(
    ("name", "content_type", "data", "kind"),
    [
        ("report.md", "text/plain", b"# r", "markdown"),
        ("data.csv", "text/csv", b"a,b\n1,2\n", "csv"),
        ("notes.txt", "", b"hello", "text"),
        ("page.html", "text/html", b"<script>x</script>", "text"),
        ("image.png", "image/png", b"\x89PNG\r\n\x1a\n\x00\x00", "download"),
        ("blob.txt", "text/plain", b"\x00\x01binary", "download"),
        ("latin.txt", "text/plain", "é".encode("latin-1") + b" more text", "download"),
    ],
)
def test_what_a_file_is_shown_as(name, content_type, data, kind):
    assert preview.preview_bytes(name, content_type, data, False).kind == kind


def test_the_preview_reads_at_most_its_bound(tmp_path):
    path = tmp_path / "big.txt"
    path.write_bytes(b"x" * (preview.PREVIEW_BYTES + 10))
    shown = preview.preview_file(path, "big.txt")
    assert shown.truncated and len(shown.text) == preview.PREVIEW_BYTES


def test_a_write_artifact_approval_shows_the_file_it_would_become():
    file = preview.proposed_file(
        "write_artifact",
        {"name": "r.md", "content": "# Hi\n<script>x</script>", "content_type": "text/markdown"},
    )
    assert file["name"] == "r.md" and file["preview"].kind == "markdown"
    assert "<h1>Hi</h1>" in file["preview"].html and "<script" not in file["preview"].html
    assert preview.proposed_file("fetch_url", {"url": "https://e.org"}) is None


@pytest.mark.django_db
def test_a_reopened_task_shows_what_changed_since_the_previous_run():
    task = TaskFactory(status=TaskStatus.REVIEW)
    for number, content in ((1, "# Summary\nold line\nsame\n"), (2, "# Summary\nnew line\nsame\n")):
        run = run_for(task, number=number)
        turn = TurnFactory(task=task, run=run, index=number)
        ToolCallFactory(
            turn=turn,
            tool="write_artifact",
            arguments={"name": "summary.md", "content": content + "<b>x</b>"},
            status=ToolCallStatus.SUCCEEDED,
        )
    change = preview.artifact_change(task.pk, "summary.md")
    assert (change["previous_run"], change["run"]) == (1, 2)
    assert "-old line" in change["diff"] and "+new line" in change["diff"]
    assert " same" in change["diff"]
    assert preview.artifact_change(task.pk, "other.md") is None
    once = TaskFactory(status=TaskStatus.REVIEW)
    turn = TurnFactory(task=once, run=run_for(once))
    ToolCallFactory(
        turn=turn,
        tool="write_artifact",
        arguments={"name": "a.md", "content": "x"},
        status=ToolCallStatus.SUCCEEDED,
    )
    assert preview.artifact_change(once.pk, "a.md") is None


def test_hostile_sizes_stay_bounded():
    line = "*a " * 50_000  # a long line full of emphasis markers: escaped, not formatted
    html = preview.render_markdown(line)
    assert "<em>" not in html and html.startswith("<p>*a")
    diff, cut = preview.unified_diff("x\n" * 300_000, "y\n" * 300_000, name="big.txt")
    assert cut and diff.count("\n") < preview.DIFF_LINES
