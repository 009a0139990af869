"""A task's services that reach past the ledger: create (tools, model, limits), cancel, resume,
retry, and the follow-ups a planning task proposes (never more than the parent has)."""

import pytest
from django.utils import timezone

from agents.actions import goal as goal_actions
from agents.actions import task as person_task
from agents.engine.run import intake
from agents.states import RunStatus
from core.actors import Actor
from core.exceptions import (
    InvalidInput,
    LimitNotRaised,
    ModelCheckFailed,
    TransitionNotAllowed,
)
from tasks.models import Goal, Task, TaskEvent
from tasks.states import EventKind, TaskKind, TaskOrigin, TaskStatus
from tests.factories import AgentRunFactory, GoalFactory, ModelFactory, TaskFactory

pytestmark = pytest.mark.django_db

WORKER = Actor.worker("w-test")


def test_create_copies_limit_defaults_and_is_ready(actor, settings):
    settings.ACTHELM_LIMIT_TURNS = 7
    task = intake.task_create(actor=actor, title="T", instruction="I")
    assert task.status == TaskStatus.READY
    assert task.limit_turns == 7 and task.limit_network_requests == 8
    assert task.created_by == actor.user
    event = TaskEvent.objects.get(task=task)
    assert event.kind == EventKind.CREATED and event.actor_label == "founder"


def test_create_with_an_unfinished_dependency_is_blocked(actor):
    dep = TaskFactory(status=TaskStatus.REVIEW)
    task = intake.task_create(actor=actor, title="T", instruction="I", depends_on=[dep])
    assert task.status == TaskStatus.BLOCKED


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"title": ""}, "title"),
        ({"instruction": "  "}, "instruction"),
        ({"tools": ["rm_rf"]}, "unknown tools"),
        ({"tool_policies": {"read_file": "maybe"}}, "allow or ask"),
        ({"limits": {"limit_turns": 0}}, "positive"),
        ({"limits": {"limit_turns": "many"}}, "whole number"),
        ({"limits": {"limit_coffee": 3}}, "unknown limit"),
    ],
)
def test_create_refuses_bad_input_clearly(actor, kwargs, message):
    base = {"title": "T", "instruction": "I"}
    with pytest.raises(InvalidInput, match=message):
        intake.task_create(actor=actor, **(base | kwargs))
    assert not Task.objects.exists()


def test_cancel_ends_the_running_attempt(actor):
    run = AgentRunFactory()
    person_task.task_cancel(actor=actor, task_id=run.task_id)
    run.refresh_from_db()
    assert run.status == RunStatus.CANCELLED and run.finished_at
    assert Task.objects.get(pk=run.task_id).status == TaskStatus.CANCELLED


def test_a_cancelled_task_cannot_be_resumed(actor):
    task = TaskFactory(status=TaskStatus.CANCELLED)
    with pytest.raises(TransitionNotAllowed):
        person_task.task_resume(actor=actor, task_id=task.pk)


def test_retry_after_a_limit_needs_the_limit_raised(actor):
    task = TaskFactory(status=TaskStatus.FAILED, failure_code="limit_steps", limit_turns=3)
    AgentRunFactory(task=task, status=RunStatus.FAILED, model_turns=3, finished_at=timezone.now())
    with pytest.raises(LimitNotRaised):
        person_task.task_retry(actor=actor, task_id=task.pk)
    person_task.task_set_limits(actor=actor, task_id=task.pk, limit_turns=10)
    assert person_task.task_retry(actor=actor, task_id=task.pk).status == TaskStatus.READY


