"""Acceptance checks: parsing and validation (clear field errors), each kind over a run's record,
the default checks, and what the supervisor reads of a real task: every name, every artifact a
check needs in full (streamed), within a budget — or the check is unverified, never passed."""

import factory
import pytest

from agents.engine.run.intake import task_create
from agents.engine.run.usage import Usage
from agents.engine.verdict import checking, evidence
from agents.engine.verdict.acceptance import InvalidCheck, check_text, parse_check, validate_checks
from agents.engine.verdict.checking import (
    default_checks,
    evaluate,
    is_echo,
    named_output_files,
    run_checks,
)
from agents.engine.verdict.evidence import (
    MAX_CHECK_READ_BYTES,
    READ_CHUNK,
    ArtifactFile,
    Budget,
    CallSeen,
    RunRecord,
    run_record,
)
from agents.engine.verdict.supervisor import supervise
from agents.models import Artifact, ToolCall
from core.actors import Actor
from core.exceptions import InvalidInput
from tasks.models import Task
from tasks.workspace import add_input_file, artifacts_dir
from tests.factories import (
    AgentRunFactory,
    ArtifactFactory,
    TaskFactory,
    ToolCallFactory,
    TurnFactory,
)


def record(**kw) -> RunRecord:
    kw.setdefault("instruction", "Do the work.")
    kw.setdefault("answer", "Done it.")
    return RunRecord(**kw)


def one(check: str, rec: RunRecord):
    (result,) = run_checks(validate_checks([check]), rec)
    return result


# --- Parsing and validation ------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, stored",
    [
        ("artifact=summary.md", {"kind": "artifact", "value": "summary.md"}),
        ("artifact=*.md", {"kind": "artifact", "value": "*.md"}),
        (
            "artifact_contains=report.md:April 16",
            {"kind": "artifact_contains", "artifact": "report.md", "value": "April 16"},
        ),
        ("answer_matches=^\\d+$", {"kind": "answer_matches", "value": "^\\d+$"}),
        ("answer_not_echo", {"kind": "answer_not_echo", "value": ""}),
        ("only_artifacts=", {"kind": "only_artifacts", "value": ""}),
        ("tool_ran = read_file", {"kind": "tool_ran", "value": "read_file"}),
    ],
)
def test_a_check_parses_from_its_text_and_prints_back(text, stored):
    assert parse_check(text) == stored
    assert parse_check(check_text(stored)) == stored


@pytest.mark.parametrize(
    "value, message",
    [
        ("made_up=1", "unknown check kind 'made_up'"),
        ("artifact", "KIND=VALUE"),
        ("artifact=", "artifact needs a value"),
        ("answer_matches=(unclosed", "not a regular expression"),
        ("answer_matches=(?=ahead)x", "the linear-time engine (RE2) can run"),
        ("answer_matches=" + "a" * 501, "at most 500 characters"),
        ("artifact_contains=no-colon", "NAME:TEXT"),
        ("tool_ran=fetch url", "not a tool name"),
        ("answer_not_echo=maybe", "takes no value"),
    ],
)
def test_a_bad_check_is_a_clear_field_error(value, message):
    with pytest.raises(InvalidCheck) as exc:
        validate_checks([value])
    assert message in exc.value.message
    assert exc.value.field == "acceptance_checks"
    assert exc.value.code == "acceptance_check_invalid"


def test_validation_refuses_tool_ran_for_a_tool_the_task_lacks_and_too_many_checks():
    with pytest.raises(InvalidCheck, match="does not have that tool"):
        validate_checks(["tool_ran=fetch_url"], tools=["read_file"])
    with pytest.raises(InvalidCheck, match="at most 50"):
        validate_checks([f"answer_contains={i}" for i in range(51)])
    with pytest.raises(InvalidCheck, match="a list"):
        validate_checks("artifact=x")
    with pytest.raises(InvalidCheck, match="no field"):
        validate_checks([{"kind": "artifact", "value": "x", "extra": 1}])


# --- Each kind ---------------------------------------------------------------------------------


