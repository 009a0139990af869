"""The worker end to end: real processes, the scripted model CLI, real PostgreSQL."""

import json
import sys
from datetime import timedelta

import pytest
from django.db import OperationalError, connection
from django.db.models import Count
from django.utils import timezone

from agents.actions.task import task_cancel, task_pause
from agents.engine.run.intake import task_create
from agents.engine.run.loop import Outcome
from agents.engine.run.recorder import _LOAD
from agents.engine.runtime.recovery import recover_stale
from agents.engine.runtime.worker import Worker
from agents.engine.store import claim_next
from agents.engine.verdict.outcomes import apply_outcome
from agents.models import AgentRun, Connection, Turn
from core.actors import Actor
from tasks.models import Task, TaskEvent
from tasks.states import EventKind, TaskStatus
from tests.agents.conftest import SCRIPTED_CLI, cli_calls, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


def status_of(task) -> str:
    return Task.objects.values_list("status", flat=True).get(pk=task.pk)


def kinds(task) -> list[str]:
    return list(TaskEvent.objects.filter(task=task).order_by("id").values_list("kind", flat=True))


def test_a_cli_task_runs_to_review_never_done(cli_model, cli_task, fast_worker_settings):
    model = cli_model("--mode", "echo")
    task = cli_task(model)
    Worker(worker_id="w1", burst=True).run()
    assert status_of(task) == TaskStatus.REVIEW
    run = AgentRun.objects.get(task=task)
    assert run.status == "succeeded" and run.verdict == "approved"
    assert run.answer.startswith("ANSWER: === SYSTEM ===")
    assert cli_calls(cli_model.counter) == 1
    assert kinds(task) == ["created", "claimed", "model_turn", "submitted"]


def test_a_task_the_command_line_creates_without_tools_runs_to_review_on_a_model_cli(
    cli_model, manage, fast_worker_settings
):
    """`acthelm_task create --no-tools` (issue 32): no model given, the tested model CLI is the
    default, and the task runs to review on it."""
    from tests.factories import UserFactory

    UserFactory(username="ops", perms=["tasks.add_task"])
    model = cli_model("--mode", "text", "--text", "three bullet points")
    args = ["acthelm_task", "--user", "ops", "--json", "create", "--title", "T"]
    created = manage(*args, "--instruction", "Summarise.", "--no-tools", check=True)
    task = Task.objects.get(pk=json.loads(created.stdout)["id"])
    assert (task.tools, task.model, task.status) == ([], model, TaskStatus.READY)
    Worker(worker_id="w1", burst=True).run()
    assert status_of(task) == TaskStatus.REVIEW
    run = AgentRun.objects.get(task=task)
    assert (run.status, run.answer) == ("succeeded", "three bullet points")
    assert cli_calls(cli_model.counter) == 1


def test_a_claims_fresh_tasks_start_from_the_state_read_with_the_claim(
    cli_model, cli_task, fast_worker_settings
):
    """The dispatcher reads the state of a claim's fresh tasks in one statement with the claim:
    their runs start without a load of their own, and end as a run that loads itself does."""
    model = cli_model("--mode", "echo")
    tasks = [cli_task(model) for _ in range(2)]
    worker = Worker(worker_id="w1", concurrency=2)
    claims, starts = worker._claim(2)
    assert sorted(c.task_id for c in claims) == sorted(t.pk for t in tasks)
    assert sorted(starts) == sorted(t.pk for t in tasks)
    load = _LOAD._compile()[1]
    seen: list[str] = []

    def wrapper(execute, sql, params, many, context):
        seen.append(sql)
        return execute(sql, params, many, context)

    with connection.execute_wrapper(wrapper):
        for claim in claims:
            worker.process(claim, starts[claim.task_id])
    assert load not in seen
    assert [status_of(t) for t in tasks] == [TaskStatus.REVIEW] * 2
    assert all(kinds(t) == ["created", "claimed", "model_turn", "submitted"] for t in tasks)


