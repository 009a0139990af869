"""list_files / read_file / search_files: happy paths and hostile paths."""

import os
import socket
import time
import tracemalloc
from pathlib import Path

import pytest

from agents.catalogue.tools import ToolContext, ToolError, get_tool, resolve_in_workspace
from agents.catalogue.tools.files import _rel

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "a.txt").write_text("alpha\nBeta\ngamma\n")
    (root / "sub" / "b.txt").write_text("one\ntwo needle\nthree\n")
    (root / "sub" / "deep" / "c.md").write_text("# Needle\n")
    (root / "data.bin").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(100))
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP SECRET needle\n")
    return root


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    return ToolContext(workspace=ws, artifacts_dir=ws.parent / "artifacts")


def call(name: str, args: dict, ctx: ToolContext):
    tool = get_tool(name)
    return tool.run(tool.parse(args), ctx)


def refused(name: str, args: dict, ctx: ToolContext) -> ToolError:
    with pytest.raises(ToolError) as info:
        call(name, args, ctx)
    return info.value


# --------------------------------------------------------------------------- confinement


@pytest.mark.parametrize(
    ("relpath", "code"),
    [
        ("..", "path_outside_workspace"),
        ("../outside/secret.txt", "path_outside_workspace"),
        ("../../etc/passwd", "path_outside_workspace"),
        ("a/../../x", "path_outside_workspace"),
        ("./a/../../x", "path_outside_workspace"),
        ("sub/../a.txt", "path_outside_workspace"),
        ("sub/..", "path_outside_workspace"),
        ("/etc/passwd", "path_outside_workspace"),
        ("//etc/passwd", "path_outside_workspace"),
        ("..\\..\\x", "path_invalid"),
        ("sub\\b.txt", "path_invalid"),
        ("a.txt\x00.png", "path_invalid"),
        ("a\nb", "path_invalid"),
        ("a\x1bb", "path_invalid"),
        ("x" * 2000, "path_invalid"),
        ("d/" * 100 + "x", "path_invalid"),
        ("y" * 300, "path_invalid"),
        ("%2e%2e%2fetc%2fpasswd", "path_not_found"),
        ("%2e%2e/x", "path_not_found"),
        ("missing.txt", "path_not_found"),
    ],
)
def test_hostile_paths_are_refused(ws, ctx, relpath, code):
    with pytest.raises(ToolError) as info:
        resolve_in_workspace(ws, relpath)
    assert info.value.code == code
    for tool in ("read_file", "list_files", "search_files"):
        args = {"path": relpath, "pattern": "x"} if tool == "search_files" else {"path": relpath}
        assert refused(tool, args, ctx).code == code


def test_plain_paths_resolve(ws):
    assert resolve_in_workspace(ws, ".") == ws.resolve()
    assert resolve_in_workspace(ws, "") == ws.resolve()
    assert resolve_in_workspace(ws, "./sub//b.txt") == (ws / "sub" / "b.txt").resolve()
    # must_exist=False allows a new name in an existing folder
    assert resolve_in_workspace(ws, "sub/new.txt", must_exist=False).name == "new.txt"
    with pytest.raises(ToolError) as info:
        resolve_in_workspace(ws, "nofolder/new.txt", must_exist=False)
    assert info.value.code == "path_not_found"


def test_file_symlink_to_outside_is_refused(ws, ctx):
    (ws / "link.txt").symlink_to(ws.parent / "outside" / "secret.txt")
    err = refused("read_file", {"path": "link.txt"}, ctx)
    assert err.code == "path_outside_workspace"
    assert "SECRET" not in err.message


def test_directory_symlink_to_outside_is_refused(ws, ctx):
    (ws / "out").symlink_to(ws.parent / "outside", target_is_directory=True)
    assert refused("read_file", {"path": "out/secret.txt"}, ctx).code == "path_outside_workspace"
    assert refused("list_files", {"path": "out"}, ctx).code == "path_outside_workspace"
    # a nested symlinked folder component
    (ws / "sub" / "up").symlink_to(ws.parent, target_is_directory=True)
    err = refused("read_file", {"path": "sub/up/outside/secret.txt"}, ctx)
    assert err.code == "path_outside_workspace"


def test_symlink_loop_is_refused(ws, ctx):
    (ws / "loop1").symlink_to(ws / "loop2")
    (ws / "loop2").symlink_to(ws / "loop1")
    assert refused("read_file", {"path": "loop1"}, ctx).code in ("path_invalid", "path_not_found")


