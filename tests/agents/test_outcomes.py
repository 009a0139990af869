"""A run's end as its last step's statement writes it (agents.engine.verdict.outcomes.handoff and
the step function's hand-off, migration agents 0020): an approved final answer ends the run and
moves the task to review in the step's one statement, exactly as the fenced transaction (`handle`)
writes it; the statement declines, writing nothing, when the task's status is no longer the one the
end was decided for or a notification target wants the move, and the transaction writes it then."""

from typing import Any

import pytest
from django.db import connection
from django.utils import timezone

from agents.engine import store
from agents.engine.run import recorder as recorder_module
from agents.engine.run.recorder import Recorder, Step, load_state
from agents.engine.runtime.worker import Worker
from agents.engine.store import claim_next
from agents.engine.verdict.outcomes import Outcome, handoff
from agents.engine.verdict.supervisor import SupervisorVerdict
from agents.models import AgentRun
from core.actors import Actor
from tasks.models import Task, TaskEvent
from tasks.notify.models import Notification, NotificationTarget
from tasks.states import TaskKind, TaskOrigin, TaskStatus
from tests.agents.scripted import fast_settings, status_of, tool_task
from tests.fakes.model_server import ScriptedModelServer, reply_text

pytestmark = pytest.mark.django_db(transaction=True)

APPROVED = SupervisorVerdict(True, "approved: the rules passed; no model supervisor")

#: What differs between two tasks by identity, not by how their end was written.
_RUN_OWN = {"task_id", "started_at", "heartbeat_at", "finished_at", "claim_event_id"}
_RUN_OWN |= {"answer_stored_at", "active_seconds", "checkpoint"}  # times, and ids in the JSON
_OWN = {"id", "title", "created_at", "updated_at", "not_before", "connection_id", "model_id"}


def _statements() -> tuple[list[str], Any]:
    seen: list[str] = []

    def wrapper(execute: Any, sql: str, params: Any, many: bool, context: Any) -> Any:
        seen.append(sql)
        return execute(sql, params, many, context)

    return seen, wrapper


def _run_to_the_end(task: Task) -> list[str]:
    """Claim and run `task` in this thread; the SQL of its run (the claim's excepted)."""
    claim = claim_next(worker_id="w")
    assert claim is not None and claim.task_id == task.pk
    seen, wrapper = _statements()
    with connection.execute_wrapper(wrapper):
        Worker(worker_id="w").process(claim)
    return seen


def _written(task: Task) -> dict[str, Any]:
    run = AgentRun.objects.get(task=task)
    row = Task.objects.get(pk=task.pk)
    return {
        "task": {
            f.attname: getattr(row, f.attname)
            for f in Task._meta.concrete_fields
            if f.attname not in _OWN
        },
        "run": {
            f.attname: getattr(run, f.attname)
            for f in AgentRun._meta.concrete_fields
            if f.attname not in _OWN | _RUN_OWN
        },
        "run_times": (run.finished_at is not None, run.answer_stored_at is not None),
        "events": [
            (e.kind, e.actor_kind, e.actor_label, e.from_status, e.to_status, e.data, e.run_id)
            for e in TaskEvent.objects.filter(task=task).order_by("id")
        ],
        "notifications": Notification.objects.filter(task=task).count(),
    }


def _normalised(written: dict[str, Any], task: Task) -> dict[str, Any]:
    """`written` with the task's own ids in place of their values."""
    run_id = AgentRun.objects.get(task=task).pk
    events = [
        (
            *e[:5],
            {k: "run" if k == "run_id" and v == run_id else v for k, v in e[5].items()},
            "run" if e[6] == run_id else e[6],
        )
        for e in written["events"]
    ]
    return {**written, "events": events}


def test_an_approved_answer_ends_its_run_in_the_step_as_the_transaction_writes_it(
    settings, monkeypatch
):
    fast_settings(settings)
    with ScriptedModelServer([reply_text("the answer"), reply_text("the answer")]) as server:
        first, second = tool_task(server, []), tool_task(server, [])
        end = _run_to_the_end(first)
        # The same end through the fenced transaction, as before the hand-off.
        monkeypatch.setattr(recorder_module, "handoff", lambda *a, **k: None)
        transaction_end = _run_to_the_end(second)
    assert status_of(first) == status_of(second) == TaskStatus.REVIEW
    a, b = _normalised(_written(first), first), _normalised(_written(second), second)
    for key in a:
        if isinstance(a[key], dict):
            diff = {k: (a[key][k], b[key][k]) for k in a[key] if a[key][k] != b[key][k]}
            assert not diff, (key, diff)
        else:
            assert a[key] == b[key], (key, a[key], b[key])
    run = AgentRun.objects.get(task=first)
    assert (run.status, run.verdict, run.answer) == ("succeeded", "approved", "the answer")
    row = Task.objects.get(pk=first.pk)
    assert (row.lease_owner, row.lease_expires_at) == ("", None)
    assert row.updated_at >= run.finished_at - timezone.timedelta(seconds=1)
    # After the claim: the start, then the step with the end in one statement (the verdict
    # reads nothing for a task that made no tool call).
    assert len(end) == 2, end
    assert len(transaction_end) > len(end)