def test_a_claim_whose_states_cannot_be_read_still_runs_its_tasks(
    cli_model, cli_task, fast_worker_settings, monkeypatch
):
    """The claim is committed before the states are read: when that read fails, the claimed
    tasks still start, and each run reads its own state."""
    model = cli_model("--mode", "echo")
    task = cli_task(model)

    def broken(pairs):
        raise OperationalError("the server went away")

    monkeypatch.setattr("agents.engine.runtime.worker.load_starts", broken)
    worker = Worker(worker_id="w1", concurrency=2)
    claims, starts = worker._claim(2)
    assert [c.task_id for c in claims] == [task.pk] and starts == {}
    worker.process(claims[0])
    assert status_of(task) == TaskStatus.REVIEW


def test_race_8_processes_200_tasks_each_reaches_review_once(cli_model, cli_task, spawn_worker):
    model = cli_model("--mode", "text", "--text", "done")
    tasks = [cli_task(model, title=f"T{i}") for i in range(200)]
    workers = [spawn_worker("--burst", worker_id=f"race-{i}") for i in range(8)]
    for w in workers:
        assert w.wait(timeout=240) == 0, w.output[-2000:]
    ids = [t.pk for t in tasks]
    assert set(Task.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"review"}
    # Exactly one claim, one run, one model call per task; every claim has its event.
    per_task = AgentRun.objects.filter(task_id__in=ids).values("task_id").annotate(n=Count("id"))
    assert {row["n"] for row in per_task} == {1} and len(per_task) == 200
    assert TaskEvent.objects.filter(task_id__in=ids, kind=EventKind.CLAIMED).count() == 200
    assert TaskEvent.objects.filter(task_id__in=ids, kind=EventKind.SUBMITTED).count() == 200
    assert cli_calls(cli_model.counter) == 200
    assert len({r.worker_id for r in AgentRun.objects.filter(task_id__in=ids)}) > 1


def test_aba_a_late_write_of_a_lost_attempt_is_refused(cli_model, cli_task, settings):
    """Claim, lose the lease, recovery requeues, a second worker claims and finishes: the first
    run's late result is refused and nothing of it is stored."""
    model = cli_model("--mode", "echo")
    task = cli_task(model)
    first = claim_next(worker_id="slow")
    Task.objects.filter(pk=task.pk).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert recover_stale() == [task.pk]
    assert status_of(task) == TaskStatus.READY
    second = claim_next(worker_id="fast")
    assert second.claim_count == first.claim_count + 1
    # The first attempt comes back with an answer: every write is fenced out.
    from core.exceptions import AttemptLost

    with pytest.raises(AttemptLost):
        apply_outcome(
            task_id=task.pk,
            run_id=first.run_id,
            worker_id="slow",
            outcome=Outcome(Outcome.FAILED, code="x", message="late"),
        )
    Worker(worker_id="fast", burst=True).process(second)
    assert status_of(task) == TaskStatus.REVIEW
    assert not Turn.objects.filter(run_id=first.run_id).exists()
    assert AgentRun.objects.get(pk=first.run_id).error_code == "worker_lost"


def test_crash_mid_answer_is_recovered_and_the_model_asked_again(
    cli_model, cli_task, spawn_worker, tmp_path
):
    script = tmp_path / "answers.json"
    script.write_text(json.dumps([{"sleep": 60, "text": "slow"}, {"text": "fresh answer"}]))
    model = cli_model(
        "--mode", "script", "--script", str(script), "--state-file", str(tmp_path / "state")
    )
    task = cli_task(model)
    first = spawn_worker(worker_id="doomed")
    wait_for(lambda: cli_calls(cli_model.counter) == 1, message="the model call")
    first.kill()
    second = spawn_worker(worker_id="rescuer")
    wait_for(lambda: status_of(task) == TaskStatus.REVIEW, timeout=45, message="review")
    second.stop()
    assert cli_calls(cli_model.counter) == 2
    runs = list(AgentRun.objects.filter(task=task).order_by("number"))
    assert [(r.status, r.error_code) for r in runs] == [
        ("failed", "worker_lost"),
        ("succeeded", ""),
    ]
    assert runs[1].answer == "fresh answer"
    assert EventKind.LOST in kinds(task) and EventKind.REQUEUED in kinds(task)


