"""write_artifact: atomic, idempotent writes; size limit; hostile names."""

import hashlib
import os
from pathlib import Path

import pytest

from agents.catalogue.tools import ArtifactWritten, RecoveryClass, ToolContext, ToolError, get_tool

pytestmark = pytest.mark.timeout(30)


@pytest.fixture
def ctx(tmp_path: Path) -> ToolContext:
    (tmp_path / "ws").mkdir()
    return ToolContext(workspace=tmp_path / "ws", artifacts_dir=tmp_path / "artifacts")


def write(ctx, **args):
    tool = get_tool("write_artifact")
    return tool.run(tool.parse(args), ctx)


def refused(ctx, **args) -> ToolError:
    with pytest.raises(ToolError) as info:
        write(ctx, **args)
    return info.value


def test_write_creates_the_file_and_reports_it(ctx):
    content = "# Report\n\nAll good ✓\n"
    r = write(ctx, name="report.md", content=content, content_type="text/markdown")
    payload = content.encode()
    path = ctx.artifacts_dir / "report.md"
    assert path.read_bytes() == payload
    assert isinstance(r.artifact, ArtifactWritten)
    assert r.artifact.name == "report.md"
    assert r.artifact.path == path.resolve()
    assert r.artifact.size == len(payload)
    assert r.artifact.sha256 == hashlib.sha256(payload).hexdigest()
    assert r.artifact.content_type == "text/markdown"
    assert r.data == {
        "name": "report.md",
        "size": len(payload),
        "sha256": hashlib.sha256(payload).hexdigest(),
        "content_type": "text/markdown",
    }
    assert "report.md" in r.text
    assert r.network_requests == 0
    assert get_tool("write_artifact").recovery_class == RecoveryClass.IDEMPOTENT


def test_rewrite_replaces_the_content_leaving_one_file(ctx):
    write(ctx, name="out.csv", content="a,b\n1,2\n", content_type="text/csv")
    again = write(ctx, name="out.csv", content="a,b\n3,4\n", content_type="text/csv")
    assert (ctx.artifacts_dir / "out.csv").read_text() == "a,b\n3,4\n"
    assert sorted(os.listdir(ctx.artifacts_dir)) == ["out.csv"]
    # running the very same call again (crash recovery) gives the same file and hash
    third = write(ctx, name="out.csv", content="a,b\n3,4\n", content_type="text/csv")
    assert third.artifact.sha256 == again.artifact.sha256
    assert sorted(os.listdir(ctx.artifacts_dir)) == ["out.csv"]


def test_oversize_content_is_refused_before_writing(tmp_path):
    ctx = ToolContext(
        workspace=tmp_path, artifacts_dir=tmp_path / "artifacts", max_artifact_bytes=10
    )
    err = refused(ctx, name="big.txt", content="x" * 11)
    assert err.code == "artifact_too_large"
    assert err.details == {"size": 11, "limit": 10}
    assert not (tmp_path / "artifacts").exists()
    # the limit counts UTF-8 bytes, not characters
    assert refused(ctx, name="big.txt", content="é" * 6).code == "artifact_too_large"
    assert write(ctx, name="ok.txt", content="é" * 5).artifact.size == 10


def test_oversize_rewrite_keeps_the_old_file(tmp_path):
    ctx = ToolContext(workspace=tmp_path, artifacts_dir=tmp_path / "a", max_artifact_bytes=10)
    write(ctx, name="keep.txt", content="old")
    assert refused(ctx, name="keep.txt", content="n" * 50).code == "artifact_too_large"
    assert (tmp_path / "a" / "keep.txt").read_text() == "old"


@pytest.mark.parametrize(
    "name",
    [
        "../escape.txt",
        "a/b.txt",
        "/etc/passwd",
        ".hidden",
        ".",
        "..",
        "a\\b.txt",
        "with space.txt",
        "nul\x00.txt",
        "tab\t.txt",
        "ünïcode.txt",
        "%2e%2e%2fx",
    ],
)
def test_bad_names_are_refused(ctx, name):
    err = refused(ctx, name=name, content="x")
    assert err.code == "artifact_name_invalid"
    assert not ctx.artifacts_dir.exists() or os.listdir(ctx.artifacts_dir) == []


@pytest.mark.parametrize(
    "args",
    [
        {"name": "", "content": "x"},
        {"name": "x" * 101, "content": "x"},
        {"name": "a.txt"},
        {"name": "a.txt", "content": "x", "content_type": "not a type"},
        {"name": "a.txt", "content": 5},
        {"name": "a.txt", "content": "x", "mode": "append"},
    ],
)
def test_bad_arguments(ctx, args):
    with pytest.raises(ToolError) as info:
        get_tool("write_artifact").parse(args)
    assert info.value.code == "invalid_arguments"


def test_good_names(ctx):
    for name in ("a", "report-2024_01.final.md", "x" * 100, "_x", "-x", "A1.JSON"):
        assert write(ctx, name=name, content=name).artifact.name == name


def test_crash_mid_write_leaves_no_partial_file(ctx, monkeypatch):
    write(ctx, name="r.txt", content="old content")

    def boom(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    err = refused(ctx, name="r.txt", content="new content")
    assert err.code == "artifact_write_failed"
    monkeypatch.undo()
    assert (ctx.artifacts_dir / "r.txt").read_text() == "old content"
    assert os.listdir(ctx.artifacts_dir) == ["r.txt"]


def test_stale_temp_files_from_a_crash_are_cleaned(ctx):
    ctx.artifacts_dir.mkdir(parents=True)
    stale = ctx.artifacts_dir / ".tmp-r.txt.abc123"
    stale.write_text("half")
    other = ctx.artifacts_dir / ".tmp-other.txt.zzz"
    other.write_text("someone else's")
    write(ctx, name="r.txt", content="full")
    assert not stale.exists() and other.exists()
    assert (ctx.artifacts_dir / "r.txt").read_text() == "full"


def test_existing_folder_with_the_name_is_refused(ctx):
    (ctx.artifacts_dir / "dir.txt").mkdir(parents=True)
    assert refused(ctx, name="dir.txt", content="x").code == "artifact_name_invalid"


def test_symlink_named_like_the_artifact_is_replaced_not_followed(ctx, tmp_path):
    ctx.artifacts_dir.mkdir(parents=True)
    outside = tmp_path / "victim.txt"
    outside.write_text("precious")
    (ctx.artifacts_dir / "evil.txt").symlink_to(outside)
    assert refused(ctx, name="evil.txt", content="x").code == "artifact_name_invalid"
    assert outside.read_text() == "precious"
    inside = ctx.artifacts_dir / "other.txt"
    inside.write_text("untouched")
    (ctx.artifacts_dir / "alias.txt").symlink_to(inside)
    write(ctx, name="alias.txt", content="new")
    assert inside.read_text() == "untouched"
    assert not (ctx.artifacts_dir / "alias.txt").is_symlink()
    assert (ctx.artifacts_dir / "alias.txt").read_text() == "new"


def test_artifact_file_is_readable(ctx):
    r = write(ctx, name="m.txt", content="x")
    assert os.stat(r.artifact.path).st_mode & 0o777 == 0o644