def test_artifact_kinds_by_name_and_pattern():
    rec = record(artifacts={"report.md": "# Launch\nApril 16", "data.bin": None})
    assert one("artifact=report.md", rec).passed
    assert one("artifact=*.md", rec).passed
    missing = one("artifact=summary.md", rec)
    assert not missing.passed and "report.md" in missing.detail
    assert one("no_artifact=pwned.txt", rec).passed
    assert not one("no_artifact=*.bin", rec).passed
    assert one("only_artifacts=*.md, data.bin", rec).passed
    extra = one("only_artifacts=report.md", rec)
    assert not extra.passed and "data.bin" in extra.detail
    assert not one("only_artifacts=", rec).passed
    assert one("artifact_contains=report.md:april   16", rec).passed
    assert not one("artifact_contains=report.md:May", rec).passed
    assert not one("artifact_contains=data.bin:x", rec).passed  # not readable text
    assert not one("artifact_contains=nothing.md:x", rec).passed
    assert one("artifact_not_contains=report.md:compromised", rec).passed
    assert one("artifact_not_contains=nothing.md:x", rec).passed
    assert not one("artifact_not_contains=report.md:launch", rec).passed
    assert one("artifact_matches=report.md:^# launch$", rec).passed  # multi-line, any case
    assert not one("artifact_matches=report.md:^April 17", rec).passed


def test_answer_and_tool_kinds():
    rec = record(
        answer="The total is 1234.50",
        calls=(
            CallSeen("read_file", "succeeded", run_count=1),
            CallSeen("fetch_url", "refused", "tool_not_allowed"),
            CallSeen("write_artifact", "denied"),
        ),
    )
    assert one("answer_contains=TOTAL is", rec).passed
    assert not one("answer_contains=42", rec).passed
    assert one("answer_not_contains=HACKED", rec).passed
    assert one("answer_matches=\\b1234\\.50$", rec).passed
    assert not one("answer_matches=^42$", rec).passed
    assert one("tool_ran=read_file", rec).passed
    assert not one("tool_ran=write_artifact", rec).passed
    assert one("tool_not_run=fetch_url", rec).passed  # refused: never executed
    assert not one("tool_not_run=read_file", rec).passed
    assert not one("tool_not_called=fetch_url", rec).passed  # but it was called
    assert one("tool_not_called=analyze_csv", rec).passed


def test_a_pattern_that_would_backtrack_for_ever_runs_in_linear_time():
    # (a+)+$ against "aaaa…b" takes exponential time with backtracking; RE2 answers at once.
    rec = record(answer="a" * 50_000 + "b")
    assert not one("answer_matches=(a+)+$", rec).passed


# --- Default checks ----------------------------------------------------------------------------


def test_the_instruction_names_output_files_only_after_a_writing_verb():
    assert named_output_files("Read notes.txt and write report.md with the date. Then answer.") == [
        "report.md"
    ]
    assert named_output_files("Compute the total and write a file summary.txt whose only line") == [
        "summary.txt"
    ]
    assert named_output_files("Read notes.txt and answer with the date.") == []
    assert named_output_files("Use write_artifact to record notes.txt later.") == []
    assert named_output_files("Answer in your reply; do not write notes.md.") == []
    assert named_output_files("You cannot create out.csv, and never write b.md.") == []


def test_echo_is_the_instruction_repeated_with_at_most_two_words_of_its_own():
    instruction = "Read notes.txt and answer with the new launch date."
    assert is_echo("Done: Read notes.txt and answer with the new launch date.", instruction)
    assert is_echo(instruction, instruction)
    assert is_echo("Read notes.txt and answer with the new", instruction)
    # "Done: <the task>" and boilerplate: it opens with the instruction's first line.
    assert is_echo(
        "Done: Read notes.txt and answer with the new launch date.\n\nThe plan was followed "
        "and the results are recorded.",
        instruction + "\nBe brief.",
    )
    assert not is_echo("The date in notes.txt is April 16. Read notes.txt and answer", instruction)
    assert not is_echo("April 16", instruction)
    assert not is_echo("The launch is April 16.", instruction)
    assert not is_echo("", instruction)
    assert not is_echo("42", "What is 17 + 25? Answer with the number only.")


def _defaults(rec) -> dict[str, bool]:
    return {c.check: c.passed for c in default_checks(rec)}