def test_crash_after_the_answer_was_checkpointed_does_not_call_the_model_again(
    cli_model, cli_task, spawn_worker, tmp_path
):
    model = cli_model("--mode", "text", "--text", "the stored answer")
    sup_calls = tmp_path / "supervisor-calls.jsonl"
    script = tmp_path / "verdicts.json"
    script.write_text(json.dumps([{"sleep": 60, "text": "APPROVED"}, {"text": "APPROVED"}]))
    sup = Connection.objects.create(
        name="supervisor",
        kind="cli",
        cost_tier="zero_cost",
        command=[
            sys.executable,
            SCRIPTED_CLI,
            "--count-file",
            str(sup_calls),
            "--mode",
            "script",
            "--script",
            str(script),
            "--state-file",
            str(tmp_path / "sstate"),
        ],
    )
    sup.models.create(name="judge", supports_tools=False, test_status="passed")
    task = cli_task(model)
    env = {"ACTHELM_SUPERVISOR_CONNECTION": "supervisor"}
    first = spawn_worker(worker_id="doomed", env=env)
    # The answer is checkpointed, and the worker is inside the (slow) supervisor call.
    wait_for(lambda: cli_calls(sup_calls) == 1, message="the supervisor call")
    assert AgentRun.objects.get(task=task).answer == "the stored answer"
    first.kill()
    second = spawn_worker(worker_id="rescuer", env=env)
    wait_for(lambda: status_of(task) == TaskStatus.REVIEW, timeout=45, message="review")
    second.stop()
    assert cli_calls(cli_model.counter) == 1  # the model was NOT called again
    assert AgentRun.objects.filter(task=task, status="succeeded").get().answer == (
        "the stored answer"
    )


def test_a_task_is_requeued_once_then_fails_as_worker_lost(cli_model, cli_task):
    task = cli_task(cli_model("--mode", "echo"))
    for _ in range(2):
        claim_next(worker_id="w")
        Task.objects.filter(pk=task.pk).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        recover_stale()
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED and task.failure_code == "worker_lost"
    assert kinds(task).count(EventKind.LOST) == 2 and kinds(task).count(EventKind.REQUEUED) == 1


def test_a_run_past_the_timeout_is_recovered_even_with_a_fresh_lease(cli_model, cli_task, settings):
    # Past both the run timeout and the task's own runtime limit (+ 5 minutes).
    settings.ACTHELM_RUN_TIMEOUT_SECONDS = 10
    task = cli_task(cli_model("--mode", "echo"), limits={"limit_runtime_seconds": 10})
    claim = claim_next(worker_id="w")
    AgentRun.objects.filter(pk=claim.run_id).update(
        started_at=timezone.now() - timedelta(seconds=400)
    )
    assert recover_stale() == [task.pk]
    assert AgentRun.objects.get(pk=claim.run_id).error_code == "worker_lost"


