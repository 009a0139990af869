"""The supervisor through the real worker and a scripted model on loopback: acceptance checks
first (a failed one rejects, naming it, and the next attempt gets the reason as feedback), then
the rules (every cumulative limit, money included), then the optional model, which sees the
artifacts and the tool outcomes; a model supervisor that cannot be asked leaves the run
*unverified* in review, never "approved"."""

import random
import threading
from decimal import Decimal

import pytest
from django.db import connection

from agents.actions.decisions import approval_deny
from agents.engine.run.usage import Usage
from agents.engine.verdict import checking, supervisor
from agents.engine.verdict.acceptance import parse_check, validate_checks
from agents.engine.verdict.supervisor import INLINE_CHECK_CHARS, rule_checks, supervise
from agents.models import AgentRun
from agents.states import RunStatus, Verdict
from approvals.models import Approval
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tasks.workspace import add_input_file
from tests.agents.conftest import run_burst
from tests.factories import ArtifactFactory, TaskFactory
from tests.fakes.model_server import reply_error, reply_text, reply_tool_calls

pytestmark = pytest.mark.django_db(transaction=True)

PLAN = ("update_plan", {"steps": [{"step": "Read"}, {"step": "Write"}]})
READ = ("read_file", {"path": "notes.txt"})


def write(name: str, content: str = "The launch is on April 16.\n"):
    return reply_tool_calls([("write_artifact", {"name": name, "content": content})])


def newest_run(task) -> AgentRun:
    return AgentRun.objects.filter(task=task).order_by("-number").first()


def test_a_failed_acceptance_check_rejects_naming_it_and_the_retry_gets_it_as_feedback(
    model_server, http_model, loop_task, fast_worker_settings
):
    server = model_server(
        [
            reply_tool_calls([PLAN]),
            reply_tool_calls([READ]),
            write("report.md"),
            reply_text("The report is written."),
            # The second attempt, after the feedback: the file it was asked for.
            write("summary.md"),
            reply_text("summary.md is written."),
        ]
    )
    task = loop_task(
        http_model(server),
        instruction="Read notes.txt and write the launch date to summary.md.",
        acceptance_checks=["artifact=summary.md", "artifact_contains=summary.md:April 16"],
    )
    add_input_file(task.pk, name="notes.txt", data="Launch: April 16")
    run_burst()
    task.refresh_from_db()
    first = newest_run(task)
    assert task.status == TaskStatus.READY and task.failed_attempts == 1
    assert first.verdict == Verdict.REJECTED and first.error_code == "supervisor_rejected"
    assert "acceptance check artifact=summary.md failed" in first.verdict_reason
    assert "report.md" in first.verdict_reason  # what it saw
    assert task.feedback == first.verdict_reason
    rejected = TaskEvent.objects.get(task=task, kind=EventKind.REJECTED)
    assert {c["check"]: c["passed"] for c in rejected.data["checks"]}[
        "artifact=summary.md"
    ] is False

    Task.objects.filter(pk=task.pk).update(not_before=None)  # the back-off passes
    run_burst()
    task.refresh_from_db()
    assert task.status == TaskStatus.REVIEW
    second = newest_run(task)
    assert second.verdict == Verdict.APPROVED
    assert second.verdict_reason.startswith("approved: 2 acceptance checks, 4 default checks")
    feedback = [
        m["content"]
        for m in server.completion_requests[4].json["messages"]
        if m["role"] == "user" and "Feedback on your previous attempt" in (m["content"] or "")
    ]
    assert feedback and "artifact=summary.md failed" in feedback[0]


def test_the_default_check_catches_a_named_file_that_was_never_written(
    model_server, http_model, loop_task, fast_worker_settings
):
    server = model_server(
        [reply_tool_calls([PLAN]), write("report.md"), reply_text("Done: the report.")]
    )
    task = loop_task(http_model(server), instruction="Write the launch date to summary.md.")
    run_burst()
    run = newest_run(task)
    assert run.verdict == Verdict.REJECTED
    assert run.verdict_reason.startswith("default check named_output=summary.md failed")


