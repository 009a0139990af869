"""Dependencies gate work: blocked until every dependency is done, promoted in the same transaction
as the close that finished the last one, cycles refused, stuck dependencies explained."""

import pytest
from django.db import transaction
from django.utils import timezone

from agents import task_services
from agents.policies import auto_close_if_allowed
from agents.states import RunStatus, Verdict
from tasks import services
from tasks.actors import Actor
from tasks.exceptions import DependencyCycle
from tasks.models import Task, TaskDependency, TaskEvent
from tasks.selectors import blocking_reason
from tasks.states import EventKind, TaskKind, TaskOrigin, TaskStatus
from tasks.transitions import lock_task, set_status
from tests.factories import AgentRunFactory, GoalFactory, ModelFactory, TaskFactory

pytestmark = pytest.mark.django_db

WORKER = Actor.worker("w-test")


def create(actor, title, *deps):
    return task_services.task_create(actor=actor, title=title, instruction="do it", depends_on=deps)


def finish(actor, task):
    """What the worker and a person do: run it to review, then close it."""
    with transaction.atomic():
        locked = lock_task(task.pk)
        set_status(
            locked,
            TaskStatus.IN_PROGRESS,
            actor=WORKER,
            kind=EventKind.CLAIMED,
            lease_owner="w-test",
            lease_expires_at=locked.created_at,
        )
        set_status(locked, TaskStatus.REVIEW, actor=WORKER, kind=EventKind.SUBMITTED)
    return services.task_close(actor=actor, task_id=task.pk)


def status(task) -> str:
    return Task.objects.values_list("status", flat=True).get(pk=task.pk)


def test_a_chain_is_promoted_one_link_at_a_time(actor):
    a = create(actor, "A")
    b = create(actor, "B", a)
    c = create(actor, "C", b)
    assert [status(t) for t in (a, b, c)] == ["ready", "blocked", "blocked"]

    finish(actor, a)
    assert [status(t) for t in (a, b, c)] == ["done", "ready", "blocked"]
    finish(actor, b)
    assert [status(t) for t in (b, c)] == ["done", "ready"]
    promoted = TaskEvent.objects.get(task=c, kind=EventKind.PROMOTED)
    assert promoted.data == {"dependency": b.pk} and promoted.actor_label == "founder"


def test_a_diamond_waits_for_both_sides(actor):
    top = create(actor, "top")
    left = create(actor, "left", top)
    right = create(actor, "right", top)
    bottom = create(actor, "bottom", left, right)

    finish(actor, top)
    assert (status(left), status(right), status(bottom)) == ("ready", "ready", "blocked")
    finish(actor, left)
    assert status(bottom) == "blocked"
    assert f"#{right.pk}" in blocking_reason(Task.objects.get(pk=bottom.pk))
    finish(actor, right)
    assert status(bottom) == "ready"
    assert TaskEvent.objects.filter(task=bottom, kind=EventKind.PROMOTED).count() == 1


def test_promotion_happens_in_the_closing_transaction(actor):
    dep = TaskFactory(status=TaskStatus.REVIEW)
    waiting = create(actor, "W", dep)
    with transaction.atomic():
        services.task_close(actor=actor, task_id=dep.pk)
        # Still inside the close's transaction: the dependant is already ready.
        assert status(waiting) == "ready"


def test_an_already_done_dependency_does_not_block(actor):
    done = TaskFactory(status=TaskStatus.DONE)
    assert create(actor, "T", done).status == TaskStatus.READY


@pytest.mark.parametrize("length", [2, 3, 5])
def test_cycles_of_any_length_are_refused(actor, length):
    chain = [create(actor, "t0")]
    for i in range(1, length):
        chain.append(create(actor, f"t{i}", chain[-1]))
    links = TaskDependency.objects.count()
    with pytest.raises(DependencyCycle, match="cycle"):
        # The first would wait for the last, which (through the chain) waits for the first.
        services.task_add_dependency(actor=actor, task_id=chain[0].pk, depends_on_id=chain[-1].pk)
    assert TaskDependency.objects.count() == links
    assert status(chain[0]) == "ready"


def test_adding_a_dependency_that_closes_no_cycle_is_allowed_and_blocks(actor):
    top = create(actor, "top")
    left = create(actor, "left", top)
    right = create(actor, "right", top)
    # right -> left is a cross edge in the diamond, not a cycle.
    services.task_add_dependency(actor=actor, task_id=right.pk, depends_on_id=left.pk)
    assert TaskDependency.objects.filter(task=right, depends_on=left).exists()
    assert status(right) == "blocked"


def test_a_self_dependency_is_refused(actor):
    task = create(actor, "T")
    with pytest.raises(DependencyCycle):
        services.task_add_dependency(actor=actor, task_id=task.pk, depends_on_id=task.pk)