@pytest.mark.parametrize("ending", [False, True])
def test_the_heartbeat_tells_a_lost_run_but_not_one_whose_own_end_moved_its_task(
    cli_model, cli_task, caplog, ending
):
    """A task no longer held by a listed run: lost (warned, cancelled) unless the run is writing
    its end — its task moved on with that write, committed before the run left the list."""
    from agents.engine.run.loop import RunSignals
    from agents.engine.runtime.heartbeat import Heartbeat, Running

    task = cli_task(cli_model("--mode", "echo"))
    claim = claim_next(worker_id="w")
    worker = Worker(worker_id="w", burst=True)
    signals = RunSignals()
    worker._running[claim.run_id] = Running(claim, signals)
    heartbeat = Heartbeat(worker)
    heartbeat.beat(None)
    assert not signals.cancel.is_set() and "run.lost" not in caplog.text
    if ending:
        signals.ending.set()
    apply_outcome(
        task_id=task.pk,
        run_id=claim.run_id,
        worker_id="w",
        outcome=Outcome(Outcome.FAILED, code="x", message="ended", retryable=False),
    )
    heartbeat.beat(None)
    assert signals.cancel.is_set() is not ending
    assert ("run.lost" in caplog.text) is not ending


def _failing_attempt(task, message, now):
    claim = claim_next(worker_id="w")
    assert claim is not None and claim.task_id == task.pk
    return apply_outcome(
        task_id=task.pk,
        run_id=claim.run_id,
        worker_id="w",
        now=now,
        outcome=Outcome(
            Outcome.FAILED, code="provider_cli_failed", message=message, retryable=True
        ),
    )


def test_retries_back_off_1_then_5_minutes_then_report_a_loop(cli_model, cli_task):
    """Three attempts by default: after the first and second failed attempt the task waits 1
    and 5 minutes; the failure of the third ends it (docs/worker.md)."""
    task = cli_task(cli_model("--mode", "echo"))
    now = timezone.now()
    delays = []
    for attempt in range(3):
        status = _failing_attempt(task, f"exit 1: boom at step {attempt}", now)
        task.refresh_from_db()
        if attempt < 2:
            assert status == TaskStatus.READY
            delays.append((task.not_before - now).total_seconds())
            Task.objects.filter(pk=task.pk).update(not_before=None)  # time passes
    assert delays == [60, 300]
    assert task.status == TaskStatus.FAILED and task.failure_code == "error_loop"
    assert task.failure_message.startswith("All 3 attempts failed with the same error")


def test_different_errors_are_not_a_loop(cli_model, cli_task):
    task = cli_task(cli_model("--mode", "echo"))
    now = timezone.now()
    for message in ["exit 1: disk full", "exit 2: bad gateway", "exit 1: disk full"]:
        _failing_attempt(task, message, now)
        Task.objects.filter(pk=task.pk).update(not_before=None)
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED and task.failure_code == "provider_cli_failed"


@pytest.mark.parametrize("max_attempts", [1, 3])
def test_max_attempts_runs_end_to_end_then_a_loop(
    cli_model, cli_task, settings, fast_worker_settings, max_attempts
):
    """ACTHELM_MAX_ATTEMPTS counts runs, the first among them: N means at most N model runs."""
    settings.ACTHELM_RETRY_DELAYS = [0]
    settings.ACTHELM_MAX_ATTEMPTS = max_attempts
    model = cli_model("--mode", "fail", "--exit-code", "3", "--stderr", "model crashed")
    task = cli_task(model)
    Worker(worker_id="w", burst=True).run()
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED and task.failed_attempts == max_attempts
    assert cli_calls(cli_model.counter) == max_attempts == task.runs.count()
    assert kinds(task).count(EventKind.RETRY_SCHEDULED) == max_attempts - 1
    if max_attempts > 1:  # one attempt is no loop
        assert task.failure_code == "error_loop"
        assert task.failure_message.startswith(
            f"All {max_attempts} attempts failed with the same error (provider_cli_failed): "
        )


