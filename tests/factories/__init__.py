"""factory-boy factories for every model. Tasks are created with status set directly here —
tests need tasks in every state; production code changes status only through transitions."""

import factory
from django.contrib.auth import get_user_model
from django.contrib.auth.models import Permission
from django.db.models import F

from agents.catalogue.tools.mcp import is_mcp_tool
from agents.eval.models import EvalOutcome, EvalResult, EvalRun, EvalRunStatus
from agents.models import AgentRun, Artifact, Connection, Conversation, Model, ToolCall, Turn
from agents.states import ConnectionKind, CostTier, ModelTestStatus, RecoveryClass, Role
from approvals.models import Approval, ReviewDecision
from core.actors import ActorKind
from memory.models import MemoryEntry, MemorySelection
from tasks.models import Goal, Task, TaskEvent
from tasks.states import EventKind, TaskStatus


class UserFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = get_user_model()
        django_get_or_create = ["username"]
        skip_postgeneration_save = True

    username = factory.Sequence(lambda n: f"person{n}")
    email = factory.LazyAttribute(lambda u: f"{u.username}@example.com")
    is_staff = True
    password = factory.PostGenerationMethodCall("set_password", "pw")

    @factory.post_generation
    def perms(self, create, extracted, **kwargs):
        for codename in extracted or []:
            app_label, code = codename.split(".")
            self.user_permissions.add(
                Permission.objects.get(content_type__app_label=app_label, codename=code)
            )
        self.save()


class GoalFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Goal

    title = factory.Sequence(lambda n: f"Goal {n}")


class ConnectionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Connection

    name = factory.Sequence(lambda n: f"conn-{n}")
    kind = ConnectionKind.OPENAI_COMPATIBLE
    base_url = "http://127.0.0.1:9/v1"
    cost_tier = CostTier.ZERO_COST


class ModelFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Model

    connection = factory.SubFactory(ConnectionFactory)
    name = factory.Sequence(lambda n: f"model-{n}")
    context_window = 32_000
    supports_tools = True
    test_status = ModelTestStatus.PASSED


class TaskFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Task

    title = factory.Sequence(lambda n: f"Task {n}")
    instruction = "Summarise the input files."
    status = TaskStatus.READY
    tools = factory.LazyFunction(lambda: ["update_plan", "read_file", "list_files"])

    @factory.lazy_attribute
    def lease_owner(self):
        return "factory-worker" if self.status in ("in_progress", "pause_requested") else ""

    @factory.lazy_attribute
    def lease_expires_at(self):
        from datetime import timedelta

        from django.utils import timezone

        if self.status in ("in_progress", "pause_requested"):
            return timezone.now() + timedelta(seconds=60)
        return None


class TaskEventFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = TaskEvent

    task = factory.SubFactory(TaskFactory)
    kind = EventKind.CREATED
    actor_kind = ActorKind.SYSTEM
    actor_label = "system"


class AgentRunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = AgentRun

    task = factory.SubFactory(TaskFactory, status=TaskStatus.IN_PROGRESS)
    number = factory.Sequence(lambda n: n + 1)
    claim_count = factory.Sequence(lambda n: n + 1)
    worker_id = "factory-worker"


class ConversationFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Conversation

    task = factory.SubFactory(TaskFactory)
    system_prompt = "You are a careful agent."
    system_prompt_sha256 = "0" * 64


class TurnFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Turn

    run = factory.SubFactory(AgentRunFactory)
    task = factory.SelfAttribute("run.task")
    index = factory.Sequence(lambda n: n)
    role = Role.ASSISTANT
    content = "Thinking out loud, visibly."

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        """A priced turn is booked on its run, as the recorder does (AgentRun.cost)."""
        turn = super()._create(model_class, *args, **kwargs)
        if turn.cost:
            AgentRun.objects.filter(pk=turn.run_id).update(cost=F("cost") + turn.cost)
        return turn


class ToolCallFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ToolCall

    turn = factory.SubFactory(TurnFactory)
    run = factory.SelfAttribute("turn.run")
    task = factory.SelfAttribute("turn.task")
    position = factory.Sequence(lambda n: n)
    call_id = factory.Sequence(lambda n: f"call_{n}")
    tool = "fetch_url"
    arguments = factory.LazyFunction(lambda: {"url": "https://example.com/"})
    arguments_hash = factory.Sequence(lambda n: f"{n:064x}")
    recovery_class = RecoveryClass.EXTERNAL

    @classmethod
    def _create(cls, model_class, *args, **kwargs):
        """An MCP call's starts are booked on its run, as the recorder does (AgentRun.mcp_calls)."""
        call = super()._create(model_class, *args, **kwargs)
        if call.run_count and is_mcp_tool(call.tool):
            AgentRun.objects.filter(pk=call.run_id).update(
                mcp_calls=F("mcp_calls") + call.run_count
            )
        return call


class ArtifactFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Artifact

    task = factory.SubFactory(TaskFactory)
    name = factory.Sequence(lambda n: f"report-{n}.md")
    path = factory.LazyAttribute(lambda a: f"tasks/{a.task.pk}/artifacts/{a.name}")
    size = 10
    sha256 = "0" * 64


class ApprovalFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = Approval

    tool_call = factory.SubFactory(ToolCallFactory)
    task = factory.SelfAttribute("tool_call.task")
    run = factory.SelfAttribute("tool_call.run")
    tool = factory.SelfAttribute("tool_call.tool")
    target = "https://example.com/"
    arguments = factory.SelfAttribute("tool_call.arguments")
    arguments_hash = factory.SelfAttribute("tool_call.arguments_hash")
    reason = "policy_ask"
    effect = "Sends an HTTP GET request to https://example.com/"


class ReviewDecisionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = ReviewDecision

    tool_call = factory.SubFactory(ToolCallFactory, status="unknown")
    task = factory.SelfAttribute("tool_call.task")


class MemoryEntryFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = MemoryEntry

    title = factory.Sequence(lambda n: f"Note {n}")
    body = "Reports are written in plain English."


class MemorySelectionFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = MemorySelection

    run = factory.SubFactory(AgentRunFactory)
    entry = factory.SubFactory(MemoryEntryFactory)
    position = factory.Sequence(lambda n: n)
    title = factory.SelfAttribute("entry.title")
    chars = 40


class EvalRunFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = EvalRun

    model = factory.SubFactory(ModelFactory)
    connection = factory.SelfAttribute("model.connection")
    connection_name = factory.SelfAttribute("connection.name")
    model_name = factory.SelfAttribute("model.name")
    suite_sha256 = "0" * 64
    status = EvalRunStatus.FINISHED
    started_by = "acthelm_eval"


class EvalResultFactory(factory.django.DjangoModelFactory):
    class Meta:
        model = EvalResult

    run = factory.SubFactory(EvalRunFactory)
    case_id = factory.Sequence(lambda n: f"case_{n}")
    task = factory.SubFactory(TaskFactory, status=TaskStatus.REVIEW, is_evaluation=True)
    task_number = factory.SelfAttribute("task.pk")
    outcome = EvalOutcome.PASSED
    final_state = TaskStatus.REVIEW
    model_turns = 3
    input_tokens = 30
    output_tokens = 15
    wall_seconds = 1.5
