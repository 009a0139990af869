"""A person overrules the supervisor (agents.actions.task): the rejected run accepted into review
with a reason, or the task changed and retried; never under a worker, never overwritten by one."""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from agents.actions import task as person_task
from agents.actions import task_change
from agents.engine.store import claim_next
from agents.engine.verdict.policies import auto_close_if_allowed
from agents.models import AgentRun, Artifact, Turn
from agents.selectors import DEFAULT_CHECK, TASK_CHECK, last_rejection, task_read, task_result
from agents.states import RunStatus, Verdict
from core.actors import Actor
from core.exceptions import InvalidInput, NotPermitted, TransitionNotAllowed
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskKind, TaskOrigin, TaskStatus
from tasks.transitions import lock_task
from tests.agents.rejections import ANSWER, REPORT, reject, rejected_task
from tests.factories import AgentRunFactory, TaskFactory, UserFactory

pytestmark = pytest.mark.django_db


def accepted_event(task) -> TaskEvent:
    return TaskEvent.objects.get(task=task, kind=EventKind.ACCEPTED)


@pytest.mark.parametrize("failed", [False, True], ids=["retry-scheduled", "failed"])
def test_accept_moves_the_rejected_run_to_review_with_its_result(actor, failed):
    task = rejected_task(failed=failed)
    run = AgentRun.objects.get(task=task)
    if not failed:
        assert task.not_before is not None  # the retry is scheduled
    turns = Turn.objects.count()

    person_task.task_accept(actor=actor, task_id=task.pk, reason="report.md is what I wanted")

    task.refresh_from_db()
    assert task.status == TaskStatus.REVIEW
    assert task.not_before is None and task.failure_code == "" and task.feedback == ""
    event = accepted_event(task)
    assert event.actor_user == actor.user and event.actor_label == "founder"
    assert (event.from_status, event.to_status) == (
        TaskStatus.FAILED if failed else TaskStatus.READY,
        TaskStatus.REVIEW,
    )
    assert event.run_id == run.pk
    assert event.data["reason"] == "report.md is what I wanted"
    assert event.data["run_id"] == run.pk and event.data["run"] == 1
    assert event.data["failed_checks"] == [
        {
            "check": "named_output=summary.md",
            "detail": "the instruction asks for summary.md; artifacts: report.md",
            "source": DEFAULT_CHECK,
        },
        {
            "check": "answer_contains=four",
            "detail": "the answer does not contain 'four'",
            "source": TASK_CHECK,
        },
    ]
    assert ("retry_cancelled" in event.data) is (not failed)
    # The run is the supervisor's record, kept as it was; its result is what review shows.
    run.refresh_from_db()
    assert run.status == RunStatus.FAILED and run.verdict == Verdict.REJECTED
    result = task_result(task_read(task.pk, transcript=False))
    assert result["answer"] == ANSWER
    assert [a["name"] for a in result["artifacts"]] == ["report.md"]
    assert (Artifact.objects.get(task=task).run_id, REPORT) == (run.pk, REPORT)
    # No model was asked, and the failed checks stay readable with who accepted.
    assert Turn.objects.count() == turns and AgentRun.objects.filter(task=task).count() == 1
    rejection = last_rejection(task)
    assert rejection is not None and rejection.accepted == event
    assert [c["source"] for c in rejection.failed_checks] == [DEFAULT_CHECK, TASK_CHECK]
    # A person closes it as any task in review.
    person_task.task_close(actor=actor, task_id=task.pk)
    assert Task.objects.get(pk=task.pk).status == TaskStatus.DONE


def test_accept_needs_a_reason(actor):
    task = rejected_task()
    with pytest.raises(InvalidInput, match="why") as refused:
        person_task.task_accept(actor=actor, task_id=task.pk, reason="  ")
    assert refused.value.field == "reason"
    assert Task.objects.get(pk=task.pk).status == TaskStatus.READY


def test_accept_needs_the_close_permission():
    task = rejected_task()
    operator = UserFactory(username="operator", perms=["tasks.operate_task"])
    with pytest.raises(NotPermitted):
        person_task.task_accept(actor=Actor.person(operator), task_id=task.pk, reason="fine")
    assert not TaskEvent.objects.filter(kind=EventKind.ACCEPTED).exists()


def test_only_a_person_accepts():
    task = rejected_task()
    with pytest.raises(TransitionNotAllowed, match="only a person"):
        person_task.task_accept(actor=Actor.worker("w"), task_id=task.pk, reason="fine")


