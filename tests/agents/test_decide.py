"""The end of a run, decided with plain values: no database, no settings
(agents.engine.verdict.decide)."""

from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from agents.catalogue.providers import base as provider_base
from agents.catalogue.providers.base import ALL_CODES, HEALTH_CODES
from agents.engine.verdict.decide import (
    Facts,
    Fallback,
    Health,
    Judgement,
    OutcomeKind,
    Rules,
    decide,
)
from agents.states import FailureCode, RunStatus, Verdict
from tasks.states import EventKind, TaskStatus

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
RULES = Rules(
    max_attempts=3,
    retry_delays=(60, 300),
    cooldown_seconds=600,
    max_handbacks=5,
    max_requeues=1,
)


def facts(kind: OutcomeKind, **kw) -> Facts:
    return Facts(kind=kind, task_status=TaskStatus.IN_PROGRESS, rules=RULES, now=NOW, **kw)


def failed(code="provider_timeout", message="timed out after 30 s", **kw) -> Facts:
    return facts(OutcomeKind.FAILED, code=code, message=message, retryable=True, **kw)


def health(code=FailureCode.PROVIDER_RATE_LIMITED, **kw) -> Health:
    return Health(connection_id=7, connection_name="free-a", cooldown_until=None, **kw)


def test_the_providers_codes_are_the_failure_codes_provider_members():
    # The codes are written once, in FailureCode; the providers take a constant and an ALL_CODES
    # entry for each PROVIDER_* member. provider_cooling_down is the engine's own: the connection
    # rests, no request was made.
    members = {c for c in FailureCode if c.name.startswith("PROVIDER_")} - {
        FailureCode.PROVIDER_COOLING_DOWN
    }
    assert {c.value for c in members} == ALL_CODES
    assert {c.name: getattr(provider_base, c.name, None) for c in members} == {
        c.name: c.value for c in members
    }
    assert not any(FailureCode(code).is_final or FailureCode(code).is_limit for code in ALL_CODES)
    assert {FailureCode(c) for c in HEALTH_CODES} & FailureCode.not_attempts() == {
        FailureCode.PROVIDER_AUTH
    }


def test_an_unknown_code_is_an_attempt_like_any_other():
    assert FailureCode.known("something_new") is None
    plan = decide(failed(code="something_new"))
    assert plan.move.status == TaskStatus.READY
    assert plan.move.fields["failed_attempts"] == 1


def test_approved_goes_to_review_and_may_be_closed_by_policy():
    checks = ({"name": "tests", "passed": True},)
    plan = decide(
        facts(
            OutcomeKind.FINAL,
            answer="done",
            verdict=Judgement(approved=True, reason="fine", checks=checks),
        )
    )
    assert plan.run.status == RunStatus.SUCCEEDED
    assert plan.run.fields == {
        "verdict": Verdict.APPROVED,
        "verdict_reason": "fine",
        "answer": "done",
    }
    assert plan.move.status == TaskStatus.REVIEW and plan.move.kind == EventKind.SUBMITTED
    assert plan.move.data == {"verdict": Verdict.APPROVED, "reason": "fine", "checks": list(checks)}
    assert plan.move.fields == {"failure_code": "", "failure_message": ""}
    assert plan.auto_close and not plan.note_stuck and plan.events == ()


def test_unverified_approval_says_so():
    plan = decide(
        facts(OutcomeKind.FINAL, verdict=Judgement(approved=True, reason="r", unverified=True))
    )
    assert plan.run.fields["verdict"] == Verdict.UNVERIFIED
    assert "checks" not in plan.move.data


@pytest.mark.parametrize(("earlier", "delay"), [(0, 60), (1, 300)])
def test_rejected_retries_after_the_nth_delay_with_feedback(earlier, delay):
    plan = decide(
        facts(
            OutcomeKind.FINAL,
            failed_attempts=earlier,
            verdict=Judgement(approved=False, reason="missing tests"),
        )
    )
    assert plan.run.status == RunStatus.FAILED
    assert plan.run.fields["error_code"] == FailureCode.SUPERVISOR_REJECTED
    assert plan.run.fields["verdict"] == Verdict.REJECTED
    assert [e.kind for e in plan.events] == [EventKind.REJECTED]
    assert plan.events[0].data == {"reason": "missing tests"}
    assert plan.move.status == TaskStatus.READY and plan.move.kind == EventKind.RETRY_SCHEDULED
    assert plan.move.fields == {
        "failed_attempts": earlier + 1,
        "not_before": NOW + timedelta(seconds=delay),
        "feedback": "missing tests",
    }
    # Attempt n of 3 failed; attempt n+1 runs after the n-th delay.
    assert plan.move.data["attempt"] == earlier + 1 and plan.move.data["of"] == 3
    assert plan.move.data["delay_seconds"] == delay


def test_no_verdict_is_a_rejection():
    plan = decide(facts(OutcomeKind.FINAL))
    assert plan.run.fields["verdict_reason"] == "no verdict"
    assert plan.move.fields["feedback"] == "no verdict"