def test_a_target_that_wants_the_move_gets_it_through_the_transaction(settings):
    fast_settings(settings)
    NotificationTarget.objects.create(
        name="off", kind="webhook", address="https://example.com/a", enabled=False
    )
    NotificationTarget.objects.create(
        name="other", kind="webhook", address="https://example.com/b", events=["failed"]
    )
    with ScriptedModelServer([reply_text("one"), reply_text("two")]) as server:
        quiet = tool_task(server, [])
        end = _run_to_the_end(quiet)
        assert len(end) == 2, end  # no target wants a move to review: handed off
        NotificationTarget.objects.create(
            name="reviewers", kind="webhook", address="https://example.com/c", events=["review"]
        )
        told = tool_task(server, [])
        end = _run_to_the_end(told)
    assert len(end) > 2  # declined by the statement, written by the transaction
    assert status_of(told) == TaskStatus.REVIEW
    assert Notification.objects.filter(task=told, target__name="reviewers").count() == 1
    assert Notification.objects.filter(task=quiet).count() == 0


def _claimed_step(server) -> tuple[Task, Recorder, Step]:
    task = tool_task(server, [])
    claim = claim_next(worker_id="w")
    assert claim is not None
    saved = load_state(task.pk, claim.run_id)
    actor = Actor.worker("w")
    recorder = Recorder(task_id=task.pk, run_id=claim.run_id, actor=actor, task=saved.task)
    return saved.task, recorder, Step(answer="done")


def test_a_task_whose_status_changed_since_the_run_read_it_is_not_handed_off(settings):
    """The end was decided for the status the run read; another status at the statement (a
    pause requested meanwhile, say) declines the hand-off, nothing written, and the fenced
    transaction decides again on the row it locks."""
    fast_settings(settings)
    with ScriptedModelServer([]) as server:
        task, recorder, step = _claimed_step(server)
        task.status = TaskStatus.PAUSE_REQUESTED  # what the run believes; the row says otherwise
        given = handoff(
            task,
            recorder.run,
            actor=recorder.actor,
            outcome=Outcome(Outcome.FINAL, answer="done"),
            verdict=APPROVED,
            now=timezone.now(),
        )
        assert given is not None and given.from_status == TaskStatus.PAUSE_REQUESTED
        events = TaskEvent.objects.filter(task=task).count()
        planned = store.plan_step(step, recorder.actor)
        assert planned is not None
        written = store.write_step(
            planned,
            step,
            task_id=task.pk,
            run_id=recorder.run_id,
            actor=recorder.actor,
            checkpoint=dict,
            handoff=given,
        )
    assert written is None
    run = AgentRun.objects.get(task=task)
    assert (run.status, run.answer, run.model_turns) == ("started", "", 0)
    assert status_of(task) == TaskStatus.IN_PROGRESS
    assert TaskEvent.objects.filter(task=task).count() == events


@pytest.mark.parametrize(
    ("outcome", "verdict"),
    [
        (Outcome(Outcome.FINAL, answer="x"), SupervisorVerdict(False, "the answer is empty")),
        (Outcome(Outcome.FINAL, answer="x"), None),
        (Outcome(Outcome.FAILED, code="provider_error", message="boom", retryable=True), None),
        (Outcome(Outcome.PAUSED), None),
    ],
)
def test_only_an_approved_final_answer_is_a_handoff(settings, outcome, verdict):
    fast_settings(settings)
    with ScriptedModelServer([]) as server:
        task, recorder, _ = _claimed_step(server)
        given = handoff(
            task,
            recorder.run,
            actor=recorder.actor,
            outcome=outcome,
            verdict=verdict,
            now=timezone.now(),
        )
    assert given is None


def test_a_task_a_policy_may_close_is_not_handed_off(settings):
    fast_settings(settings)
    settings.ACTHELM_AUTO_CLOSE_GOAL_NO_WORK = True
    with ScriptedModelServer([]) as server:
        task, recorder, _ = _claimed_step(server)
        args = {
            "actor": recorder.actor,
            "outcome": Outcome(Outcome.FINAL, answer="done"),
            "verdict": APPROVED,
            "now": timezone.now(),
        }
        assert handoff(task, recorder.run, **args) is not None
        task.kind, task.origin = TaskKind.PLANNING, TaskOrigin.RECONCILER
        assert handoff(task, recorder.run, **args) is None