def test_accept_is_refused_when_the_newest_run_was_not_rejected(actor):
    never_run = TaskFactory(status=TaskStatus.FAILED)
    with pytest.raises(TransitionNotAllowed, match="not rejected"):
        person_task.task_accept(actor=actor, task_id=never_run.pk, reason="fine")
    # Rejected once, then a later run failed otherwise: that later run is the newest.
    task = rejected_task()
    Task.objects.filter(pk=task.pk).update(status=TaskStatus.FAILED, not_before=None)
    AgentRunFactory(
        task=task,
        number=2,
        claim_count=2,
        status=RunStatus.FAILED,
        error_code="provider_error",
        finished_at=timezone.now(),
    )
    with pytest.raises(TransitionNotAllowed, match="not rejected"):
        person_task.task_accept(actor=actor, task_id=task.pk, reason="fine")
    assert Task.objects.get(pk=task.pk).status == TaskStatus.FAILED


def test_a_run_without_an_answer_cannot_be_accepted(actor):
    from tests.agents.rejections import reject

    task = TaskFactory(tools=["write_artifact"])
    reject(task, answer="")
    with pytest.raises(TransitionNotAllowed, match="no answer"):
        person_task.task_accept(actor=actor, task_id=task.pk, reason="fine")


@pytest.mark.parametrize(
    "status",
    [
        TaskStatus.IN_PROGRESS,
        TaskStatus.PAUSE_REQUESTED,
        TaskStatus.PAUSED,
        TaskStatus.REVIEW,
        TaskStatus.DONE,
        TaskStatus.CANCELLED,
    ],
)
def test_accept_is_refused_in_every_other_state(actor, status):
    task = rejected_task()
    lease = {}
    if status in (TaskStatus.IN_PROGRESS, TaskStatus.PAUSE_REQUESTED):
        lease = {"lease_owner": "w", "lease_expires_at": timezone.now() + timedelta(seconds=60)}
    Task.objects.filter(pk=task.pk).update(status=status, **lease)
    with pytest.raises(TransitionNotAllowed):
        person_task.task_accept(actor=actor, task_id=task.pk, reason="fine")
    assert Task.objects.get(pk=task.pk).status == status


def test_a_second_accept_is_refused(actor):
    task = rejected_task()
    person_task.task_accept(actor=actor, task_id=task.pk, reason="fine")
    with pytest.raises(TransitionNotAllowed):
        person_task.task_accept(actor=actor, task_id=task.pk, reason="again")
    assert TaskEvent.objects.filter(task=task, kind=EventKind.ACCEPTED).count() == 1


def test_an_accept_after_a_reopen_is_refused_and_the_feedback_stays(actor):
    """Accept, reopen with feedback, accept the same rejected run again: the second accept would
    put the task back in review and erase the reopen's feedback. It is refused."""
    task = rejected_task()
    person_task.task_accept(actor=actor, task_id=task.pk, reason="fine")
    person_task.task_reopen(actor=actor, task_id=task.pk, feedback="Write summary.md as asked")
    with pytest.raises(TransitionNotAllowed, match="already accepted by"):
        person_task.task_accept(actor=actor, task_id=task.pk, reason="fine after all")
    task.refresh_from_db()
    assert task.status == TaskStatus.READY
    assert task.feedback == "Write summary.md as asked"
    assert TaskEvent.objects.filter(task=task, kind=EventKind.ACCEPTED).count() == 1
    rejection = last_rejection(task)
    assert rejection is not None and not rejection.acceptable


def _retry(actor, task):
    person_task.task_retry(actor=actor, task_id=task.pk)


def _retry_now(actor, task):
    person_task.task_retry_now(actor=actor, task_id=task.pk)


def _change_and_retry(actor, task):
    task_change.task_change_and_retry(
        actor=actor, task_id=task.pk, changes={"instruction": "Write them to report.md"}
    )


@pytest.mark.parametrize(
    ("failed", "decide"),
    [(True, _retry), (False, _retry_now), (True, _change_and_retry)],
    ids=["retry", "retry-now", "change-and-retry"],
)
def test_an_accept_never_overrules_a_persons_later_retry(actor, failed, decide):
    task = rejected_task(failed=failed)
    decide(actor, task)
    with pytest.raises(TransitionNotAllowed, match="chose to run it again"):
        person_task.task_accept(actor=actor, task_id=task.pk, reason="fine")
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.not_before is None
    assert not TaskEvent.objects.filter(task=task, kind=EventKind.ACCEPTED).exists()


def test_the_next_rejected_run_can_be_accepted_once_again(actor):
    """The rule is per rejected run: after the reopen, the next run the supervisor rejects is
    the newest, and a person may accept that one (once)."""
    task = rejected_task()
    person_task.task_accept(actor=actor, task_id=task.pk, reason="fine")
    person_task.task_reopen(actor=actor, task_id=task.pk, feedback="Write summary.md")
    second = reject(task)
    assert second.number == 2
    person_task.task_accept(actor=actor, task_id=task.pk, reason="run 2 will do")
    assert Task.objects.get(pk=task.pk).status == TaskStatus.REVIEW
    runs = TaskEvent.objects.filter(task=task, kind=EventKind.ACCEPTED).order_by("id")
    assert [e.run_id for e in runs] == [AgentRun.objects.get(task=task, number=1).pk, second.pk]


