"""Connections to model providers, models, runs and the task's saved conversation."""

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import JSONField, Q, Value

from agents.catalogue.connection_rules import connection_kind_choices, validate_connection
from agents.catalogue.tools.recovery_class import CHOICES as RECOVERY_CHOICES
from agents.states import (
    ConnectionKind,
    ConnectionTestPhase,
    CostTier,
    ModelTestStatus,
    Role,
    RunStatus,
    ToolCallStatus,
    ToolServerTransport,
    Verdict,
)
from core.exceptions import InvalidInput


class Connection(models.Model):
    """Where a model is served. The credential is the *name* of an environment variable."""

    name = models.SlugField(max_length=100, unique=True)
    kind = models.CharField(max_length=32, choices=connection_kind_choices)
    base_url = models.URLField(max_length=500, blank=True)
    # For kind=cli: the argument list (no shell). The prompt arrives on stdin.
    command = models.JSONField(default=list, blank=True)
    # For kind=cli: a dotted path into JSON output ("result"); empty means plain text.
    answer_field = models.CharField(max_length=200, blank=True)
    credential_env = models.CharField(
        max_length=100,
        blank=True,
        help_text="Name of the environment variable holding the API key (never the key itself).",
    )
    cost_tier = models.CharField(max_length=16, choices=CostTier.choices, default=CostTier.PAID)
    priority = models.IntegerField(default=0, help_text="Fallback order: higher is tried first.")
    timeout_seconds = models.FloatField(default=120)
    enabled = models.BooleanField(default=True)

    cooldown_until = models.DateTimeField(null=True, blank=True, editable=False)
    last_error_code = models.CharField(max_length=64, blank=True, editable=False)
    last_error_message = models.TextField(blank=True, editable=False)
    last_error_at = models.DateTimeField(null=True, blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-priority", "name"]
        permissions = [("manage_connections", "Can add and test connections")]
        constraints = [
            models.CheckConstraint(
                condition=~Q(kind=ConnectionKind.CLI) | ~Q(command=[]),
                name="connection_cli_has_command",
            ),
        ]

    def __str__(self) -> str:
        return self.name

    def clean(self) -> None:
        """The services' validator, so that the admin refuses what the console and CLI refuse.
        No person here: the admin's form checks the one who saves (`executable_refusal_for`)."""
        try:
            validate_connection(
                actor=None,
                kind=self.kind,
                base_url=self.base_url,
                command=self.command,
                credential_env=self.credential_env,
                cost_tier=self.cost_tier,
                priority=self.priority,
                timeout_seconds=self.timeout_seconds,
            )
        except InvalidInput as exc:
            field = {
                "credential_not_allowed": "credential_env",
                "credential_destination_not_allowed": "credential_env",
                "executable_not_allowed": "command",
                "invalid_input": None,
                "number_out_of_range": None,
            }.get(exc.code)
            raise ValidationError({field: exc.message} if field else exc.message) from None


class Model(models.Model):
    # Indexed by model_unique_per_conn (connection, name).
    connection = models.ForeignKey(
        Connection, on_delete=models.CASCADE, related_name="models", db_index=False
    )
    name = models.CharField(max_length=200)
    context_window = models.PositiveIntegerField(
        null=True, blank=True, help_text="Tokens; empty when unknown."
    )
    supports_tools = models.BooleanField(default=True)
    test_status = models.CharField(
        max_length=16, choices=ModelTestStatus.choices, default=ModelTestStatus.UNTESTED
    )
    tested_at = models.DateTimeField(null=True, blank=True)
    test_message = models.TextField(blank=True)
    # What the test found of streamed answers: True, the server streams them; False, it answered
    # a streamed request whole or refused it (the worker asks it for whole answers); None, not
    # tested (or the test could not tell), and the worker asks for a stream, falling back.
    streams = models.BooleanField(
        null=True,
        blank=True,
        help_text="Whether the server streams its answers, by the last test; empty: unknown.",
    )
    # A person's explicit word that the model may call tools although the probe saw no call.
    tools_override_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
    )
    tools_override_at = models.DateTimeField(null=True, blank=True)
    price_input_per_mtok = models.DecimalField(
        max_digits=10, decimal_places=4, null=True, blank=True
    )
    price_output_per_mtok = models.DecimalField(
        max_digits=10, decimal_places=4, null=True, blank=True
    )
    # Cached input (a cache hit) and cache writes have their own prices; empty = the input price.
    price_cached_input_per_mtok = models.DecimalField(
        max_digits=10, decimal_places=4, null=True, blank=True
    )
    price_cache_write_per_mtok = models.DecimalField(
        max_digits=10, decimal_places=4, null=True, blank=True
    )
    prices_source = models.CharField(
        max_length=100, blank=True, help_text="Who set the prices: a person, or the price table."
    )

    class Meta:
        ordering = ["connection__name", "name"]
        constraints = [
            models.UniqueConstraint(fields=["connection", "name"], name="model_unique_per_conn"),
        ]

    def __str__(self) -> str:
        return f"{self.connection.name}/{self.name}"