def test_a_denied_write_does_not_let_an_answer_claim_the_file_through_a_worker_process(
    model_server, http_model, loop_task, spawn_worker, actor
):
    """Issue 49, item 3: a person denied `write_artifact summary.md`, the model answered "I
    wrote summary.md" — a real worker process, the real decision service: the run is rejected by
    named_output, the task does not reach review."""
    server = model_server(
        [
            reply_tool_calls([PLAN]),
            write("summary.md"),
            reply_text("I wrote summary.md with the launch date."),
        ]
    )
    task = loop_task(
        http_model(server),
        instruction="Write the launch date to summary.md.",
        tools=["update_plan", "write_artifact"],
        tool_policies={"write_artifact": "ask"},
    )
    assert spawn_worker("--burst", worker_id="asks").wait() == 0
    task.refresh_from_db()
    assert task.status == TaskStatus.AWAITING_APPROVAL
    approval = Approval.objects.get(task=task)
    assert approval.target == "summary.md"
    approval_deny(
        actor=actor,
        approval_id=approval.pk,
        arguments_hash=approval.arguments_hash,
        message="Not now: answer inline.",
    )
    assert spawn_worker("--burst", worker_id="answers").wait() == 0
    task.refresh_from_db()
    run = newest_run(task)
    assert run.answer == "I wrote summary.md with the launch date."
    assert task.status != TaskStatus.REVIEW and task.status == TaskStatus.READY
    assert (run.status, run.verdict) == (RunStatus.FAILED, Verdict.REJECTED)
    assert run.verdict_reason.startswith("default check named_output=summary.md failed")
    assert "the answer names summary.md, which the run never wrote" in run.verdict_reason
    rejected = TaskEvent.objects.get(task=task, kind=EventKind.REJECTED)
    assert {c["check"]: c["passed"] for c in rejected.data["checks"]}[
        "named_output=summary.md"
    ] is False
    assert not TaskEvent.objects.filter(task=task, kind=EventKind.SUBMITTED).exists()


def test_default_checks_can_be_turned_off(
    model_server, http_model, loop_task, fast_worker_settings, settings
):
    settings.ACTHELM_SUPERVISOR_DEFAULT_CHECKS = False
    server = model_server([reply_tool_calls([PLAN]), write("report.md"), reply_text("Done.")])
    task = loop_task(http_model(server), instruction="Write the launch date to summary.md.")
    run_burst()
    assert newest_run(task).verdict == Verdict.APPROVED
    assert "default check" not in newest_run(task).verdict_reason