@pytest.mark.django_db(transaction=True)
def test_a_retry_timer_firing_during_the_accept_claims_nothing(actor):
    """The retry falls due while the person's accept holds the row: the claim skips the locked
    row, and once the accept commits the task is in review, which no claim takes."""
    task = rejected_task()
    Task.objects.filter(pk=task.pk).update(not_before=timezone.now() - timedelta(seconds=1))
    claims = []

    def worker():
        try:
            claims.append(claim_next(worker_id="w-timer"))
        finally:
            connection.close()

    with transaction.atomic():
        person_task.task_accept(actor=actor, task_id=task.pk, reason="good enough")
        thread = threading.Thread(target=worker)
        thread.start()
        thread.join(10)
    assert claims == [None]
    assert claim_next(worker_id="w-timer") is None
    task.refresh_from_db()
    assert task.status == TaskStatus.REVIEW and task.lease_owner == ""
    assert AgentRun.objects.filter(task=task).count() == 1


@pytest.mark.django_db(transaction=True)
def test_a_claim_that_won_the_race_refuses_the_accept(actor):
    """The timer fired first: a worker holds the task, so the accept is refused, and the worker's
    new run is not touched."""
    task = rejected_task()
    Task.objects.filter(pk=task.pk).update(not_before=timezone.now() - timedelta(seconds=1))
    claim = claim_next(worker_id="w-timer")
    assert claim is not None
    with pytest.raises(TransitionNotAllowed):
        person_task.task_accept(actor=actor, task_id=task.pk, reason="too late")
    task.refresh_from_db()
    assert task.status == TaskStatus.IN_PROGRESS
    assert AgentRun.objects.get(pk=claim.run_id).status == RunStatus.STARTED


def test_the_auto_close_policy_never_closes_an_accepted_task(actor, settings):
    """Even a planning task of the reconciler that proposed follow-ups, with an approved run,
    waits for a person once a person accepted it over the supervisor."""
    settings.ACTHELM_AUTO_CLOSE_GOAL_NO_WORK = True
    task = rejected_task(
        kind=TaskKind.PLANNING, origin=TaskOrigin.RECONCILER, tools=["update_plan"]
    )
    TaskFactory(spawned_by=task)
    person_task.task_accept(actor=actor, task_id=task.pk, reason="the plan is fine")
    run = AgentRun.objects.get(task=task)
    with transaction.atomic():
        locked = lock_task(task.pk)
        assert auto_close_if_allowed(locked, run, actor=Actor.worker("w")) is False
        # Not even with an approved run (a later attempt): a person took this task over.
        AgentRun.objects.filter(pk=run.pk).update(verdict=Verdict.APPROVED)
        run.refresh_from_db()
        assert auto_close_if_allowed(locked, run, actor=Actor.worker("w")) is False
    assert Task.objects.get(pk=task.pk).status == TaskStatus.REVIEW


# --- Change and retry ----------------------------------------------------------------------


def test_edit_records_each_change_before_and_after(actor):
    task = rejected_task(failed=True, limit_turns=10)
    task_change.task_update(
        actor=actor,
        task_id=task.pk,
        changes={
            "instruction": "Summarise notes.txt in three bullets and write them to report.md",
            "acceptance_checks": ["artifact=report.md"],
            "tools": ["read_file", "write_artifact"],
            "limit_turns": 20,
        },
    )
    task.refresh_from_db()
    assert task.acceptance_checks == [{"kind": "artifact", "value": "report.md"}]
    assert task.tools == ["read_file", "write_artifact"] and task.limit_turns == 20
    event = TaskEvent.objects.get(task=task, kind=EventKind.EDITED)
    assert event.data["fields"] == ["acceptance_checks", "instruction", "limit_turns", "tools"]
    assert event.data["before"]["instruction"].startswith("Summarise notes.txt in three bullet")
    assert event.data["after"]["instruction"].endswith("to report.md")
    assert event.data["before"]["acceptance_checks"] == []
    assert event.data["after"]["acceptance_checks"] == [{"kind": "artifact", "value": "report.md"}]
    assert (event.data["before"]["limit_turns"], event.data["after"]["limit_turns"]) == (10, 20)
    assert task.status == TaskStatus.FAILED  # an edit alone does not run it