def test_resume_on_another_model_runs_the_checks(actor):
    task = TaskFactory(status=TaskStatus.PAUSED)
    untested = ModelFactory(test_status="failed")
    with pytest.raises(ModelCheckFailed, match="has not passed its test"):
        person_task.task_resume(actor=actor, task_id=task.pk, model=untested)
    no_tools = ModelFactory(supports_tools=False)
    with pytest.raises(ModelCheckFailed, match="tool calling"):
        person_task.task_resume(actor=actor, task_id=task.pk, model=no_tools)
    small = ModelFactory(context_window=1)
    with pytest.raises(ModelCheckFailed, match="context window"):
        person_task.task_resume(actor=actor, task_id=task.pk, model=small)
    unknown = ModelFactory(context_window=None)
    person_task.task_resume(actor=actor, task_id=task.pk, model=unknown)
    task.refresh_from_db()
    assert task.status == TaskStatus.READY and task.model == unknown
    event = TaskEvent.objects.filter(task=task, kind=EventKind.RESUMED).get()
    assert "could not be made" in event.data["check"]["notes"][0]


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
    first = intake.follow_up_create(
        actor=WORKER, parent=planning_task, title="Collect", instruction="Collect the data."
    )
    second = intake.follow_up_create(
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
    first = intake.follow_up_create(
        actor=WORKER, parent=planning_task, title="Collect", instruction="Collect."
    )
    again = intake.follow_up_create(
        actor=WORKER, parent=planning_task, title=" Collect ", instruction="Collect again."
    )
    assert again.pk == first.pk
    assert Task.objects.filter(spawned_by=planning_task).count() == 1


def test_a_follow_up_gets_no_more_than_remains_of_the_parent(planning_task, settings):
    from core.exceptions import InvalidInput

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
    child = intake.follow_up_create(
        actor=WORKER, parent=planning_task, title="Next", instruction="Do it."
    )
    assert (child.limit_turns, child.limit_network_requests) == (2, 3)
    assert child.limit_runtime_seconds == planning_task.limit_runtime_seconds - 10
    AgentRunFactory(
        task=planning_task, model_turns=2, status=RunStatus.CANCELLED, finished_at=timezone.now()
    )
    with pytest.raises(InvalidInput) as exc:
        intake.follow_up_create(
            actor=WORKER, parent=planning_task, title="Later", instruction="Do it."
        )
    assert exc.value.code == "limit_exhausted"


def test_a_follow_up_gets_what_remains_of_the_money_budget_and_the_mcp_calls(planning_task):
    from decimal import Decimal

    from core.exceptions import InvalidInput
    from tests.factories import TurnFactory

    no_budget = intake.follow_up_create(
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
    child = intake.follow_up_create(
        actor=WORKER, parent=planning_task, title="Next", instruction="Do it."
    )
    assert (child.limit_cost, child.limit_mcp_calls) == (Decimal("0.75"), 5)
    TurnFactory(task=planning_task, run=run, index=2, cost=Decimal("0.75"))
    with pytest.raises(InvalidInput) as exc:
        intake.follow_up_create(
            actor=WORKER, parent=planning_task, title="Later", instruction="Do it."
        )
    assert exc.value.code == "limit_exhausted"


def test_proposals_per_task_are_capped(planning_task, settings):
    from core.exceptions import InvalidInput

    settings.ACTHELM_MAX_PROPOSALS_PER_TASK = 2
    for title in ("One", "Two", "One"):  # the replay of "One" is not a new proposal
        intake.follow_up_create(actor=WORKER, parent=planning_task, title=title, instruction="x")
    with pytest.raises(InvalidInput) as exc:
        intake.follow_up_create(actor=WORKER, parent=planning_task, title="Three", instruction="x")
    assert exc.value.code == "proposal_limit"
    assert Task.objects.filter(spawned_by=planning_task).count() == 2


def test_a_follow_up_may_ask_for_fewer_tools_never_more(planning_task):
    from core.exceptions import InvalidInput

    planning_task.tools = ["update_plan", "propose_task", "read_file", "fetch_url"]
    planning_task.tool_policies = {"fetch_url": "ask"}
    planning_task.save(update_fields=["tools", "tool_policies"])
    child = intake.follow_up_create(
        actor=WORKER, parent=planning_task, title="Read", instruction="x", tools=["read_file"]
    )
    assert (child.tools, child.tool_policies) == (["read_file"], {})
    for tools in (["write_artifact"], ["propose_task"], ["read_file", "list_files"]):
        with pytest.raises(InvalidInput) as exc:
            intake.follow_up_create(
                actor=WORKER, parent=planning_task, title=f"t{tools}", instruction="x", tools=tools
            )
        assert exc.value.code == "tool_not_allowed"


def test_a_follow_up_inherits_the_parent_s_acceptance_checks_only_when_asked(planning_task):
    planning_task.tools = ["update_plan", "propose_task", "read_file", "write_artifact"]
    planning_task.acceptance_checks = [
        {"kind": "artifact", "value": "summary.md"},
        {"kind": "tool_ran", "value": "read_file"},
    ]
    planning_task.save(update_fields=["tools", "acceptance_checks"])
    plain = intake.follow_up_create(
        actor=WORKER, parent=planning_task, title="Plain", instruction="Do it."
    )
    assert plain.acceptance_checks == []
    asked = intake.follow_up_create(
        actor=WORKER,
        parent=planning_task,
        title="Asked",
        instruction="Do it.",
        tools=["write_artifact"],
        inherit_checks=True,
    )
    # tool_ran=read_file could never pass without read_file: left out.
    assert asked.acceptance_checks == [{"kind": "artifact", "value": "summary.md"}]


# --- A person's new task: the model it runs on (issue 24) ------------------------------------


def test_a_new_task_without_a_model_runs_on_the_best_zero_cost_tested_tool_capable_model(actor):
    from tests.factories import ConnectionFactory

    ModelFactory(connection=ConnectionFactory(cost_tier="paid", priority=100))
    ModelFactory(connection=ConnectionFactory(priority=90), supports_tools=False)
    ModelFactory(connection=ConnectionFactory(priority=80), test_status="untested")
    ModelFactory(connection=ConnectionFactory(priority=70, enabled=False))
    low = ModelFactory(connection=ConnectionFactory(priority=1))
    best = ModelFactory(connection=ConnectionFactory(priority=5))
    task = intake.task_create(actor=actor, title="T", instruction="I", check_model=True)
    assert (task.connection, task.model) == (best.connection, best)
    # A chosen connection: its own tested, tool-capable model.
    task = intake.task_create(
        actor=actor, title="T", instruction="I", connection=low.connection, check_model=True
    )
    assert task.model == low


def test_a_new_task_is_refused_at_creation_when_no_model_could_run_it(actor):
    ModelFactory(supports_tools=False)
    with pytest.raises(InvalidInput) as refused:
        intake.task_create(actor=actor, title="T", instruction="I", check_model=True)
    assert (refused.value.code, refused.value.field) == ("no_usable_model", "model")
    assert not Task.objects.exists()
    # Without check_model (the engine's own callers, the tests) nothing is chosen or refused.
    task = intake.task_create(actor=actor, title="T", instruction="I")
    assert task.model is None


@pytest.mark.parametrize(
    ("fields", "tools", "code"),
    [
        ({"test_status": "untested"}, ["read_file"], "model_untested"),
        ({"test_status": "failed"}, [], "model_untested"),
        ({"supports_tools": False}, ["read_file"], "model_not_tool_capable"),
    ],
)
def test_a_chosen_model_the_task_could_not_run_on_is_refused_at_creation(
    actor, fields, tools, code
):
    model = ModelFactory(**fields)
    with pytest.raises(InvalidInput) as refused:
        intake.task_create(
            actor=actor, title="T", instruction="I", tools=tools, model=model, check_model=True
        )
    assert (refused.value.code, refused.value.field) == (code, "model")
    assert not Task.objects.exists()


def test_a_task_without_tools_may_run_on_a_model_that_is_not_tool_capable(actor):
    model = ModelFactory(supports_tools=False)
    task = intake.task_create(
        actor=actor, title="T", instruction="I", tools=[], model=model, check_model=True
    )
    assert task.model == model


def test_a_task_without_tools_defaults_to_a_tested_model_cli(actor):
    """A model CLI is recorded as not tool-capable: the default for a task without tools, never
    for one with tools (issue 32)."""
    from tests.factories import ConnectionFactory

    cli = ModelFactory(
        connection=ConnectionFactory(kind="cli", command=["llm"], base_url="", priority=5),
        supports_tools=False,
    )
    ModelFactory(connection=ConnectionFactory(priority=9), test_status="untested")
    ModelFactory(connection=ConnectionFactory(priority=9, enabled=False), supports_tools=False)
    task = intake.task_create(actor=actor, title="T", instruction="I", tools=[], check_model=True)
    assert (task.connection, task.model, task.tools) == (cli.connection, cli, [])
    # Only a connection: its first tested model, tool-capable or not.
    task = intake.task_create(
        actor=actor,
        title="T",
        instruction="I",
        tools=[],
        connection=cli.connection,
        check_model=True,
    )
    assert task.model == cli
    # With tools: refused, named on the model field, as before.
    for connection in (None, cli.connection):
        with pytest.raises(InvalidInput) as refused:
            intake.task_create(
                actor=actor,
                title="T",
                instruction="I",
                tools=["read_file"],
                connection=connection,
                check_model=True,
            )
        assert (refused.value.code, refused.value.field) == ("no_usable_model", "model")
    # Among equals a tool-capable model still comes first; a higher priority wins.
    api = ModelFactory(connection=ConnectionFactory(priority=5))
    task = intake.task_create(actor=actor, title="T", instruction="I", tools=[], check_model=True)
    assert task.model == api
    cli.connection.priority = 6
    cli.connection.save()
    task = intake.task_create(actor=actor, title="T", instruction="I", tools=[], check_model=True)
    assert task.model == cli


# --- A goal's acceptance checks: the defaults of the work planned for it (issue 23) -----------

GOAL_CHECKS = [
    {"kind": "artifact", "value": "report.md"},
    {"kind": "tool_ran", "value": "fetch_url"},
]


@pytest.fixture
def goal_keeper(db):
    from tests.factories import UserFactory

    return Actor.person(UserFactory(username="keeper", perms=["tasks.add_goal"]))


def test_a_goal_is_created_with_validated_checks_and_refused_with_a_bad_one(goal_keeper):
    goal = goal_actions.goal_create(
        actor=goal_keeper,
        title="Report",
        acceptance_checks=["artifact=report.md", "tool_ran=fetch_url", "artifact=report.md"],
    )
    # A goal has no tools: tool_ran is kept (each task drops it when it lacks the tool).
    assert Goal.objects.get(pk=goal.pk).acceptance_checks == GOAL_CHECKS
    with pytest.raises(InvalidInput) as exc:
        goal_actions.goal_create(
            actor=goal_keeper, title="Bad", acceptance_checks=["answer_matches=(?=ahead)x"]
        )
    assert (exc.value.code, exc.value.field) == ("acceptance_check_invalid", "acceptance_checks")
    assert list(Goal.objects.values_list("title", flat=True)) == ["Report"]


def test_a_person_s_task_for_a_goal_without_checks_gets_the_goal_s(actor):
    goal = GoalFactory(acceptance_checks=GOAL_CHECKS)
    meets = intake.task_create(
        actor=actor, title="T", instruction="I", goal=goal, tools=["fetch_url"]
    )
    assert meets.acceptance_checks == GOAL_CHECKS
    # tool_ran=fetch_url could never pass without fetch_url: left out, not refused.
    lacks = intake.task_create(
        actor=actor, title="T", instruction="I", goal=goal, tools=["read_file"]
    )
    assert lacks.acceptance_checks == [GOAL_CHECKS[0]]
    own = intake.task_create(
        actor=actor, title="T", instruction="I", goal=goal, acceptance_checks=["answer_not_echo"]
    )
    assert own.acceptance_checks == [{"kind": "answer_not_echo", "value": ""}]
    alone = intake.task_create(actor=actor, title="T", instruction="I")
    assert alone.acceptance_checks == []


def test_a_planning_task_does_not_get_its_goal_s_checks(actor):
    goal = GoalFactory(acceptance_checks=GOAL_CHECKS)
    for origin in (TaskOrigin.RECONCILER, TaskOrigin.PERSON):
        plan = intake.task_create(
            actor=actor,
            title="Plan",
            instruction="I",
            goal=goal,
            kind=TaskKind.PLANNING,
            origin=origin,
            tools=["update_plan", "propose_task", "fetch_url"],
        )
        assert plan.acceptance_checks == []


def test_a_follow_up_that_inherits_checks_gets_its_goal_s_too(planning_task):
    planning_task.goal.acceptance_checks = [*GOAL_CHECKS, {"kind": "answer_not_echo", "value": ""}]
    planning_task.goal.save(update_fields=["acceptance_checks"])
    planning_task.tools = ["update_plan", "propose_task", "write_artifact", "fetch_url"]
    planning_task.acceptance_checks = [{"kind": "answer_not_echo", "value": ""}]
    planning_task.save(update_fields=["tools", "acceptance_checks"])
    plain = intake.follow_up_create(
        actor=WORKER, parent=planning_task, title="Plain", instruction="Do it."
    )
    assert plain.acceptance_checks == []
    asked = intake.follow_up_create(
        actor=WORKER,
        parent=planning_task,
        title="Asked",
        instruction="Do it.",
        tools=["write_artifact"],
        inherit_checks=True,
    )
    # The parent's, then the goal's, each once; tool_ran=fetch_url left out without fetch_url.
    assert asked.acceptance_checks == [
        {"kind": "answer_not_echo", "value": ""},
        {"kind": "artifact", "value": "report.md"},
    ]
    with_tool = intake.follow_up_create(
        actor=WORKER,
        parent=planning_task,
        title="With the tool",
        instruction="Do it.",
        tools=["fetch_url"],
        inherit_checks=True,
    )
    assert with_tool.acceptance_checks == [
        {"kind": "answer_not_echo", "value": ""},
        *GOAL_CHECKS,
    ]