def test_the_last_delay_repeats_when_there_are_more_attempts_than_delays():
    rules = replace(RULES, max_attempts=6)
    plan = decide(replace(failed(failed_attempts=4), rules=rules))
    assert plan.move.fields["not_before"] == NOW + timedelta(seconds=300)


@pytest.mark.parametrize("max_attempts", [1, 2, 3, 5])
def test_max_attempts_counts_every_attempt_the_first_run_among_them(max_attempts):
    """ACTHELM_MAX_ATTEMPTS=N: attempts 1 to N-1 fail into a retry, attempt N fails the task."""
    rules = replace(RULES, max_attempts=max_attempts)
    for earlier in range(max_attempts - 1):
        plan = decide(replace(failed(failed_attempts=earlier), rules=rules))
        assert plan.move.status == TaskStatus.READY, earlier
    plan = decide(replace(failed(failed_attempts=max_attempts - 1), rules=rules))
    assert plan.move.status == TaskStatus.FAILED
    assert plan.move.fields["failed_attempts"] == max_attempts


def test_attempts_exhausted_fail_the_task_with_the_last_error():
    earlier = (("provider_server_error", "500"), ("internal_error", "y"))
    plan = decide(failed(failed_attempts=2, earlier_attempts=earlier))
    assert plan.move.status == TaskStatus.FAILED and plan.move.kind == EventKind.FAILED
    assert plan.move.fields["failure_code"] == "provider_timeout"
    assert plan.move.fields["failure_message"] == "timed out after 30 s"
    assert plan.move.fields["failed_attempts"] == 3
    assert plan.note_stuck


def test_a_single_attempt_is_no_loop():
    plan = decide(replace(failed(), rules=replace(RULES, max_attempts=1)))
    assert plan.move.status == TaskStatus.FAILED
    assert plan.move.fields["failure_code"] == "provider_timeout"


def test_attempts_that_all_share_a_signature_are_an_error_loop():
    # Numbers differ, the error does not; a non-attempt among the earlier runs is skipped.
    earlier = (
        ("provider_timeout", "timed out after 31 s"),
        ("handed_back", ""),
        ("provider_timeout", "timed out after 29 s"),
    )
    plan = decide(failed(failed_attempts=2, earlier_attempts=earlier))
    assert plan.move.fields["failure_code"] == FailureCode.ERROR_LOOP
    assert plan.move.fields["failure_message"] == (
        "All 3 attempts failed with the same error (provider_timeout): timed out after 30 s"
    )
    assert plan.move.data["code"] == FailureCode.ERROR_LOOP


def test_too_few_earlier_attempts_are_no_loop():
    earlier = (("provider_timeout", "timed out after 31 s"),)
    plan = decide(failed(failed_attempts=2, earlier_attempts=earlier))
    assert plan.move.fields["failure_code"] == "provider_timeout"


@pytest.mark.parametrize(
    ("code", "retryable"),
    [
        (FailureCode.LIMIT_TOKENS, True),
        (FailureCode.MODEL_UNTESTED, True),
        (FailureCode.PROVIDER_BAD_REQUEST, False),
    ],
)
def test_a_limit_a_final_code_or_a_permanent_error_fails_at_once(code, retryable):
    plan = decide(replace(failed(code=code, message="no"), retryable=retryable))
    assert plan.run.fields == {"error_code": code, "error_message": "no"}
    assert plan.move.status == TaskStatus.FAILED
    assert plan.move.fields == {"failure_code": code, "failure_message": "no"}
    assert plan.move.data == {"code": code, "message": "no"}


def test_a_health_error_cools_the_connection_and_moves_to_the_fallback_model():
    to = Fallback(model_id=3, connection_id=9, label="free-b/small")
    plan = decide(
        failed(
            code=FailureCode.PROVIDER_AUTH,
            message="401",
            health=True,
            connection=health(fallback=to),
        )
    )
    until = NOW + timedelta(seconds=600)
    assert plan.cooldown.connection_id == 7 and plan.cooldown.until == until
    assert (plan.cooldown.code, plan.cooldown.message) == ("provider_auth", "401")
    assert [e.kind for e in plan.events] == [EventKind.PROVIDER_COOLDOWN]
    assert plan.events[0].data == {
        "connection": "free-a",
        "code": "provider_auth",
        "until": until.isoformat(),
    }
    assert plan.move.status == TaskStatus.READY and plan.move.kind == EventKind.RETRY_SCHEDULED
    assert plan.move.fields == {"connection_id": 9, "model_id": 3, "not_before": None}
    assert plan.move.data == {"fallback": "free-b/small", "from": "free-a", "code": "provider_auth"}


def test_without_a_fallback_the_task_waits_for_the_earliest_cooldown():
    soon = NOW + timedelta(seconds=120)
    plan = decide(
        failed(
            code=FailureCode.PROVIDER_RATE_LIMITED,
            health=True,
            connection=health(others_cooldown_end=soon),
        )
    )
    assert plan.move.fields == {"not_before": soon, "failed_attempts": 1}
    assert plan.move.data["waiting_for_cooldown"] == soon.isoformat()
    # Nothing else cools down: its own cooldown is the earliest.
    plan = decide(failed(code=FailureCode.PROVIDER_QUOTA, health=True, connection=health()))
    assert plan.move.fields["not_before"] == NOW + timedelta(seconds=600)


