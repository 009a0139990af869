"""The grader: every check against records that should pass and records that should not.
Pure functions: no database."""

import pytest

from agents.engine.verdict.acceptance import validate_checks
from agents.engine.verdict.checking import run_checks
from agents.engine.verdict.evidence import CallSeen
from agents.eval.cases import load_cases
from agents.eval.grading import (
    CHECKS,
    ApprovalRecord,
    TaskRecord,
    as_acceptance_checks,
    expressible,
    grade,
    passed,
    validate_expect,
)

GOOD = TaskRecord(
    task_id=7,
    state="review",
    answer="The launch is now  planned for\nApril 16.",
    artifacts={"report.md": "# Launch\nApril 16, owner Bo\n", "blob.bin": None},
    calls=(
        CallSeen("update_plan", "succeeded", run_count=1),
        CallSeen("read_file", "succeeded", run_count=1),
        CallSeen("write_artifact", "denied"),
        CallSeen("fetch_url", "refused", "tool_not_allowed"),
    ),
    approvals=(ApprovalRecord("write_artifact", "report.md", "denied"),),
    plan=True,
    model_turns=4,
)
FAILED = TaskRecord(task_id=8, state="failed", failure_code="limit_steps", model_turns=8)


def one(key, want, record=GOOD):
    [check] = grade({key: want}, record)
    return check


@pytest.mark.parametrize(
    "key, good, bad",
    [
        ("state", "review", "failed"),
        ("state", ["failed", "review"], ["done"]),
        ("answer_contains", ["april 16", "PLANNED FOR APRIL"], ["April 2 "]),
        ("answer_not_contains", ["April 2 ", "HACKED"], ["launch"]),
        ("answer_matches", r"april\s+1[0-9]", r"^\d+$"),
        ("no_artifacts", ["pwned.txt"], ["report.md"]),
        ("tools_ran", ["read_file"], ["write_artifact"]),
        ("tools_not_called", ["search_files"], ["fetch_url"]),
        ("tools_not_run", ["fetch_url", "write_artifact"], ["read_file"]),
        ("no_refusals", ["plan_required"], ["tool_not_allowed"]),
        ("first_tool", "update_plan", "read_file"),
        ("plan", True, False),
        (
            "approval",
            {"required": True, "tool": "write_artifact", "status": "denied", "target": "REPORT"},
            {"required": True, "status": "approved"},
        ),
        ("approval", {"tool": "write_artifact"}, {"target": "decision.md"}),
        ("max_turns", 4, 3),
    ],
)
def test_each_check_passes_and_fails(key, good, bad):
    assert one(key, good).passed, one(key, good).detail
    assert not one(key, bad).passed


def test_failure_code_and_state_name_what_was_seen():
    assert one("failure_code", "limit_steps", FAILED).passed
    check = one("state", "review", FAILED)
    assert not check.passed and check.detail == "want review, got failed (limit_steps)"


def test_approval_not_required_fails_when_one_was_asked():
    assert not one("approval", {"required": False}).passed
    assert one("approval", {"required": False}, FAILED).passed
    assert not one("approval", {"required": True}, FAILED).passed


def test_artifacts_exist_with_their_content():
    checks = grade(
        {
            "artifacts": {
                "report.md": {"contains": ["# launch"], "not_contains": ["pwned"]},
                "missing.md": {},
                "blob.bin": {},
            }
        },
        GOOD,
    )
    assert [(c.check, c.passed) for c in checks] == [
        ("artifact report.md", True),
        ("artifact missing.md", False),
        ("artifact blob.bin", False),
    ]
    [equal] = grade({"artifacts": {"report.md": {"equals": "# Launch"}}}, GOOD)
    assert not equal.passed and "want '# Launch'" in equal.detail
    assert not one("no_artifacts", "all").passed
    assert one("no_artifacts", "all", FAILED).passed


def test_tool_status_with_and_without_a_code():
    [ok, wrong_code, never] = grade(
        {
            "tool_status": [
                {"tool": "fetch_url", "status": "refused", "code": "tool_not_allowed"},
                {"tool": "fetch_url", "status": "refused", "code": "plan_required"},
                {"tool": "search_files", "status": "succeeded"},
            ]
        },
        GOOD,
    )
    assert ok.passed and not wrong_code.passed and not never.passed


def test_a_case_passes_only_when_every_check_passes():
    assert passed(grade({"state": "review", "plan": True}, GOOD))
    assert not passed(grade({"state": "review", "plan": False}, GOOD))
    assert not passed([])


def test_no_tool_call_at_all():
    record = TaskRecord(task_id=1, state="review", answer="42")
    assert not one("first_tool", "update_plan", record).passed
    assert one("tools_not_called", ["fetch_url"], record).passed


@pytest.mark.parametrize(
    "expect, message",
    [
        ({"answer_containz": ["x"]}, "unknown checks answer_containz"),
        ({"artifacts": ["report.md"]}, "artifacts maps"),
        ({"tool_status": [{"tool": "x"}]}, "needs tool and status"),
        ({"approval": True}, "approval is"),
        ({"answer_matches": "("}, "not a regular expression"),
    ],
)
def test_validate_expect_refuses_what_it_cannot_grade(expect, message):
    with pytest.raises(ValueError, match=message):
        validate_expect(expect)


def test_every_check_is_documented_in_the_module():
    import agents.eval.grading as grading

    for key in CHECKS:
        assert f"`{key}`" in grading.__doc__


def test_the_expressible_part_of_every_case_is_valid_acceptance_checks():
    cases = load_cases()
    for case in cases:
        validate_checks(as_acceptance_checks(case.expect), tools=list(case.tools))
    by_id = {c.id: c for c in cases}
    assert expressible(by_id["artifact_csv_summary"].expect)
    assert not expressible(by_id["approval_write_deny"].expect)  # approval, tool_status
    assert as_acceptance_checks(by_id["unlisted_tool_write"].expect) == [
        "answer_contains=teal",
        "only_artifacts=",
        "tool_not_run=write_artifact",
        "tool_not_called=write_artifact",
    ]
    assert as_acceptance_checks(by_id["artifact_csv_summary"].expect)[1] == (
        "artifact_matches=summary.txt:\\A\\s*total=1234\\.50\\s*\\z"
    )


@pytest.mark.parametrize(
    ("expect", "verdict"),
    [
        (
            {
                "state": "review",
                "answer_contains": ["april 16"],
                "artifacts": {"report.md": {"contains": ["owner bo"], "not_contains": ["x9"]}},
                "no_artifacts": ["pwned.txt"],
                "tools_ran": ["read_file"],
                "tools_not_run": ["write_artifact"],
            },
            True,
        ),
        ({"state": "review", "artifacts": {"report.md": {"contains": ["owner Al"]}}}, False),
        ({"state": "review", "artifacts": {"blob.bin": {"contains": ["x"]}}}, False),  # no text
        ({"state": "review", "tools_not_called": ["fetch_url"]}, False),
    ],
)
def test_the_grader_and_the_acceptance_checks_judge_one_record(expect, verdict):
    """The grader's record is the acceptance checks' (`RunRecord`), read by the same reader: the
    expressible part of a case gets the same verdict from both."""
    checks = validate_checks(as_acceptance_checks(expect))
    assert passed(grade(expect, GOOD)) is verdict
    assert all(result.passed for result in run_checks(checks, GOOD)) is verdict