@pytest.mark.parametrize("tool", ["list_files", "read_file", "search_files"])
def test_a_workspace_removed_or_replaced_by_a_symlink_after_use_is_refused(ws, ctx, tool):
    """The workspace's real path is resolved once a process: a later call still finds the
    folder gone, or a symlink where it was, and reads nothing through it."""
    args = {"list_files": {}, "read_file": {"path": "a.txt"}, "search_files": {"pattern": "needle"}}
    call(tool, args[tool], ctx)
    moved = ws.parent / "moved"
    ws.rename(moved)
    assert refused(tool, args[tool], ctx).code == "path_not_found"
    ws.symlink_to(ws.parent / "outside")
    assert refused(tool, args[tool], ctx).code == "path_not_found"


def test_symlink_inside_the_workspace_is_followed(ws, ctx):
    (ws / "alias.txt").symlink_to(ws / "a.txt")
    assert "alpha" in call("read_file", {"path": "alias.txt"}, ctx).text


def test_listing_shows_but_never_follows_symlinks(ws, ctx):
    (ws / "out").symlink_to(ws.parent / "outside", target_is_directory=True)
    (ws / "alias.txt").symlink_to(ws / "a.txt")
    result = call("list_files", {"recursive": True}, ctx)
    by_path = {e["path"]: e for e in result.data["entries"]}
    assert by_path["out"] == {"path": "out", "kind": "symlink", "refused": True}
    assert by_path["alias.txt"]["target"] == "a.txt"
    assert not any(p.startswith("out/") for p in by_path)
    assert "secret" not in result.text
    assert "points outside the workspace" in result.text


def test_search_does_not_follow_symlinks_out(ws, ctx):
    (ws / "out").symlink_to(ws.parent / "outside", target_is_directory=True)
    (ws / "leak.txt").symlink_to(ws.parent / "outside" / "secret.txt")
    result = call("search_files", {"pattern": "needle"}, ctx)
    assert {m["path"] for m in result.data["matches"]} == {"sub/b.txt", "sub/deep/c.md"}
    assert "SECRET" not in result.text


@pytest.mark.timeout(10)
def test_fifo_is_refused_without_blocking(ws, ctx):
    os.mkfifo(ws / "pipe")
    start = time.monotonic()
    assert refused("read_file", {"path": "pipe"}, ctx).code == "path_not_regular"
    assert refused("analyze_csv", {"path": "pipe"}, ctx).code == "path_not_regular"
    assert time.monotonic() - start < 2
    listing = call("list_files", {}, ctx)
    assert {"path": "pipe", "kind": "other"} in listing.data["entries"]
    # the walk in search_files skips it too (and does not hang)
    assert call("search_files", {"pattern": "zzz"}, ctx).data["matches"] == []


def test_dev_zero_through_a_symlink_is_refused(ws, ctx):
    (ws / "zero").symlink_to("/dev/zero")
    (ws / "devdir").symlink_to("/dev", target_is_directory=True)
    assert refused("read_file", {"path": "zero"}, ctx).code == "path_outside_workspace"
    assert refused("read_file", {"path": "devdir/zero"}, ctx).code == "path_outside_workspace"
    assert refused("search_files", {"pattern": "a", "path": "zero"}, ctx).code == (
        "path_outside_workspace"
    )


def test_device_node_inside_workspace_is_refused(ws, ctx):
    import stat

    try:
        os.mknod(ws / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))
    except (PermissionError, OSError) as exc:
        pytest.skip(f"cannot create a device node here: {exc}")
    assert refused("read_file", {"path": "zero"}, ctx).code == "path_not_regular"


def test_socket_file_is_refused(ws, ctx):
    path = ws / "s.sock"
    if len(str(path)) > 100:
        pytest.skip("path too long for a unix socket")
    srv = socket.socket(socket.AF_UNIX)
    try:
        srv.bind(str(path))
        assert refused("read_file", {"path": "s.sock"}, ctx).code == "path_not_regular"
    finally:
        srv.close()


def test_directory_is_not_a_file(ws, ctx):
    assert refused("read_file", {"path": "sub"}, ctx).code == "path_is_directory"


# --------------------------------------------------------------------------- list_files


def test_list_files_flat_and_recursive(ws, ctx):
    flat = call("list_files", {}, ctx)
    assert [e["path"] for e in flat.data["entries"]] == ["a.txt", "data.bin", "sub"]
    assert flat.data["entries"][0] == {"path": "a.txt", "kind": "file", "size": 17}
    deep = call("list_files", {"path": "sub", "recursive": True}, ctx)
    assert [e["path"] for e in deep.data["entries"]] == ["sub/b.txt", "sub/deep", "sub/deep/c.md"]
    assert "dir      sub/deep/" in deep.text
    single = call("list_files", {"path": "sub/b.txt"}, ctx)
    assert single.data["entries"] == [{"path": "sub/b.txt", "kind": "file", "size": 21}]


def test_list_files_caps_entries(ws, ctx):
    for i in range(30):
        (ws / f"f{i:02}.txt").write_text("x")
    result = call("list_files", {"max_entries": 10}, ctx)
    assert len(result.data["entries"]) == 10
    assert result.data["truncated"] is True
    assert "more exist" in result.text
    assert refused("list_files", {"max_entries": 0}, ctx).code == "invalid_arguments"