def test_rate_limit_cools_down_and_moves_to_the_next_zero_cost_never_paid(
    cli_model, cli_task, fast_worker_settings, tmp_path
):
    limited = cli_model(
        "--mode",
        "fail",
        "--exit-code",
        "1",
        "--stderr",
        "Error: 429 Too Many Requests",
        name="limited",
        priority=10,
    )
    paid_calls = tmp_path / "paid.jsonl"
    paid = Connection.objects.create(
        name="paid",
        kind="cli",
        cost_tier="paid",
        priority=5,
        command=[
            sys.executable,
            SCRIPTED_CLI,
            "--count-file",
            str(paid_calls),
            "--mode",
            "text",
            "--text",
            "paid answer",
        ],
    )
    paid.models.create(name="big", supports_tools=False, test_status="passed")
    free_calls = tmp_path / "free.jsonl"
    free = Connection.objects.create(
        name="free",
        kind="cli",
        cost_tier="zero_cost",
        priority=1,
        command=[
            sys.executable,
            SCRIPTED_CLI,
            "--count-file",
            str(free_calls),
            "--mode",
            "text",
            "--text",
            "free answer",
        ],
    )
    free.models.create(name="small", supports_tools=False, test_status="passed")
    task = cli_task(limited)
    Worker(worker_id="w", burst=True).run()
    task.refresh_from_db()
    assert task.status == TaskStatus.REVIEW and task.connection == free
    assert AgentRun.objects.filter(task=task, status="succeeded").get().answer == "free answer"
    assert cli_calls(paid_calls) == 0
    limited.connection.refresh_from_db()
    assert limited.connection.cooldown_until > timezone.now()
    assert limited.connection.last_error_code == "provider_rate_limited"
    assert EventKind.PROVIDER_COOLDOWN in kinds(task)
    assert task.failed_attempts == 1  # a rate limit counts against the attempts (issue 13)


def test_with_no_zero_cost_connection_left_the_task_waits_instead_of_failing(
    cli_model, cli_task, fast_worker_settings, tmp_path
):
    quota = cli_model(
        "--mode",
        "fail",
        "--exit-code",
        "1",
        "--stderr",
        "You exceeded your current quota (insufficient_quota)",
        name="quota",
    )
    paid = Connection.objects.create(
        name="paid",
        kind="cli",
        cost_tier="paid",
        command=[sys.executable, SCRIPTED_CLI, "--mode", "text", "--text", "paid"],
    )
    paid.models.create(name="big", supports_tools=False, test_status="passed")
    task = cli_task(quota)
    Worker(worker_id="w", burst=True).run()
    task.refresh_from_db()
    quota.connection.refresh_from_db()
    assert task.status == TaskStatus.READY and task.connection == quota.connection
    assert task.not_before == quota.connection.cooldown_until
    assert quota.connection.last_error_code == "provider_quota"


def test_sigterm_hands_the_task_back_at_the_next_safe_point(cli_model, cli_task, spawn_worker):
    model = cli_model("--mode", "sleep", "--seconds", "2", "--text", "slow but fine")
    task = cli_task(model)
    worker = spawn_worker(worker_id="graceful")
    wait_for(lambda: cli_calls(cli_model.counter) == 1, message="the model call")
    worker.terminate()
    assert worker.wait(timeout=30) == 0
    assert status_of(task) == TaskStatus.READY
    assert EventKind.HANDED_BACK in kinds(task)
    # The answer was stored before the hand-back: the next worker does not ask again.
    Worker(worker_id="next", burst=True).run()
    assert status_of(task) == TaskStatus.REVIEW
    assert cli_calls(cli_model.counter) == 1


def test_cancel_stops_a_running_model_call_within_a_heartbeat(
    cli_model, cli_task, fast_worker_settings, person
):
    import threading

    model = cli_model("--mode", "hang")
    task = cli_task(model)
    worker = Worker(worker_id="w", burst=True)
    thread = threading.Thread(target=worker.run)
    thread.start()
    wait_for(lambda: cli_calls(cli_model.counter) == 1, message="the model call")
    task_cancel(actor=Actor.person(person), task_id=task.pk)
    thread.join(10)
    assert not thread.is_alive()
    assert status_of(task) == TaskStatus.CANCELLED
    run = AgentRun.objects.get(task=task)
    assert run.status == "cancelled"
    assert not Turn.objects.filter(task=task, role="assistant").exists()