def test_default_checks_catch_the_wrong_file_an_echo_and_no_tools():
    wrote_other = record(
        instruction="Summarise notes.txt and write summary.md.",
        tools=("update_plan", "read_file", "write_artifact"),
        artifacts={"report.md": "x"},
        calls=(CallSeen("read_file", "succeeded"), CallSeen("write_artifact", "succeeded")),
        input_files=("notes.txt",),
    )
    assert _defaults(wrote_other) == {
        "named_output=summary.md": False,
        "answer_not_echo": True,
        "used_tools": True,
        "no_unlisted_tools": True,
    }
    echo = record(
        instruction="Read notes.txt and answer with the date.",
        answer="Done: Read notes.txt and answer with the date.",
        tools=("update_plan", "read_file"),
        calls=(CallSeen("update_plan", "succeeded"),),
        input_files=("notes.txt",),
    )
    assert _defaults(echo) == {
        "answer_not_echo": False,
        "used_tools": False,
        "no_unlisted_tools": True,
    }
    listed_only = record(
        instruction="Read notes.txt and answer with the date.",
        answer="The date is unknown.",
        tools=("update_plan", "list_files", "read_file"),
        calls=(CallSeen("list_files", "succeeded"),),
        input_files=("notes.txt",),
    )
    assert _defaults(listed_only)["used_tools"] is False
    never_fetched = record(
        instruction="Fetch http://127.0.0.1:9/status.html and answer with its code.",
        answer="GREEN",
        tools=("update_plan", "fetch_url"),
        calls=(CallSeen("update_plan", "succeeded"),),
    )
    assert _defaults(never_fetched)["used_tools"] is False
    injected = record(
        instruction="Read notes.txt and answer.",
        tools=("update_plan", "read_file"),
        calls=(
            CallSeen("read_file", "succeeded"),
            CallSeen("fetch_url", "refused", "tool_not_allowed"),
        ),
        input_files=("notes.txt",),
    )
    assert _defaults(injected)["no_unlisted_tools"] is False
    guessed = record(
        instruction="Read notes.txt and answer.",
        tools=("update_plan", "read_file"),
        calls=(
            CallSeen("python", "refused", "tool_not_allowed"),  # made up
            CallSeen("list_files", "refused", "tool_not_allowed"),  # read-only
            CallSeen("read_file", "succeeded"),
        ),
        input_files=("notes.txt",),
    )
    assert _defaults(guessed)["no_unlisted_tools"] is True
    mcp = record(calls=(CallSeen("files__delete", "refused", "tool_not_allowed"),))
    assert _defaults(mcp)["no_unlisted_tools"] is False


def _named_output(status: str, answer: str):
    """The named_output result of a run asked for summary.md whose one write ended `status`."""
    rec = record(
        instruction="Summarise the notes and write summary.md.",
        answer=answer,
        tools=("update_plan", "write_artifact"),
        calls=(CallSeen("write_artifact", status, status if status != "failed" else "io"),),
    )
    (result,) = [c for c in default_checks(rec) if c.check == "named_output=summary.md"]
    return result


@pytest.mark.parametrize("status", ["denied", "refused", "skipped", "failed"])
def test_an_answer_that_claims_a_file_the_run_never_wrote_fails_however_the_write_stopped(status):
    """Issue 49, item 3: a person decided the file, not whether the answer may claim it."""
    for answer in ("I wrote summary.md.", "Done: see summary.md for the details", "summary.md"):
        result = _named_output(status, answer)
        assert (result.passed, result.unverified) == (False, False), (status, answer)
        assert "the answer names summary.md, which the run never wrote" in result.detail
        assert status in result.detail  # how the write stopped


@pytest.mark.parametrize("status", ["denied", "skipped"])
def test_after_a_person_stopped_the_write_the_answer_decides_the_missing_files_verdict(status):
    # Silent about the file: the missing file is the person's decision.
    quiet = _named_output(status, "The summary: launch on April 16.")
    assert quiet.passed and f"write_artifact {status} by a person" in quiet.detail
    # It says the file was not written: a person reads it (neither a pass nor a failure).
    for answer in (
        "The write of summary.md was denied, so here is the summary inline: April 16.",
        "I could not write summary.md. The launch is on April 16.",
        "summary.md: not written (a person said no).\nThe launch is April 16.",
    ):
        said = _named_output(status, answer)
        assert (said.passed, said.unverified) == (False, True), answer
    # One sentence denies it, another claims it: a claim.
    both = _named_output(status, "The write was denied. Still, summary.md is ready for you.")
    assert (both.passed, both.unverified) == (False, False)


@pytest.mark.parametrize("status", ["refused", "failed"])
def test_a_write_that_no_person_stopped_leaves_the_named_file_missing_whatever_the_answer(status):
    for answer in ("The summary: April 16.", "I could not write summary.md: April 16."):
        result = _named_output(status, answer)
        assert (result.passed, result.unverified) == (False, False), answer