def test_cancelling_a_dependency_leaves_dependants_blocked_and_says_why(actor):
    dep = create(actor, "Collect data")
    other = create(actor, "Other")
    waiting = create(actor, "Report", dep, other)
    task_services.task_cancel(actor=actor, task_id=dep.pk, reason="not needed")

    assert status(waiting) == "blocked"
    event = TaskEvent.objects.get(task=waiting, kind=EventKind.UNBLOCK_BLOCKED)
    assert event.data == {"dependency": dep.pk, "dependency_status": "cancelled"}
    reason = blocking_reason(Task.objects.get(pk=waiting.pk))
    assert f"#{dep.pk} “Collect data” was cancelled" in reason
    assert f"#{other.pk} “Other” (ready)" in reason
    assert "cancel it" in reason


def test_a_failed_dependency_is_noted_on_its_dependants(actor):
    dep = TaskFactory(status=TaskStatus.IN_PROGRESS, title="Fetch")
    waiting = create(actor, "Use it", dep)
    unrelated = create(actor, "Unrelated")
    with transaction.atomic():
        locked = lock_task(dep.pk)
        set_status(
            locked,
            TaskStatus.FAILED,
            actor=WORKER,
            kind=EventKind.FAILED,
            failure_code="limit_steps",
        )
        noted = services.note_stuck_dependants(locked, actor=WORKER)

    assert noted == [waiting.pk]
    assert status(waiting) == "blocked"
    event = TaskEvent.objects.get(task=waiting, kind=EventKind.UNBLOCK_BLOCKED)
    assert event.data == {"dependency": dep.pk, "dependency_status": "failed"}
    assert event.actor_label == "w-test"
    assert not TaskEvent.objects.filter(task=unrelated, kind=EventKind.UNBLOCK_BLOCKED).exists()
    assert "failed and is done only if it is retried" in blocking_reason(
        Task.objects.get(pk=waiting.pk)
    )


def test_blocking_reason_is_none_unless_blocked(actor):
    assert blocking_reason(create(actor, "free")) is None


def test_blocking_reason_when_only_the_promotion_is_missing():
    dep = TaskFactory(status=TaskStatus.DONE)
    stale = TaskFactory(status=TaskStatus.BLOCKED)
    TaskDependency.objects.create(task=stale, depends_on=dep)
    assert "reconciler" in blocking_reason(stale)


def test_the_auto_close_path_promotes_dependants(settings, actor):
    settings.ACTHELM_AUTO_CLOSE_GOAL_NO_WORK = True
    planning = TaskFactory(
        status=TaskStatus.REVIEW, kind=TaskKind.PLANNING, origin=TaskOrigin.RECONCILER
    )
    TaskFactory(spawned_by=planning)
    waiting = create(actor, "After planning", planning)
    run = AgentRunFactory(
        task=planning,
        status=RunStatus.SUCCEEDED,
        verdict=Verdict.APPROVED,
        finished_at=planning.created_at,
    )
    with transaction.atomic():
        assert auto_close_if_allowed(lock_task(planning.pk), run, actor=WORKER)
    assert status(waiting) == "ready"


# --- follow-up tasks (propose_task) -------------------------------------------------------------


@pytest.fixture
def planning_task():
    model = ModelFactory()
    return TaskFactory(
        status=TaskStatus.IN_PROGRESS,
        kind=TaskKind.PLANNING,
        origin=TaskOrigin.RECONCILER,
        goal=GoalFactory(),
        tools=["update_plan", "propose_task"],
        connection=model.connection,
        model=model,
    )


def test_follow_ups_are_linked_and_gated_by_their_dependencies(planning_task, settings):
    first = task_services.follow_up_create(
        actor=WORKER, parent=planning_task, title="Collect", instruction="Collect the data."
    )
    second = task_services.follow_up_create(
        actor=WORKER,
        parent=planning_task,
        title="Report",
        instruction="Write the report.",
        depends_on=[first],
    )
    assert first.status == TaskStatus.READY and second.status == TaskStatus.BLOCKED
    for task in (first, second):
        task.refresh_from_db()
        assert task.spawned_by_id == planning_task.pk
        assert task.goal_id == planning_task.goal_id
        assert task.origin == TaskOrigin.AGENT and task.kind == TaskKind.WORK
        assert (task.connection_id, task.model_id) == (
            planning_task.connection_id,
            planning_task.model_id,
        )
        assert task.tools == ["update_plan"]  # the parent's, without propose_task
        assert task.created_by is None
    assert list(second.dependency_links.values_list("depends_on_id", flat=True)) == [first.pk]
    assert TaskEvent.objects.get(task=second, kind=EventKind.CREATED).actor_label == "w-test"


