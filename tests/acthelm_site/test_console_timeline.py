"""The timeline's details are written for a person: a line per fact, never the raw JSON."""

from types import SimpleNamespace

import pytest

from console.timeline import VALUE_CHARS, event_details
from tasks.states import EventKind


def event(kind, data):
    return SimpleNamespace(kind=kind, data=data)


@pytest.mark.parametrize(
    ("kind", "data", "lines"),
    [
        (
            EventKind.CANCELLED,
            {"reason": "wrong goal", "runs_cancelled": 1},
            ["Reason: wrong goal", "1 running attempt ended"],
        ),
        (EventKind.CANCELLED, {"reason": "", "runs_cancelled": 0}, []),
        (
            EventKind.LIMITS_CHANGED,
            {"before": {"limit_turns": 10}, "after": {"limit_turns": 40}},
            ["limit_turns: 10 → 40"],
        ),
        (EventKind.RETRIED, {"previous_failure": "limit_steps"}, ["After: limit_steps"]),
        (
            EventKind.RESUMED,
            {"model_id": 3, "model": "alpha/m", "check": {"ok": True}},
            ["On alpha/m"],
        ),
        (EventKind.REOPENED, {"feedback": "Cite the notes."}, ["Feedback: Cite the notes."]),
        (
            EventKind.TOOL_RESULT,
            {"tool": "fetch_url", "tool_call_id": 9, "ok": False, "error": "fetch_blocked"},
            ["fetch_url failed (fetch_blocked)"],
        ),
        (
            EventKind.FAILED,
            {"code": "limit_steps", "message": "24 turns"},
            ["limit_steps: 24 turns"],
        ),
        # A failed attempt, numbered as ACTHELM_MAX_ATTEMPTS counts them (the first run is 1).
        (
            EventKind.RETRY_SCHEDULED,
            {"attempt": 1, "of": 3, "delay_seconds": 60, "code": "provider_error", "message": "5"},
            ["Attempt 1 of 3 failed; attempt 2 runs in 60 s", "provider_error: 5"],
        ),
        (
            EventKind.RETRY_SCHEDULED,
            {"attempt": 2, "delay_seconds": 0, "code": "provider_error", "message": ""},
            ["Attempt 2 failed; attempt 3 runs now", "provider_error"],
        ),
        # A move to another connection is no attempt.
        (
            EventKind.RETRY_SCHEDULED,
            {"fallback": "free-b/small", "from": "free-a", "code": "provider_auth"},
            ["provider_auth", "fallback: free-b/small", "from: free-a"],
        ),
        (
            EventKind.UNBLOCK_BLOCKED,
            {"dependency": 4, "dependency_status": "cancelled"},
            ["Task #4 is cancelled"],
        ),
        # Any other kind: one "key: value" line per field.
        (
            EventKind.CLAIMED,
            {"worker": "w-1", "run_id": 5, "attempt": 2},
            ["worker: w-1", "attempt: 2"],
        ),
        # A claim's fencing numbers are internals, not words for a person.
        (EventKind.CLAIMED, {"run_id": 9, "newest_run_id_before": 8, "claim_count": 3}, []),
        (
            EventKind.TOOL_RESULT,
            {"tool": "read_file", "ok": True, "error": None, "chars": 1200},
            ["read_file succeeded, 1,200 characters"],
        ),
        (
            EventKind.MODEL_TURN,
            {"turn": 4, "stop_reason": "tool_calls", "tool_calls": 2, "tokens": 1234},
            ["Turn 4: 2 tool calls, 1,234 tokens"],
        ),
        (
            EventKind.TOOL_RESULT,
            {"tool": "read_file", "ok": True, "usage": {"input_tokens": 5, "output_tokens": 2}},
            ["read_file succeeded", "usage: input tokens 5, output tokens 2"],
        ),
        (EventKind.CREATED, {}, []),
        # A verdict: what it said and which acceptance checks failed, not their raw list.
        (
            EventKind.REJECTED,
            {
                "reason": "acceptance check artifact=summary.md failed",
                "checks": [
                    {"check": "artifact=summary.md", "passed": False, "detail": "have: none"},
                    {"check": "answer_not_echo", "passed": True, "detail": "not an echo"},
                ],
            },
            [
                "Reason: acceptance check artifact=summary.md failed",
                "Checks: 1 of 2 passed; failed: artifact=summary.md",
            ],
        ),
        (
            EventKind.SUBMITTED,
            {"verdict": "unverified", "reason": "unverified: no model"},
            ["Verdict: unverified", "Reason: unverified: no model"],
        ),
        # A check that could not see everything is neither passed nor failed.
        (
            EventKind.SUBMITTED,
            {
                "verdict": "unverified",
                "checks": [
                    {"check": "no_artifact=*.sh", "passed": True, "unverified": False},
                    {"check": "artifact_not_contains=d.txt:x", "passed": False, "unverified": True},
                ],
            },
            [
                "Verdict: unverified",
                "Checks: 1 of 2 passed; unverified: artifact_not_contains=d.txt:x",
            ],
        ),
    ],
)
def test_each_kind_reads_as_sentences(kind, data, lines):
    assert event_details(event(kind, data)) == lines


def test_data_of_an_unexpected_shape_falls_back_to_fields():
    assert event_details(event(EventKind.LIMITS_CHANGED, {"after": [1, 2]})) == ["after: 1, 2"]
    assert event_details(event(EventKind.MODEL_TURN, ["not", "a dict"])) == ["not, a dict"]


def test_a_long_value_is_cut():
    (line,) = event_details(event(EventKind.PAUSED, {"note": "x" * 5000}))
    assert len(line) == len("note: ") + VALUE_CHARS and line.endswith("…")


@pytest.mark.django_db
def test_an_approval_request_and_its_move_are_one_row():
    """The run records the request (tool, target, why), then its move to awaiting_approval
    under the same kind: the timeline shows one row with both, the state in words."""
    from console.timeline import timeline_rows
    from tasks.states import TaskStatus
    from tests.factories import AgentRunFactory, TaskEventFactory, TaskFactory

    task = TaskFactory()
    run = AgentRunFactory(task=task)
    request = TaskEventFactory(
        task=task,
        run=run,
        kind=EventKind.APPROVAL_REQUESTED,
        data={"tool": "write_artifact", "target": "notes.md", "reason": "policy_ask"},
    )
    move = TaskEventFactory(
        task=task,
        run=run,
        kind=EventKind.APPROVAL_REQUESTED,
        from_status=TaskStatus.IN_PROGRESS,
        to_status=TaskStatus.AWAITING_APPROVAL,
        data={},
    )
    [row] = timeline_rows([request, move])
    assert row.pk == request.pk and row.state == "In progress → Awaiting approval"
    assert row.details == ["write_artifact", "target: notes.md", "reason: policy_ask"]