def test_a_connection_already_cooling_down_is_not_written_again():
    until = NOW + timedelta(seconds=42)
    plan = decide(
        failed(
            code=FailureCode.PROVIDER_COOLING_DOWN,
            health=True,
            connection=replace(health(), cooldown_until=until),
        )
    )
    assert plan.cooldown is None
    assert plan.events[0].data["until"] == until.isoformat()
    assert plan.move.fields == {"not_before": until}  # not an attempt


def test_a_credential_refused_twice_fails_the_task():
    plan = decide(
        failed(
            code=FailureCode.PROVIDER_AUTH,
            message="401",
            health=True,
            connection=health(auth_refused_before=True),
        )
    )
    assert plan.cooldown is not None  # the connection still rests
    assert plan.move.status == TaskStatus.FAILED
    assert plan.move.fields["failure_message"].startswith("the connection free-a refused")


def test_quota_counts_against_the_attempts():
    plan = decide(
        failed(
            code=FailureCode.PROVIDER_QUOTA,
            health=True,
            failed_attempts=2,
            connection=health(fallback=Fallback(3, 9, "free-b/small")),
        )
    )
    assert plan.move.status == TaskStatus.FAILED
    assert plan.move.fields["failed_attempts"] == 3


def test_a_hand_back_requeues_until_it_is_a_loop():
    plan = decide(facts(OutcomeKind.HANDED_BACK, earlier_codes=("handed_back",) * 4))
    assert plan.run.fields == {"error_code": FailureCode.HANDED_BACK}
    assert plan.move.status == TaskStatus.READY and plan.move.kind == EventKind.HANDED_BACK
    assert plan.move.data == {"reason": "worker shutting down"}
    plan = decide(
        facts(
            OutcomeKind.HANDED_BACK,
            message="database connection lost",
            earlier_codes=("handed_back",) * 5,
        )
    )
    assert plan.move.fields["failure_code"] == FailureCode.HANDBACK_LOOP
    assert "6 times in a row" in plan.move.fields["failure_message"]
    assert "database connection lost" in plan.move.fields["failure_message"]
    # An attempt between the hand-backs breaks the row.
    earlier = ("handed_back",) * 4 + ("provider_timeout",)
    assert decide(facts(OutcomeKind.HANDED_BACK, earlier_codes=earlier)).move.status == "ready"


def test_a_pause_asked_for_meanwhile_parks_the_task_instead_of_requeuing_it():
    asked = {"task_status": TaskStatus.PAUSE_REQUESTED}
    plan = decide(replace(failed(), **asked))
    assert plan.move.status == TaskStatus.PAUSED and plan.move.kind == EventKind.PAUSED
    assert plan.move.data["after"] == EventKind.RETRY_SCHEDULED
    assert plan.move.fields["failed_attempts"] == 1
    plan = decide(replace(facts(OutcomeKind.PAUSED), **asked))
    assert plan.run.status == RunStatus.CANCELLED
    assert (plan.move.status, plan.move.data) == (TaskStatus.PAUSED, None)
    # The pause was withdrawn after the run stopped for it.
    plan = decide(facts(OutcomeKind.PAUSED))
    assert plan.move.status == TaskStatus.READY and plan.move.kind == EventKind.HANDED_BACK


def test_waiting_for_a_person_is_not_an_attempt():
    plan = decide(facts(OutcomeKind.AWAITING_APPROVAL))
    assert plan.move.status == TaskStatus.AWAITING_APPROVAL
    assert plan.run.fields == {"error_code": FailureCode.AWAITING_APPROVAL}
    plan = decide(facts(OutcomeKind.NEEDS_REVIEW))
    assert plan.move.status == TaskStatus.NEEDS_REVIEW


def test_a_lost_run_is_requeued_once_then_fails_as_worker_lost():
    lost = facts(OutcomeKind.LOST, run_id=11, lost_worker="w1", lease_owner="w1")
    plan = decide(lost)
    assert plan.run.fields == {
        "error_code": FailureCode.WORKER_LOST,
        "error_message": "worker w1 stopped renewing its lease",
    }
    assert [(e.kind, e.data) for e in plan.events] == [
        (EventKind.LOST, {"worker": "w1", "run_id": 11})
    ]
    assert plan.move.status == TaskStatus.READY and plan.move.kind == EventKind.REQUEUED
    assert plan.move.fields == {"lost_count": 1}
    plan = decide(replace(lost, lost_count=1))
    assert plan.move.status == TaskStatus.FAILED
    assert plan.move.fields["failure_code"] == FailureCode.WORKER_LOST
    assert plan.move.fields["lost_count"] == 2
    # No run was started: only the task moves.
    assert decide(replace(lost, run_id=None)).run is None