def test_proposing_the_same_title_twice_returns_the_first(planning_task):
    first = task_services.follow_up_create(
        actor=WORKER, parent=planning_task, title="Collect", instruction="Collect."
    )
    again = task_services.follow_up_create(
        actor=WORKER, parent=planning_task, title=" Collect ", instruction="Collect again."
    )
    assert again.pk == first.pk
    assert Task.objects.filter(spawned_by=planning_task).count() == 1


def test_a_follow_up_gets_no_more_than_remains_of_the_parent(planning_task, settings):
    from tasks.exceptions import InvalidInput

    planning_task.limit_turns, planning_task.limit_network_requests = 5, 4
    planning_task.save(update_fields=["limit_turns", "limit_network_requests"])
    AgentRunFactory(
        task=planning_task,
        model_turns=3,
        network_requests=1,
        active_seconds=10,
        status=RunStatus.CANCELLED,
        finished_at=timezone.now(),
    )
    child = task_services.follow_up_create(
        actor=WORKER, parent=planning_task, title="Next", instruction="Do it."
    )
    assert (child.limit_turns, child.limit_network_requests) == (2, 3)
    assert child.limit_runtime_seconds == planning_task.limit_runtime_seconds - 10
    AgentRunFactory(
        task=planning_task, model_turns=2, status=RunStatus.CANCELLED, finished_at=timezone.now()
    )
    with pytest.raises(InvalidInput) as exc:
        task_services.follow_up_create(
            actor=WORKER, parent=planning_task, title="Later", instruction="Do it."
        )
    assert exc.value.code == "limit_exhausted"


def test_a_follow_up_gets_what_remains_of_the_money_budget_and_the_mcp_calls(planning_task):
    from decimal import Decimal

    from tasks.exceptions import InvalidInput
    from tests.factories import TurnFactory

    no_budget = task_services.follow_up_create(
        actor=WORKER, parent=planning_task, title="Free", instruction="Do it."
    )
    assert no_budget.limit_cost is None  # the parent has none: nor does the child
    assert no_budget.limit_mcp_calls == planning_task.limit_mcp_calls
    planning_task.limit_cost, planning_task.limit_mcp_calls = Decimal("1"), 5
    planning_task.save(update_fields=["limit_cost", "limit_mcp_calls"])
    run = AgentRunFactory(
        task=planning_task, status=RunStatus.CANCELLED, finished_at=timezone.now()
    )
    TurnFactory(task=planning_task, run=run, index=1, cost=Decimal("0.25"))
    child = task_services.follow_up_create(
        actor=WORKER, parent=planning_task, title="Next", instruction="Do it."
    )
    assert (child.limit_cost, child.limit_mcp_calls) == (Decimal("0.75"), 5)
    TurnFactory(task=planning_task, run=run, index=2, cost=Decimal("0.75"))
    with pytest.raises(InvalidInput) as exc:
        task_services.follow_up_create(
            actor=WORKER, parent=planning_task, title="Later", instruction="Do it."
        )
    assert exc.value.code == "limit_exhausted"


def test_proposals_per_task_are_capped(planning_task, settings):
    from tasks.exceptions import InvalidInput

    settings.ACTHELM_MAX_PROPOSALS_PER_TASK = 2
    for title in ("One", "Two", "One"):  # the replay of "One" is not a new proposal
        task_services.follow_up_create(
            actor=WORKER, parent=planning_task, title=title, instruction="x"
        )
    with pytest.raises(InvalidInput) as exc:
        task_services.follow_up_create(
            actor=WORKER, parent=planning_task, title="Three", instruction="x"
        )
    assert exc.value.code == "proposal_limit"
    assert Task.objects.filter(spawned_by=planning_task).count() == 2


def test_a_follow_up_may_ask_for_fewer_tools_never_more(planning_task):
    from tasks.exceptions import InvalidInput

    planning_task.tools = ["update_plan", "propose_task", "read_file", "fetch_url"]
    planning_task.tool_policies = {"fetch_url": "ask"}
    planning_task.save(update_fields=["tools", "tool_policies"])
    child = task_services.follow_up_create(
        actor=WORKER, parent=planning_task, title="Read", instruction="x", tools=["read_file"]
    )
    assert (child.tools, child.tool_policies) == (["read_file"], {})
    for tools in (["write_artifact"], ["propose_task"], ["read_file", "list_files"]):
        with pytest.raises(InvalidInput) as exc:
            task_services.follow_up_create(
                actor=WORKER, parent=planning_task, title=f"t{tools}", instruction="x", tools=tools
            )
        assert exc.value.code == "tool_not_allowed"