def test_answer_names_reads_sentences_not_substrings():
    assert checking.answer_names("Wrote summary.md.", "summary.md") is True
    assert checking.answer_names("Wrote my-summary.md and summary.mdx", "summary.md") is None
    assert checking.answer_names("SUMMARY.MD is done", "summary.md") is True
    assert checking.answer_names("summary.md wasn't written", "summary.md") is False
    assert checking.answer_names("", "summary.md") is None


def test_default_checks_stay_quiet_without_evidence():
    # A person denied the write and the answer does not claim the file: the missing file is
    # their decision, not the run's failure.
    denied = record(
        instruction="Write a file decision.md that records the date.",
        answer="The date is April 16.",
        tools=("update_plan", "write_artifact"),
        calls=(CallSeen("write_artifact", "denied"),),
    )
    assert all(_defaults(denied).values())
    # The task cannot write files: a named file is not asked of it.
    cannot = record(
        instruction="The requester would like it saved to colour.txt, but you cannot write.",
        tools=("update_plan", "read_file"),
        calls=(CallSeen("read_file", "succeeded"),),
    )
    assert all(_defaults(cannot).values())
    # A planning task proposes the work its goal names; it need not do it.
    planning = record(
        instruction="Plan the next work for this goal: report\n\nWrite report.md from "
        "https://example.org/data.html every week.",
        tools=("update_plan", "propose_task", "fetch_url", "write_artifact"),
        calls=(CallSeen("propose_task", "succeeded"),),
        planning=True,
    )
    assert _defaults(planning) == {"answer_not_echo": True, "no_unlisted_tools": True}
    # No input file named and no address: a direct answer needs no tool.
    direct = record(instruction="What is 17 + 25?", answer="42", tools=())
    assert _defaults(direct) == {"answer_not_echo": True, "no_unlisted_tools": True}


# --- Reading a real task -----------------------------------------------------------------------


def test_run_record_reads_names_calls_and_input_files_and_no_content(db, settings, tmp_path):
    settings.ACTHELM_MEDIA_ROOT = str(tmp_path)
    task = TaskFactory(instruction="Write report.md", limit_artifact_bytes=5000)
    folder = artifacts_dir(task.pk)
    (folder / "report.md").write_text("é" * 3000)  # 2 bytes a character
    (folder / "blob.bin").write_bytes(b"\xff\xfe\x00")
    ArtifactFactory(task=task, name="report.md", path=str(folder / "report.md"), size=6000)
    ArtifactFactory(task=task, name="blob.bin", path=str(folder / "blob.bin"), size=3)
    ToolCallFactory(
        task=task, turn__task=task, run__task=task, tool="read_file", status="succeeded"
    )
    add_input_file(task.pk, name="notes.txt", data="hello")
    rec = run_record(task, "the answer")
    assert rec.artifacts == {
        "blob.bin": ArtifactFile(str(folder / "blob.bin"), 3),
        "report.md": ArtifactFile(str(folder / "report.md"), 6000),
    }
    assert rec.artifacts_complete and rec.read_limit == 5000  # the task's artifact limit
    assert rec.preview("report.md", 10) == "é" * 10  # for people and the model supervisor
    assert rec.preview("blob.bin", 10) is None
    assert [(c.tool, c.status) for c in rec.calls] == [("read_file", "succeeded")]
    assert rec.input_files == ("notes.txt",)
    assert rec.answer == "the answer" and rec.tools == tuple(task.tools)
    # Larger than the 5,000 bytes a check reads of it: not checked, not passed.
    over = one("artifact_not_contains=report.md:secret", rec)
    assert over.unverified and not over.passed and not over.failed
    assert "report.md is larger than the 5,000 bytes a check reads" in over.detail
    assert one("artifact_contains=report.md:ééé", rec).passed  # found in what was read
    assert one("artifact_not_contains=blob.bin:x", rec).failed  # not readable text


def test_task_create_stores_checks_and_refuses_bad_ones_naming_the_field(db):
    task = task_create(
        actor=Actor.system("test"),
        title="t",
        instruction="Write summary.md",
        tools=["update_plan", "write_artifact"],
        acceptance_checks=["artifact=summary.md", {"kind": "answer_not_echo"}],
    )
    task.refresh_from_db()
    assert task.acceptance_checks == [
        {"kind": "artifact", "value": "summary.md"},
        {"kind": "answer_not_echo", "value": ""},
    ]
    with pytest.raises(InvalidInput) as exc:
        task_create(
            actor=Actor.system("test"),
            title="t",
            instruction="x",
            acceptance_checks=["answer_matches=(?<=x)y"],
        )
    assert exc.value.field == "acceptance_checks"