def test_edit_refuses_checks_that_cannot_pass_or_parse(actor):
    task = rejected_task(failed=True)
    with pytest.raises(InvalidInput, match="tool_ran=fetch_url"):
        task_change.task_update(
            actor=actor, task_id=task.pk, changes={"acceptance_checks": ["tool_ran=fetch_url"]}
        )
    with pytest.raises(InvalidInput):
        task_change.task_update(
            actor=actor, task_id=task.pk, changes={"acceptance_checks": ["no_such_kind=1"]}
        )
    assert not TaskEvent.objects.filter(task=task, kind=EventKind.EDITED).exists()


@pytest.mark.parametrize("status", [TaskStatus.IN_PROGRESS, TaskStatus.PAUSE_REQUESTED])
def test_edit_is_refused_while_a_worker_holds_the_task(actor, status):
    task = TaskFactory(status=status)
    with pytest.raises(TransitionNotAllowed, match="a worker holds it; pause it"):
        task_change.task_update(actor=actor, task_id=task.pk, changes={"instruction": "New"})
    assert Task.objects.get(pk=task.pk).instruction == "Summarise the input files."


@pytest.mark.parametrize("status", [TaskStatus.DONE, TaskStatus.CANCELLED])
def test_a_closed_or_cancelled_task_is_not_edited(actor, status):
    task = TaskFactory(status=status)
    with pytest.raises(TransitionNotAllowed, match="a closed or cancelled task is not edited"):
        task_change.task_update(actor=actor, task_id=task.pk, changes={"instruction": "New"})
    assert Task.objects.get(pk=task.pk).instruction == "Summarise the input files."
    assert not TaskEvent.objects.filter(task=task, kind=EventKind.EDITED).exists()


@pytest.mark.parametrize(
    "changes",
    [
        {"tool_policies": {"fetch_url": "ask"}},
        {"tools": ["read_file"], "tool_policies": {"write_artifact": "ask"}},
    ],
    ids=["policy-only", "with-tools"],
)
def test_edit_refuses_a_policy_for_a_tool_off_the_list_as_create_does(actor, changes):
    task = rejected_task(failed=True)
    with pytest.raises(InvalidInput, match="a policy names tools the task does not use") as no:
        task_change.task_update(actor=actor, task_id=task.pk, changes=changes)
    assert no.value.field == "tool_policies"
    assert Task.objects.get(pk=task.pk).tool_policies == {}
    assert not TaskEvent.objects.filter(task=task, kind=EventKind.EDITED).exists()


def test_a_tool_that_leaves_the_list_takes_its_policy_along(actor):
    task = rejected_task(failed=True, tool_policies={"write_artifact": "ask"})
    task_change.task_update(actor=actor, task_id=task.pk, changes={"tools": ["read_file"]})
    task.refresh_from_db()
    assert task.tools == ["read_file"] and task.tool_policies == {}
    event = TaskEvent.objects.get(task=task, kind=EventKind.EDITED)
    assert event.data["before"]["tool_policies"] == {"write_artifact": "ask"}
    assert event.data["after"]["tool_policies"] == {}


@pytest.mark.parametrize("tools", [None, "read_file", {"read_file": True}])
def test_edit_refuses_tools_that_are_not_a_list(actor, tools):
    task = rejected_task(failed=True)
    with pytest.raises(InvalidInput, match="tools must be a list") as refused:
        task_change.task_update(actor=actor, task_id=task.pk, changes={"tools": tools})
    assert refused.value.field == "tools"


def test_change_and_retry_a_failed_task_runs_it_again_from_its_checkpoint(actor):
    task = rejected_task(failed=True)
    task_change.task_change_and_retry(
        actor=actor, task_id=task.pk, changes={"instruction": "Write them to report.md"}
    )
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.not_before is None
    kinds = list(task.events.order_by("id").values_list("kind", flat=True))
    assert kinds[-2:] == [EventKind.EDITED, EventKind.RETRIED]


def test_change_and_retry_a_waiting_task_drops_its_wait(actor):
    task = rejected_task()
    assert task.not_before is not None
    task_change.task_change_and_retry(
        actor=actor, task_id=task.pk, changes={"acceptance_checks": ["artifact=report.md"]}
    )
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.not_before is None
    retried = task.events.filter(kind=EventKind.RETRIED).get()
    assert retried.data["retry_now"] is True


def test_a_refused_retry_undoes_the_edit(actor):
    task = TaskFactory(status=TaskStatus.PAUSED)
    with pytest.raises(TransitionNotAllowed, match="retried now"):
        task_change.task_change_and_retry(
            actor=actor, task_id=task.pk, changes={"instruction": "New"}
        )
    task.refresh_from_db()
    assert task.instruction == "Summarise the input files."
    assert not task.events.filter(kind=EventKind.EDITED).exists()