def test_a_task_that_made_no_call_is_judged_without_reading_calls_or_artifacts(db):
    """The worker says so when the task has made no tool call (`AgentLoop.no_calls`): the
    verdict is the one the read would give (no call, so no artifact), with one statement less."""
    task = TaskFactory(instruction="Write the launch date to summary.md.")
    seen: list[str] = []

    def record(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        read = supervise(task, "Done: the summary.")
    read_sql, seen[:] = list(seen), []
    with connection.execute_wrapper(record):
        skipped = supervise(task, "Done: the summary.", no_calls=True)
    assert skipped == read
    assert [c.check for c in skipped.checks] == [c.check for c in read.checks]
    assert any("agents_artifact" in sql for sql in read_sql)
    assert not any("agents_artifact" in sql for sql in seen)


def test_every_cumulative_limit_is_a_rule_money_included(db):
    task = TaskFactory(limit_cost=Decimal("0.50"), limit_turns=5, limit_mcp_calls=2)
    fine = Usage(model_turns=5, output_tokens=10, cost=Decimal("0.50"))
    assert rule_checks(task, "an answer", usage=fine, open_operations=False) == []
    over = Usage(model_turns=6, output_tokens=10, mcp_calls=3, cost=Decimal("0.51"))
    problems = rule_checks(task, "an answer", usage=over, open_operations=False)
    assert [p.split(" (")[0] for p in problems] == [
        "the run exceeded its limit limit_turns",
        "the run exceeded its limit limit_mcp_calls",
        "the run exceeded its limit limit_cost",
    ]
    no_budget = TaskFactory(limit_cost=None)
    assert rule_checks(no_budget, "x", usage=over, open_operations=False)[-1:] != [
        "the run exceeded its limit limit_cost"
    ]


def test_a_model_supervisor_that_cannot_be_asked_leaves_the_run_unverified_in_review(
    model_server, http_model, loop_task, fast_worker_settings, settings
):
    supervisor = model_server([reply_error(503)] * 6)
    http_model(supervisor, name="supervisor")
    settings.ACTHELM_SUPERVISOR_CONNECTION = "supervisor"
    worker_server = model_server([reply_tool_calls([PLAN]), reply_text("The answer is 42.")])
    task = loop_task(http_model(worker_server), instruction="What is 17 + 25?")
    run_burst()
    task.refresh_from_db()
    run = newest_run(task)
    assert task.status == TaskStatus.REVIEW
    assert run.verdict == Verdict.UNVERIFIED
    assert run.verdict_reason.startswith("unverified:")
    assert "could not be asked" in run.verdict_reason
    submitted = TaskEvent.objects.get(task=task, kind=EventKind.SUBMITTED)
    assert submitted.data["verdict"] == Verdict.UNVERIFIED


def test_no_tested_supervisor_model_is_unverified_too(db, settings):
    settings.ACTHELM_SUPERVISOR_CONNECTION = "nowhere"
    task = TaskFactory(instruction="What is 17 + 25?", tools=[])
    verdict = supervise(task, "42", usage=Usage(), open_operations=False)
    assert verdict.approved and verdict.unverified
    assert "no tested model" in verdict.reason


def test_the_model_supervisor_sees_the_artifacts_and_the_tool_outcomes(
    model_server, http_model, loop_task, fast_worker_settings, settings
):
    supervisor = model_server([reply_text("REJECTED: the report misses the owner")])
    http_model(supervisor, name="supervisor")
    settings.ACTHELM_SUPERVISOR_CONNECTION = "supervisor"
    server = model_server(
        [
            reply_tool_calls([PLAN]),
            reply_tool_calls([READ]),
            write("report.md", "SECRET-MARKER launch April 16"),
            reply_text("report.md is written."),
        ]
    )
    task = loop_task(http_model(server), instruction="Read notes.txt and write report.md.")
    add_input_file(task.pk, name="notes.txt", data="Launch: April 16, owner Bo")
    run_burst()
    prompt = supervisor.completion_requests[0].json["messages"][0]["content"]
    assert "SECRET-MARKER launch April 16" in prompt  # the artifact's text
    assert "- read_file: succeeded" in prompt and "- write_artifact: succeeded" in prompt
    run = newest_run(task)
    assert run.verdict == Verdict.REJECTED
    assert run.verdict_reason.endswith("the report misses the owner")


def test_a_check_sees_the_whole_artifact_and_one_it_cannot_pay_for_goes_to_review_unverified(
    model_server, http_model, loop_task, fast_worker_settings
):
    # The forbidden word at byte 273,031 of a 273 KB file: past the 256 KiB once read.
    report = "harmless line of the report.\n" * 9414 + "y" * 24 + " SECRET"
    assert report.index("SECRET") == 273_031 and len(report) < 1_048_576
    costly = "(?:a.{999}|b.{999}|c.{999}|d.{999}|f.{999}|g.{999})e"  # ~48,000 instructions
    server = model_server(
        [
            reply_tool_calls([PLAN]),
            write("report.md", report),
            reply_text("The report is written."),
        ]
        * 2
    )
    model = http_model(server)
    leaked = loop_task(
        model,
        instruction="Write the report.",
        acceptance_checks=["artifact_not_contains=report.md:secret"],
    )
    run_burst()
    run = newest_run(leaked)
    assert run.verdict == Verdict.REJECTED
    assert run.verdict_reason == (
        "acceptance check artifact_not_contains=report.md:secret failed: report.md: contains "
        "the text"
    )
    # 273 KB × 48,000 instructions is past the verdict's budget: not searched, not passed, and
    # not a failure to retry either.
    unchecked = loop_task(
        model,
        instruction="Write the report.",
        acceptance_checks=[f"artifact_matches=report.md:{costly}"],
    )
    run_burst()
    unchecked.refresh_from_db()
    run = newest_run(unchecked)
    assert unchecked.status == TaskStatus.REVIEW and unchecked.failed_attempts == 0
    assert run.verdict == Verdict.UNVERIFIED
    assert run.verdict_reason.startswith(
        f"unverified: acceptance check artifact_matches=report.md:{costly} could not be checked: "
        "not checked: report.md: the checks' work budget"
    )
    submitted = TaskEvent.objects.get(task=unchecked, kind=EventKind.SUBMITTED)
    assert submitted.data["verdict"] == Verdict.UNVERIFIED
    (own,) = [c for c in submitted.data["checks"] if not c["default"]]
    assert own["unverified"] is True and own["passed"] is False


def test_a_model_supervisor_slower_than_the_budget_leaves_the_run_unverified_in_review(
    model_server, http_model, loop_task, fast_worker_settings, settings
):
    supervisor = model_server([reply_text("APPROVED", delay=30)])
    http_model(supervisor, name="supervisor", timeout=60)
    settings.ACTHELM_SUPERVISOR_CONNECTION = "supervisor"
    settings.ACTHELM_SUPERVISOR_TIMEOUT_SECONDS = 1.5
    worker_server = model_server([reply_text("The answer is 42.")])
    task = loop_task(http_model(worker_server), instruction="What is 17 + 25?")
    run_burst()
    task.refresh_from_db()
    run = newest_run(task)
    assert task.status == TaskStatus.REVIEW
    assert run.verdict == Verdict.UNVERIFIED
    assert "the supervisor ran out of its 1.5 s budget" in run.verdict_reason
    # The request was given up (its connection closed), not left to answer in 30 s.
    assert supervisor.wait_aborted(5)
    assert AgentRun.objects.filter(task=task).count() == 1


def test_acceptance_checks_that_outlast_the_budget_are_abandoned_unverified(db, tmp_path):
    """RE2 is linear but not fast: these patterns take seconds on a 256 KiB artifact (and cannot
    be interrupted). The verdict does not wait for them past its budget."""
    rng = random.Random(1)
    text = "".join(rng.choice("ab") for _ in range(256 * 1024))
    big = tmp_path / "big.txt"
    big.write_text(text)
    slow = [f"artifact_matches=big.txt:(?:.{{1,100}}{c}){{8}}c" for c in "ab"]
    task = TaskFactory(
        instruction="Describe big.txt.",
        tools=[],
        acceptance_checks=validate_checks([parse_check(c) for c in slow]),
    )
    ArtifactFactory(task=task, name="big.txt", path=str(big), size=len(text))
    verdict = supervise(task, "It is long.", usage=Usage(), open_operations=False, budget=0.3)
    assert verdict.approved and verdict.unverified
    assert verdict.reason == (
        "unverified: the supervisor ran out of its 0.3 s budget while it evaluated the "
        "acceptance checks"
    )


def test_an_artifact_over_the_limit_rejects_from_the_record_or_from_the_database(db):
    task = TaskFactory(limit_artifact_bytes=100)
    ArtifactFactory(task=task, name="small.md", size=100)
    assert rule_checks(task, "done", usage=Usage(), open_operations=False) == []
    assert supervise(task, "done", usage=Usage(), open_operations=False).approved
    ArtifactFactory(task=task, name="big.md", size=101)
    problem = "an artifact is larger than limit_artifact_bytes (100)"
    assert rule_checks(task, "done", usage=Usage(), open_operations=False) == [problem]
    assert rule_checks(task, "done", artifact_sizes=[100, 101], open_operations=False) == [problem]
    verdict = supervise(task, "done", usage=Usage(), open_operations=False)
    assert not verdict.approved and problem in verdict.reason


@pytest.mark.parametrize(
    ("answer", "own_check", "artifact", "inline"),
    [
        ("Done.", False, False, True),  # the default checks over a few bytes: in this thread
        ("x" * (INLINE_CHECK_CHARS + 1), False, False, False),  # an answer too long to be quick
        ("Done.", True, False, False),  # a pattern of the task's own may take its time
        ("Done.", False, True, False),  # an artifact's content may be read
    ],
)
def test_only_a_verdict_that_can_only_be_quick_runs_in_the_runs_thread(
    db, monkeypatch, answer, own_check, artifact, inline
):
    """A quick verdict keeps the run's thread (and its connection, for the outcome that follows);
    anything that may take longer runs in a thread of its own, with no connection held."""
    checks = [parse_check("answer_contains=done")] if own_check else []
    task = TaskFactory(instruction="Say done.", acceptance_checks=validate_checks(checks))
    if artifact:
        ArtifactFactory(task=task, name="notes.md", size=5)
    seen = []
    real = checking.evaluate

    def evaluate(*args, **kwargs):
        seen.append(threading.current_thread())
        return real(*args, **kwargs)

    monkeypatch.setattr(supervisor, "evaluate", evaluate)
    released = []
    monkeypatch.setattr(supervisor, "release_connection", lambda: released.append(True))
    verdict = supervise(task, answer, usage=Usage(), open_operations=False)
    assert verdict.approved
    assert (seen == [threading.current_thread()]) is inline and len(seen) == 1
    assert released == ([] if inline else [True])