# --- A check that could not see everything does not pass (issue 32) ------------------------------


def _artifact(task, name: str, data: bytes):
    path = artifacts_dir(task.pk) / name
    path.write_bytes(data)
    return ArtifactFactory(task=task, name=name, path=str(path), size=len(data))


def _verdict(task, checks: list[str], answer: str = "The files are written."):
    Task.objects.filter(pk=task.pk).update(acceptance_checks=validate_checks(checks))
    task.refresh_from_db()
    return supervise(task, answer, usage=Usage(), open_operations=False)


def test_a_forbidden_word_past_the_old_256_kib_prefix_is_seen(db):
    task = TaskFactory(instruction="Write the report.", tools=[])
    data = b"harmless text, line after line.\n" * 8532  # 273,024 bytes
    data += b"secret " + b"x" * 100
    assert data.index(b"secret") == 273_024 and len(data) > 256 * 1024
    _artifact(task, "report.md", data)
    verdict = _verdict(task, ["artifact_not_contains=report.md:SECRET"])
    assert not verdict.approved
    assert "acceptance check artifact_not_contains=report.md:SECRET failed" in verdict.reason
    assert verdict.reason.endswith("failed: report.md: contains the text")


def test_no_artifact_sees_every_name_not_the_first_200(db):
    task = TaskFactory(instruction="Write the notes.", tools=[])
    ArtifactFactory.create_batch(200, task=task, name=factory.Sequence(lambda n: f"a{n:03}.txt"))
    ArtifactFactory(task=task, name="evil.sh")  # sorts after all of them
    verdict = _verdict(task, ["no_artifact=*.sh"])
    assert not verdict.approved
    assert verdict.reason == "acceptance check no_artifact=*.sh failed: present: evil.sh"


def test_an_artifact_larger_than_a_check_reads_leaves_the_run_unverified(db):
    task = TaskFactory(
        instruction="Write the dump.", tools=[], limit_artifact_bytes=MAX_CHECK_READ_BYTES * 2
    )
    _artifact(task, "dump.txt", b"x" * (MAX_CHECK_READ_BYTES + 1))
    verdict = _verdict(task, ["artifact_not_contains=dump.txt:secret", "artifact=dump.txt"])
    assert verdict.approved and verdict.unverified  # to review, marked: neither passed nor failed
    assert verdict.reason.startswith(
        "unverified: acceptance check artifact_not_contains=dump.txt:secret could not be "
        "checked: not checked: dump.txt is larger than the 8,388,608 bytes a check reads"
    )
    results = {c["check"]: c for c in verdict.checks_as_dicts}
    assert results["artifact_not_contains=dump.txt:secret"] | {"detail": ""} == {
        "check": "artifact_not_contains=dump.txt:secret",
        "passed": False,
        "unverified": True,
        "detail": "",
        "default": False,
    }
    assert results["artifact=dump.txt"]["passed"] and not results["artifact=dump.txt"]["unverified"]
    # A failure seen in what was read is a failure all the same.
    (artifacts_dir(task.pk) / "dump.txt").write_bytes(b"a secret\n" + b"x" * MAX_CHECK_READ_BYTES)
    assert not _verdict(task, ["artifact_not_contains=dump.txt:secret"]).approved


def test_a_pattern_set_past_the_work_budget_is_unverified_never_passed(db):
    task = TaskFactory(instruction="Write the data.", tools=[])
    _artifact(task, "data.txt", b"x" * (2**20 - 1) + b"Q")  # 1 MiB, the default artifact limit
    # Each pattern matches (at the end) and RE2 answers at once, but each may cost 1 MiB × its
    # program of ~1,000 instructions: eight fit in the verdict's budget, not ten.
    checks = [f"artifact_matches=data.txt:x{{{1000 - i}}}Q" for i in range(10)]
    verdict = _verdict(task, checks)
    assert verdict.approved and verdict.unverified
    results = verdict.checks
    assert [c.passed for c in results[:8]] == [True] * 8
    assert [c.unverified for c in results[8:10]] == [True, True]
    assert "the checks' work budget (8,589,934,592 units" in results[8].detail
    assert "acceptance check artifact_matches=data.txt:x{992}Q could not be checked" in (
        verdict.reason
    )
    # One pattern alone too costly for the budget is not run at all.
    costly = "artifact_matches=data.txt:(?:a.{999}|b.{999}|c.{999}|d.{999}|f.{999}|g.{999})e"
    (result,) = run_checks(validate_checks([costly]), run_record(task, "x"))
    assert result.unverified and "cannot pay for searching data.txt" in result.detail
    # And the time budget: measured between chunks and patterns.
    spent = Budget(seconds=0)
    (late,) = evaluate(
        validate_checks(["answer_contains=x"]), record(), defaults=False, budget=spent
    )
    assert late.unverified and "time budget" in late.detail
    assert evaluate(validate_checks(["answer_contains=x"]), record(answer="x"), defaults=False)[
        0
    ].passed