class AgentRun(models.Model):
    """One run of a task: created by a claim, ended by the worker, recovery or a person. A run
    that fails is a failed attempt (ACTHELM_MAX_ATTEMPTS counts them); one that stops for a
    pause, an approval or a hand-back is not, and the next run goes on with the attempt."""

    # No index of its own: run_number_unique's (task, number) serves every lookup by task.
    task = models.ForeignKey(
        "tasks.Task", on_delete=models.CASCADE, related_name="runs", db_index=False
    )
    number = models.PositiveIntegerField(help_text="1, 2, 3… per task")
    # The task's claim counter when this run claimed it: the fencing token.
    claim_count = models.PositiveIntegerField()
    claim_event = models.ForeignKey(
        "tasks.TaskEvent", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    status = models.CharField(
        max_length=16, choices=RunStatus.choices, default=RunStatus.STARTED, editable=False
    )
    connection = models.ForeignKey(
        Connection, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    model = models.ForeignKey(
        Model, null=True, blank=True, on_delete=models.SET_NULL, related_name="runs"
    )
    worker_id = models.CharField(max_length=200)
    started_at = models.DateTimeField(auto_now_add=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    model_turns = models.PositiveIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    output_tokens = models.PositiveBigIntegerField(default=0)
    network_requests = models.PositiveIntegerField(default=0)
    active_seconds = models.FloatField(default=0)
    # Starts of MCP tools, raised in the transaction that raises the call's run_count (a crash
    # cannot lose one); and the sum of the run's known turn costs in US dollars.
    mcp_calls = models.PositiveIntegerField(default=0)
    cost = models.DecimalField(max_digits=16, decimal_places=8, default=0)

    # What remains of each limit and which operations are pending, after every round.
    checkpoint = models.JSONField(default=dict, blank=True)
    # The model's final answer, stored the moment the model call returns.
    answer = models.TextField(blank=True)
    answer_stored_at = models.DateTimeField(null=True, blank=True)

    verdict = models.CharField(max_length=16, choices=Verdict.choices, blank=True)
    verdict_reason = models.TextField(blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)

    class Meta:
        ordering = ["task_id", "number"]
        # No index on heartbeat_at, which every heartbeat rewrites (keeps those updates HOT).
        constraints = [
            models.UniqueConstraint(fields=["task", "number"], name="run_number_unique"),
            models.UniqueConstraint(fields=["task", "claim_count"], name="run_claim_unique"),
            models.UniqueConstraint(
                fields=["task"],
                condition=Q(status=RunStatus.STARTED),
                name="run_one_started_per_task",
            ),
            models.CheckConstraint(
                condition=Q(status=RunStatus.STARTED) | Q(finished_at__isnull=False),
                name="run_finished_has_time",
            ),
        ]

    def __str__(self) -> str:
        return f"run {self.number} of task {self.task_id}"


class Conversation(models.Model):
    """The saved state of a task's conversation that every run resumes from."""

    task = models.OneToOneField("tasks.Task", on_delete=models.CASCADE, related_name="conversation")
    # Built once and stored: every request of the task sends this identical prefix.
    system_prompt = models.TextField()
    system_prompt_sha256 = models.CharField(max_length=64)
    # MCP tools as the task first saw them (SERVER__TOOL -> name, description, input schema,
    # annotations): a re-test of the server mid-task does not change what the model reads.
    tool_pins = models.JSONField(default=dict, blank=True)
    plan = models.JSONField(null=True, blank=True)
    plan_updated_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)
    # A person who changed the task may start it over (`agents.actions.task`): the turns
    # before `first_turn` stay on record but are never sent again, and the next run builds a
    # new system prompt. `earlier` keeps each earlier conversation's prompt, pins and plan, with
    # the turns it spanned. Database defaults: the step function inserts this row by name.
    first_turn = models.PositiveIntegerField(default=0, db_default=0)
    earlier = models.JSONField(default=list, blank=True, db_default=Value([], JSONField()))

    def __str__(self) -> str:
        return f"conversation of task {self.task_id}"


class Turn(models.Model):
    """One message of the conversation: the task's instruction, a model turn, or tool results."""

    # No index of its own: turn_index_unique's (task, index) serves every lookup by task, and
    # each index less is one insert less in every step (the step function writes a turn).
    task = models.ForeignKey(
        "tasks.Task", on_delete=models.CASCADE, related_name="turns", db_index=False
    )
    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="turns")
    index = models.PositiveIntegerField()
    role = models.CharField(max_length=16, choices=Role.choices)
    # Visible text only; hidden reasoning is never requested or stored.
    content = models.TextField(blank=True)
    stop_reason = models.CharField(max_length=32, blank=True)
    # A truncated or declined model turn: kept for the record, never sent again, calls not run.
    discarded = models.BooleanField(default=False)
    # input_tokens counts every input token, cached ones included; these say how many of them
    # were read from the provider's cache or written to it (priced differently).
    input_tokens = models.PositiveIntegerField(default=0)
    cached_input_tokens = models.PositiveIntegerField(default=0)
    cache_write_tokens = models.PositiveIntegerField(default=0)
    output_tokens = models.PositiveIntegerField(default=0)
    # In US dollars: the provider's reported cost, else tokens x the model's prices; empty when
    # neither is known.
    cost = models.DecimalField(max_digits=14, decimal_places=8, null=True, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["task_id", "index"]
        constraints = [
            models.UniqueConstraint(fields=["task", "index"], name="turn_index_unique"),
        ]

    def __str__(self) -> str:
        return f"turn {self.index} ({self.role}) of task {self.task_id}"


class ToolCall(models.Model):
    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="tool_calls")
    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="tool_calls")
    # No index of its own: toolcall_position_unique's (turn, position) serves lookups by turn.
    turn = models.ForeignKey(
        Turn, on_delete=models.CASCADE, related_name="tool_calls", db_index=False
    )
    position = models.PositiveIntegerField()
    call_id = models.CharField(max_length=200)
    tool = models.CharField(max_length=100)
    arguments = models.JSONField(null=True, blank=True)
    arguments_raw = models.TextField(blank=True)
    arguments_hash = models.CharField(max_length=64, blank=True)
    recovery_class = models.CharField(max_length=16, choices=RECOVERY_CHOICES)
    status = models.CharField(
        max_length=20, choices=ToolCallStatus.choices, default=ToolCallStatus.PENDING
    )
    result = models.TextField(blank=True)
    result_for_model = models.TextField(blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    # Replaced by a placeholder in requests once the conversation outgrew the context window.
    compacted = models.BooleanField(default=False)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    run_count = models.PositiveIntegerField(default=0, help_text="How often it was executed.")

    class Meta:
        ordering = ["task_id", "turn__index", "position"]
        constraints = [
            models.UniqueConstraint(fields=["turn", "position"], name="toolcall_position_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.tool} call {self.pk} ({self.status})"


class CompactionDecision(models.Model):
    """A stored decision to send placeholders for the oldest tool results from now on."""

    task = models.ForeignKey("tasks.Task", on_delete=models.CASCADE, related_name="compactions")
    run = models.ForeignKey(AgentRun, on_delete=models.CASCADE, related_name="+")
    tool_calls = models.ManyToManyField(ToolCall, related_name="+")
    estimated_tokens_before = models.PositiveIntegerField()
    estimated_tokens_after = models.PositiveIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return f"compaction {self.pk} of task {self.task_id}"


class Artifact(models.Model):
    # Indexed by artifact_name_unique (task, name).
    task = models.ForeignKey(
        "tasks.Task", on_delete=models.CASCADE, related_name="artifacts", db_index=False
    )
    run = models.ForeignKey(AgentRun, null=True, on_delete=models.SET_NULL, related_name="+")
    tool_call = models.ForeignKey(ToolCall, null=True, on_delete=models.SET_NULL, related_name="+")
    name = models.CharField(max_length=100)
    path = models.CharField(max_length=500)
    size = models.PositiveIntegerField()
    sha256 = models.CharField(max_length=64)
    content_type = models.CharField(max_length=100, default="text/plain")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["task_id", "name"]
        constraints = [
            models.UniqueConstraint(fields=["task", "name"], name="artifact_name_unique"),
        ]

    def __str__(self) -> str:
        return self.name


class ToolServer(models.Model):
    """An MCP server whose tools tasks may use as ``SERVER__TOOL``; registered by a person.

    The credential is the *name* of an environment variable, read when a call starts: passed
    to a stdio server in its environment under that name, sent to an HTTP server as a bearer
    token. ``tools`` is what the server listed at its last successful test.
    """

    name = models.CharField(
        max_length=30,
        unique=True,
        help_text="Lower-case letters, digits and single underscores; tools are SERVER__TOOL.",
    )
    transport = models.CharField(max_length=8, choices=ToolServerTransport.choices)
    # For stdio: the argument list (no shell), executable first.
    command = models.JSONField(default=list, blank=True)
    url = models.URLField(max_length=500, blank=True, help_text="Streamable-HTTP endpoint.")
    credential_env = models.CharField(
        max_length=100,
        blank=True,
        help_text="Name of the environment variable holding the credential (never the value).",
    )
    trusted = models.BooleanField(
        default=False,
        help_text="Rely on the server's readOnlyHint / idempotentHint annotations. "
        "Untrusted: every tool asks a person first and is never replayed after a crash.",
    )
    timeout_seconds = models.FloatField(default=60)
    tools = models.JSONField(default=list, blank=True, editable=False)
    test_status = models.CharField(
        max_length=16,
        choices=ModelTestStatus.choices,
        default=ModelTestStatus.UNTESTED,
        editable=False,
    )
    tested_at = models.DateTimeField(null=True, blank=True, editable=False)
    test_message = models.TextField(blank=True, editable=False)
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Who registered the server and who last changed what it runs or reaches
    # (agents.catalogue.toolservers).
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
    )
    changed_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        editable=False,
    )
    changed_at = models.DateTimeField(null=True, blank=True, editable=False)

    class Meta:
        ordering = ["name"]
        permissions = [("manage_toolservers", "Can add, test and remove MCP tool servers")]
        constraints = [
            models.CheckConstraint(
                condition=Q(name__regex=r"^[a-z][a-z0-9]*(_[a-z0-9]+)*$"),
                name="toolserver_name_safe",
            ),
            models.CheckConstraint(
                condition=(Q(transport=ToolServerTransport.STDIO) & ~Q(command=[]))
                | (Q(transport=ToolServerTransport.HTTP) & ~Q(url="")),
                name="toolserver_has_target",
            ),
        ]

    def __str__(self) -> str:
        return self.name


class WorkerSeen(models.Model):
    """When each worker process was last seen: upserted from its maintenance loop
    (`agents.engine.runtime.seen.record_seen`), so the Workers page lists idle workers too, not only
    those
    that
    hold a lease."""

    worker_id = models.CharField(max_length=200, unique=True)
    host = models.CharField(max_length=200, blank=True)
    pid = models.PositiveIntegerField(null=True, blank=True)
    started = models.DateTimeField()
    last_seen = models.DateTimeField()

    class Meta:
        verbose_name = "worker seen"
        verbose_name_plural = "workers seen"

    def __str__(self) -> str:
        return self.worker_id


class ConnectionTest(models.Model):
    """A connection's test started from the console, run in the background: the row the page
    polls for its progress, and the guard against a second test of the same connection while
    one runs. Written only by `agents.catalogue.connection_tests`."""

    connection = models.ForeignKey(Connection, on_delete=models.CASCADE, related_name="tests")
    requested_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    phase = models.CharField(
        max_length=16, choices=ConnectionTestPhase.choices, default=ConnectionTestPhase.CONNECTING
    )
    model_name = models.CharField(max_length=200, blank=True)  # the model being asked
    started_at = models.DateTimeField(auto_now_add=True)
    phase_at = models.DateTimeField()  # when the phase began: the page counts the wait from it
    deadline_at = models.DateTimeField()  # past it, an unfinished test counts as timed out
    finished_at = models.DateTimeField(null=True, blank=True)
    # `connection_test`'s results, one per model; or why the test could not run.
    results = models.JSONField(default=list, blank=True)
    message = models.TextField(blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["connection"],
                condition=Q(finished_at__isnull=True),
                name="connection_test_one_running",
            ),
            models.CheckConstraint(
                condition=Q(finished_at__isnull=True)
                | Q(
                    phase__in=[
                        ConnectionTestPhase.FINISHED,
                        ConnectionTestPhase.FAILED,
                        ConnectionTestPhase.TIMED_OUT,
                    ]
                ),
                name="connection_test_finished_has_an_end_phase",
            ),
        ]

    def __str__(self) -> str:
        return f"test of {self.connection_id} ({self.phase})"


# The evaluation suite's records live in their own module; importing them registers them here.
from agents.eval.models import EvalResult, EvalRun  # noqa: E402, F401