# --------------------------------------------------------------------------- read_file


def test_read_file_ranges(ws, ctx):
    (ws / "n.txt").write_text("".join(f"line {i}\n" for i in range(1, 11)))
    r = call("read_file", {"path": "n.txt", "start_line": 3, "max_lines": 4}, ctx)
    assert r.data["start_line"] == 3 and r.data["end_line"] == 6
    assert r.data["total_lines"] == 10 and r.data["more"] is True
    assert r.data["next_start_line"] == 7
    assert "     3\tline 3" in r.text and "line 7" not in r.text
    assert "continue with start_line=7" in r.text
    end = call("read_file", {"path": "n.txt", "start_line": 9}, ctx)
    assert end.data["end_line"] == 10 and end.data["more"] is False
    assert "[end of file]" in end.text
    past = call("read_file", {"path": "n.txt", "start_line": 50}, ctx)
    assert past.data["lines_returned"] == 0
    assert "10 lines" in past.text and "past the end" in past.text


def test_read_file_crlf_bom_no_final_newline_and_empty(ws, ctx):
    (ws / "w.txt").write_bytes(b"\xef\xbb\xbfone\r\ntwo\r\nthree")
    r = call("read_file", {"path": "w.txt"}, ctx)
    assert r.text.splitlines()[1:4] == ["     1\tone", "     2\ttwo", "     3\tthree"]
    assert r.data["total_lines"] == 3
    (ws / "empty.txt").write_bytes(b"")
    assert "empty" in call("read_file", {"path": "empty.txt"}, ctx).text


@pytest.mark.parametrize(
    "content",
    [b"\x89PNG\r\n\x1a\n\x00\x00", b"text then \x00 nul", b"caf\xe9 latin-1 text\n" * 10],
)
def test_binary_files_are_refused(ws, ctx, content):
    (ws / "blob").write_bytes(content)
    err = refused("read_file", {"path": "blob"}, ctx)
    assert err.code == "path_is_binary"
    assert f"{len(content)} bytes" in err.message
    assert err.details["size"] == len(content)


def test_utf8_cut_at_the_sniff_boundary_is_still_text(ws, ctx):
    (ws / "u.txt").write_bytes(b"a" * 8191 + "é".encode() + b"\nnext\n")
    assert "next" in call("read_file", {"path": "u.txt"}, ctx).text


def test_overlong_line_is_cut(ws, ctx):
    (ws / "long.txt").write_bytes(b"x" * 1_000_000 + b"\nafter\n")
    r = call("read_file", {"path": "long.txt"}, ctx)
    assert r.data["cut_lines"] == [1]
    assert "line cut" in r.text and "after" in r.text
    assert len(r.text) < 20_000


def test_read_stops_at_the_byte_cap(ws, ctx):
    (ws / "wide.txt").write_text(("y" * 999 + "\n") * 2000)
    r = call("read_file", {"path": "wide.txt", "max_lines": 2000}, ctx)
    assert r.data["lines_returned"] == 200
    assert r.data["more"] is True and r.data["next_start_line"] == 201
    assert "byte limit" in r.text


@pytest.mark.timeout(60)
def test_lines_near_the_end_of_a_150mb_file_with_bounded_memory(ws, ctx):
    block = "".join(f"filler line {i:07d} {'.' * 79}\n" for i in range(10_000)).encode()
    assert len(block) == 1_000_000
    blocks = 150
    with open(ws / "huge.log", "wb") as fh:
        for _ in range(blocks):
            fh.write(block)
        fh.write(b"tail one\ntail two\ntail three\n")
    total = blocks * 10_000 + 3
    tracemalloc.start()
    try:
        start = time.monotonic()
        r = call("read_file", {"path": "huge.log", "start_line": total - 3, "max_lines": 10}, ctx)
        elapsed = time.monotonic() - start
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert r.data["start_line"] == total - 3 and r.data["end_line"] == total
    assert r.text.splitlines()[-4:] == [
        f"{total - 2:>6}\ttail one",
        f"{total - 1:>6}\ttail two",
        f"{total:>6}\ttail three",
        "[end of file]",
    ]
    assert r.data["total_lines"] == total
    assert peak < 16 * 1024 * 1024, f"peak {peak} bytes"
    assert elapsed < 10
    middle = call("read_file", {"path": "huge.log", "start_line": 700_001, "max_lines": 2}, ctx)
    assert "filler line 0000000" in middle.text and middle.data["total_lines"] is None
    assert middle.data["more"] is True


# --------------------------------------------------------------------------- search_files