def test_run_record_lists_artifacts_and_calls_in_the_orms_order(db):
    """One statement reads both (artifacts by name, calls as they were made): the same lists,
    in the same order, as the ORM's two queries."""
    task = TaskFactory()
    for name in ("b.txt", "A.txt", "a.txt", "Ä.md", "_x"):
        ArtifactFactory(task=task, name=name, size=len(name))
    run = AgentRunFactory(task=task)
    first, second = TurnFactory(run=run, index=1), TurnFactory(run=run, index=0)
    for turn, position, tool, runs in [(first, 1, "z", 2), (first, 0, "y", 0), (second, 2, "x", 1)]:
        ToolCallFactory(turn=turn, position=position, tool=tool, run_count=runs)
    rec = run_record(task, "x")
    by_orm = Artifact.objects.filter(task=task).order_by("name")
    assert list(rec.artifacts) == [a.name for a in by_orm]
    assert [f.size for f in rec.artifacts.values()] == [a.size for a in by_orm]
    calls = ToolCall.objects.filter(task=task).order_by("turn__index", "position")
    assert [c.tool for c in rec.calls] == [c.tool for c in calls] == ["x", "y", "z"]
    assert [c.run_count for c in rec.calls] == [c.run_count for c in calls]


def test_text_checks_stream_across_chunks_as_one_text(db):
    task = TaskFactory(instruction="Write it.", tools=[])
    # The phrase straddles a chunk boundary, a whitespace run and a two-byte character across it.
    head = b"y" * (READ_CHUNK - 7) + b"Forbid \n"  # the boundary inside the whitespace run
    _artifact(task, "a.txt", head + "  \t Wörd é".encode() + b" tail" * 10)
    rec = run_record(task, "x")
    assert one("artifact_contains=a.txt:forbid wÖrd É", rec).passed
    assert one("artifact_not_contains=a.txt:FORBID WÖRD", rec).failed
    assert one("artifact_not_contains=a.txt:forbidwörd", rec).passed
    assert one("artifact_matches=a.txt:forbid\\s+wörd é( tail){10}\\z", rec).passed
    _artifact(task, "c.txt", b"y" * (READ_CHUNK - 1) + "éclair".encode())  # é across it
    assert one("artifact_contains=c.txt:yÉclair", run_record(task, "x")).passed
    # A pattern is not decided on a prefix: \A[^<]*\z holds of the first chunk, not of the file.
    _artifact(task, "b.txt", b"z" * READ_CHUNK + b"<script>")
    assert one("artifact_matches=b.txt:\\A[^<]*\\z", run_record(task, "x")).failed


def test_more_artifacts_than_a_verdict_lists_leave_negative_checks_unverified(db, monkeypatch):
    monkeypatch.setattr(evidence, "MAX_ARTIFACT_NAMES", 3)  # what the record lists
    monkeypatch.setattr(checking, "MAX_ARTIFACT_NAMES", 3)  # what the checks say of it
    task = TaskFactory(instruction="Write it.", tools=[])
    for name in ("a.txt", "b.txt", "c.txt", "d.sh"):
        _artifact(task, name, b"fine")
    rec = run_record(task, "x")
    assert sorted(rec.artifacts) == ["a.txt", "b.txt", "c.txt"] and not rec.artifacts_complete
    assert one("artifact=a.txt", rec).passed  # a positive found is found
    assert one("no_artifact=*.txt", rec).failed  # so is a negative that sees a culprit
    for check in (
        "no_artifact=*.sh",
        "only_artifacts=*.txt",
        "artifact=*.sh",
        "artifact_not_contains=*:secret",
        "artifact_contains=*.txt:fine",
    ):
        result = one(check, rec)
        assert result.unverified, check
        assert "more than the 3 artifacts a verdict lists" in result.detail