def test_pause_stops_at_the_next_safe_point_and_resume_continues(
    cli_model, cli_task, fast_worker_settings, person
):
    import threading

    from agents.actions.task import task_resume

    model = cli_model("--mode", "sleep", "--seconds", "1.5", "--text", "paused answer")
    task = cli_task(model)
    worker = Worker(worker_id="w", burst=True)
    thread = threading.Thread(target=worker.run)
    thread.start()
    wait_for(lambda: cli_calls(cli_model.counter) == 1, message="the model call")
    task_pause(actor=Actor.person(person), task_id=task.pk)
    thread.join(15)
    assert status_of(task) == TaskStatus.PAUSED
    task_resume(actor=Actor.person(person), task_id=task.pk)
    Worker(worker_id="w2", burst=True).run()
    assert status_of(task) == TaskStatus.REVIEW
    assert cli_calls(cli_model.counter) == 1


def test_a_new_task_wakes_an_idle_worker_through_listen_notify(cli_model, cli_task, spawn_worker):
    model = cli_model("--mode", "text", "--text", "ok")
    worker = spawn_worker(worker_id="idle", env={"ACTHELM_POLL_SECONDS": "120"})
    wait_for(lambda: "worker.started" in _peek(worker), timeout=20, message="worker start")
    import time

    time.sleep(1.0)  # the worker is asleep on LISTEN now (its poll interval is 120 s)
    task = cli_task(model)
    wait_for(lambda: status_of(task) == TaskStatus.REVIEW, timeout=30, message="review")


def _peek(worker) -> str:
    import os
    import select

    fd = worker.proc.stdout.fileno()
    os.set_blocking(fd, False)
    chunks = []
    while select.select([fd], [], [], 0)[0]:
        data = os.read(fd, 65536)
        if not data:
            break
        chunks.append(data.decode(errors="replace"))
    worker.seen = getattr(worker, "seen", "") + "".join(chunks)
    return worker.seen


@pytest.mark.parametrize(
    ("args", "answer_field", "code"),
    [
        (["--mode", "hang"], "", "provider_timeout"),
        (["--mode", "fail", "--exit-code", "2", "--stderr", "segfault"], "", "provider_cli_failed"),
        (["--mode", "invalid-json"], "result", "provider_bad_response"),
        (["--mode", "huge", "--bytes", str(10 * 1024 * 1024)], "", "provider_output_too_large"),
    ],
)
def test_bad_cli_output_gives_a_clear_code_and_a_retry(
    cli_model, cli_task, fast_worker_settings, args, answer_field, code
):
    model = cli_model(*args, timeout=1.5)
    if answer_field:
        Connection.objects.filter(pk=model.connection_id).update(answer_field=answer_field)
    task = cli_task(model)
    Worker(worker_id="w", burst=True).run()
    task.refresh_from_db()
    run = AgentRun.objects.get(task=task)
    assert run.status == "failed" and run.error_code == code
    assert task.status == TaskStatus.READY and task.not_before and task.failed_attempts == 1
    assert kinds(task)[-1] == EventKind.RETRY_SCHEDULED


def test_a_task_on_an_untested_model_refuses_to_start(cli_model, cli_task, fast_worker_settings):
    model = cli_model("--mode", "echo")
    model.test_status = "failed"
    model.save()
    task = cli_task(model)
    Worker(worker_id="w", burst=True).run()
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED and task.failure_code == "model_untested"
    assert cli_calls(cli_model.counter) == 0


def test_a_task_without_a_connection_refuses_to_start(fast_worker_settings):
    task = task_create(actor=Actor.system("t"), title="T", instruction="I", tools=[])
    Worker(worker_id="w", burst=True).run()
    task.refresh_from_db()
    assert task.status == TaskStatus.FAILED and task.failure_code == "connection_missing"