def test_search_literal_is_case_insensitive_by_default(ws, ctx):
    r = call("search_files", {"pattern": "needle"}, ctx)
    assert [(m["path"], m["line"]) for m in r.data["matches"]] == [
        ("sub/b.txt", 2),
        ("sub/deep/c.md", 1),
    ]
    assert "sub/b.txt:2: two needle" in r.text
    assert {"path": "data.bin", "reason": "binary"} in r.data["skipped"]
    sensitive = call("search_files", {"pattern": "Needle", "case_sensitive": True}, ctx)
    assert [m["path"] for m in sensitive.data["matches"]] == ["sub/deep/c.md"]


def test_search_literal_treats_regex_characters_literally(ws, ctx):
    (ws / "r.txt").write_text("a.c\nabc\n(x+)\n")
    assert [m["line"] for m in call("search_files", {"pattern": "a.c"}, ctx).data["matches"]] == [1]
    assert call("search_files", {"pattern": "(x+)"}, ctx).data["matches"][0]["line"] == 3


def test_search_regex_and_path(ws, ctx):
    r = call("search_files", {"pattern": r"^t\w+", "regex": True, "path": "sub"}, ctx)
    assert [(m["path"], m["text"]) for m in r.data["matches"]] == [
        ("sub/b.txt", "two needle"),
        ("sub/b.txt", "three"),
    ]
    single = call("search_files", {"pattern": "gamma", "path": "a.txt"}, ctx)
    assert single.data["matches"] == [{"path": "a.txt", "line": 3, "text": "gamma"}]


@pytest.mark.parametrize("pattern", ["(unclosed", "[a-", "*x", "(?P<n>a)(?P<n>b)"])
def test_invalid_regex(ws, ctx, pattern):
    assert refused("search_files", {"pattern": pattern, "regex": True}, ctx).code == (
        "regex_invalid"
    )


@pytest.mark.parametrize("pattern", [r"(a+)+$", r"(a*)*b", r"(\w+\s?)+$", r"((ab)*c+)*"])
def test_nested_repetition_is_searched_in_linear_time(ws, ctx, pattern):
    # A backtracking engine needs exponential time here; the search engine does not backtrack.
    (ws / "long.txt").write_text("a" * 3000 + "!\n")
    r = call("search_files", {"pattern": pattern, "regex": True, "path": "long.txt"}, ctx)
    assert r.data["timed_out"] is False


@pytest.mark.parametrize("pattern", [r"a(?=b)", r"(?<!x)a", r"(a)\1", r"a{1001}"])
def test_regex_features_that_need_backtracking_are_refused(ws, ctx, pattern):
    err = refused("search_files", {"pattern": pattern, "regex": True}, ctx)
    assert err.code == "regex_invalid" and "linear-time engine" in err.message


def test_search_caps_matches(ws, ctx):
    (ws / "many.txt").write_text("hit\n" * 500)
    r = call("search_files", {"pattern": "hit", "max_matches": 25}, ctx)
    assert len(r.data["matches"]) == 25 and r.data["truncated"] is True
    assert "max_matches=25" in r.text


def test_search_examines_only_the_start_of_long_lines(ws, ctx):
    (ws / "long.txt").write_text(
        "a" * 5000 + "FARNEEDLE" + "\n" + "b" * 100 + "NEAR" + "c" * 9000 + "\n"
    )
    assert call("search_files", {"pattern": "FARNEEDLE"}, ctx).data["matches"] == []
    near = call("search_files", {"pattern": "NEAR"}, ctx).data["matches"]
    assert near[0]["line"] == 2 and len(near[0]["text"]) < 400


def test_search_skips_files_over_the_size_cap(ws, ctx):
    with open(ws / "big.txt", "wb") as fh:
        fh.write(b"needle\n")
        fh.truncate(21 * 1024 * 1024)
    r = call("search_files", {"pattern": "needle"}, ctx)
    assert {"path": "big.txt", "reason": "too_large"} in r.data["skipped"]
    assert "big.txt" not in {m["path"] for m in r.data["matches"]}


def test_search_bad_arguments(ws, ctx):
    assert refused("search_files", {"pattern": ""}, ctx).code == "invalid_arguments"
    assert refused("search_files", {"pattern": "x", "max_matches": 5000}, ctx).code == (
        "invalid_arguments"
    )


@pytest.mark.parametrize(
    ("root", "real"),
    [
        ("/w/task", "/w/task"),
        ("/w/task", "/w/task/a.txt"),
        ("/w/task", "/w/task/sub/deeper/b.csv"),
        ("/w/task", "/w/task-other/c.txt"),  # a sibling sharing the prefix: not inside
        ("/", "/etc/hosts"),
        ("/w/task/", "/w/task/a.txt"),
    ],
)
def test_rel_is_relpath_with_forward_slashes(root, real):
    assert _rel(root, real) == os.path.relpath(real, root)
