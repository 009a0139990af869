"""The recorder: every write a worker makes for a run, each batch in ONE fenced transaction.

The agent loop decides in memory and collects what a step produced in a `Step` (turns, tool calls
in their decided states with their approvals, results, artifacts, the plan, follow-up proposals,
compaction, events, usage, the answer). `Recorder.commit` writes all of it in one transaction
that starts with the one-statement fence (`agents.engine.store.fence`) and ends with the checkpoint
on the run row — and, at the end of a run, with the outcome
(`agents.engine.verdict.outcomes.handle`). A run that lost its task writes nothing. Neither the loop
nor the recorder runs SQL: every statement of a run is the store's (`agents.engine.store`), which
writes the step the recorder hands it. Approvals and needs_review decisions are written by their
app's one writer (`approvals.services`), called here inside the fenced transaction.

Commits per step: one. An external call (recovery class `external`) is recorded "running" before
the request leaves, so that a crash leads to needs_review — with the turn that asked for it when
it is that turn's first call — and its result commits as soon as it returns: two; a follow-up
proposal commits at once, because its result (the new task's id) goes to the model.
"""

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from django.contrib.postgres.fields import ArrayField
from django.db import InterfaceError, OperationalError, transaction
from django.db import connection as db
from django.db.models import (
    Exists,
    Func,
    OuterRef,
    Prefetch,
    QuerySet,
    Subquery,
    Sum,
    TextField,
    Value,
)
from django.db.models.functions import Cast, Coalesce
from django.utils import timezone

from agents.catalogue.tools.plan import ProposeTaskArgs
from agents.engine import store
from agents.engine.run.intake import propose_follow_up
from agents.engine.run.usage import KINDS, Usage
from agents.engine.store import (
    CallState,
    Checkpoint,
    Event,
    NewCall,
    NewTurn,
    Result,
    Step,
    StepPlan,
    TurnState,
)
from agents.engine.verdict.outcomes import Outcome, handle, handoff
from agents.engine.verdict.supervisor import SupervisorVerdict
from agents.models import AgentRun, Artifact, CompactionDecision, Conversation, ToolCall, Turn
from agents.states import ToolCallStatus
from approvals.models import Approval, ReviewDecision
from approvals.services import open_review_row, request_approvals
from approvals.states import ApprovalStatus, ReviewChoice
from core import fastsql
from core.actors import Actor
from core.exceptions import AttemptLost
from memory import services as memory_services
from tasks.models import Task, TaskEvent
from tasks.states import EventKind
from tasks.transitions import log_move, record_events

# The values of a step are the store's (agents.engine.store.values); the loop and the prompt
# take them from here, with the recorder that writes them.
__all__ = [
    "CallState",
    "Checkpoint",
    "Event",
    "NewCall",
    "NewTurn",
    "Recorder",
    "Result",
    "SavedState",
    "Step",
    "TurnState",
    "load_starts",
    "load_state",
]

log = logging.getLogger("acthelm.loop")


@dataclass
class SavedState:
    """What a run resumes from, read once when it starts."""

    task: Task
    claim_count: int
    connection_id: int | None
    conversation: Conversation | None
    turns: list[TurnState]  # of the current conversation (from `Conversation.first_turn` on)
    next_index: int
    approvals: dict[int, str]  # approved call -> the hash a person approved
    run_again: set[int]  # calls a person chose to run again
    usage: Usage
    memory_from_run: int | None  # the earlier run whose memory selection this run repeats
    memory_to_rank: bool  # an active memory entry exists: a first run ranks them


_FLOAT = tuple(name for name, kind in KINDS.items() if kind is float)
_EXACT = tuple(name for name in KINDS if name not in _FLOAT)


def _task_with_run(task: int, run: int) -> QuerySet[Task]:
    """The task with its connection, model and conversation, and what `load_state` reads besides:
    the run's claim and connection, whether the task has turns, whether any memory entry is
    active (else a first run need not rank them), and the usage of every run — one statement
    (`fastsql.Select`: compiled once)."""
    return _loaded(
        Task.objects.filter(pk=task), AgentRun.objects.filter(pk=run, task_id=OuterRef("pk"))
    )


def _tasks_with_runs(tasks: int | Sequence[int], runs: int | Sequence[int]) -> QuerySet[Task]:
    """`_task_with_run` for several tasks and their runs, in one statement: each task with the
    run among `runs` that is its own. The ids are bound as arrays (`fastsql.id_list`): compiled
    once for any number of them (`_LOAD_STARTS`)."""
    return _loaded(
        Task.objects.filter(pk__in=fastsql.id_list(tasks)),
        AgentRun.objects.filter(pk__in=fastsql.id_list(runs), task_id=OuterRef("pk")),
    )


def _loaded(tasks: QuerySet[Task], this_run: QuerySet[AgentRun]) -> QuerySet[Task]:
    runs = AgentRun.objects.filter(task_id=OuterRef("pk")).order_by().values("task_id")

    def total(name: str) -> Coalesce:
        return Coalesce(Sum(name), Value(KINDS[name](0)))

    # The integer and numeric sums in one subquery, as text (exact for both); a float8 sum in
    # one of its own (its text form would depend on extra_float_digits).
    totals = Func(
        *(Cast(total(name), TextField()) for name in _EXACT),
        template="ARRAY[%(expressions)s]",
        output_field=ArrayField(TextField()),
    )
    sums = {
        "usage": Subquery(runs.annotate(totals=totals).values("totals")),
        **{f"usage_{name}": Subquery(runs.annotate(t=total(name)).values("t")) for name in _FLOAT},
    }
    return (
        tasks.select_related("connection", "model", "conversation")
        .order_by()
        .annotate(
            run_claim_count=Subquery(this_run.values("claim_count")),
            run_connection_id=Subquery(this_run.values("connection_id")),
            has_turns=Exists(Turn.objects.filter(task_id=OuterRef("pk"))),
            has_memory=memory_services.any_active(),
            **sums,
        )
    )


_LOAD = fastsql.Select(_task_with_run, "task", "run")
_LOAD_STARTS = fastsql.Select(_tasks_with_runs, "tasks", "runs")
_LOADED = (
    "run_claim_count",
    "run_connection_id",
    "has_turns",
    "has_memory",
    "usage",
    *(f"usage_{name}" for name in _FLOAT),
)


def load_state(task_id: int, run_id: int) -> SavedState:
    """The task's saved state: the conversation, every turn with its calls, what people decided
    for calls they let run, and the usage of earlier runs. AttemptLost when it is gone.

    One statement for a task that has no turns yet (`_task_with_run`); the turns with their
    calls, the approvals and the earlier memory selection only when there are some."""
    found = _LOAD.rows(task=task_id, run=run_id)
    task = found[0] if found else None
    if task is None or task.run_claim_count is None:  # type: ignore[attr-defined]
        raise AttemptLost(f"task {task_id} or run {run_id} no longer exists")
    return _saved(task, run_id)


def load_starts(pairs: Sequence[tuple[int, int]]) -> dict[int, SavedState]:
    """`load_state` for the (task, run) pairs of a claim that start afresh (no turns, no
    conversation yet), in ONE statement for them all: a fleet's starts read one statement a
    claim, not one a task. A task with turns, or gone since the claim, is left out: its run
    reads its state itself (`load_state`: the turns, or AttemptLost)."""
    if not pairs:
        return {}
    run_of = dict(pairs)
    return {
        task.pk: _saved(task, run_of[task.pk])
        for task in _LOAD_STARTS.rows(tasks=list(run_of), runs=list(run_of.values()))
        if task.run_claim_count is not None  # type: ignore[attr-defined]
        and not task.has_turns  # type: ignore[attr-defined]
        and getattr(task, "conversation", None) is None
    }


def _saved(task: Task, run_id: int) -> SavedState:
    """The rest of `load_state` once the task's row with its annotations is read."""
    task_id = task.pk
    loaded = {name: task.__dict__.pop(name) for name in _LOADED}
    totals = loaded["usage"] or ["0"] * len(_EXACT)  # no run at all: nothing used
    usage = Usage(
        **{name: KINDS[name](v) for name, v in zip(_EXACT, totals, strict=True)},
        **{name: KINDS[name](loaded[f"usage_{name}"] or 0) for name in _FLOAT},
    )
    conversation: Conversation | None = getattr(task, "conversation", None)
    rows = []
    # Turns of a conversation a person started over stay on record and are not sent again.
    first_turn = conversation.first_turn if conversation is not None else 0
    if loaded["has_turns"]:
        rows = list(
            Turn.objects.filter(task_id=task_id, index__gte=first_turn)
            .order_by("index")
            .prefetch_related(
                Prefetch(
                    "tool_calls", queryset=ToolCall.objects.defer("result").order_by("position")
                )
            )
        )
    turns = [
        TurnState(
            t.role, t.content, t.discarded, [CallState.from_row(c) for c in t.tool_calls.all()]
        )
        for t in rows
    ]
    approved = [c.pk for t in turns for c in t.calls if c.status == ToolCallStatus.APPROVED]
    approvals: dict[int, str] = {}
    run_again: set[int] = set()
    if approved:
        # A person who edited the arguments let the edit run: its hash is the one bound.
        approvals = {
            call_id: edited or proposed
            for call_id, proposed, edited in Approval.objects.filter(
                tool_call_id__in=approved, status=ApprovalStatus.APPROVED
            ).values_list("tool_call_id", "arguments_hash", "edited_arguments_hash")
        }
        run_again = set(
            ReviewDecision.objects.filter(
                tool_call_id__in=approved, choice=ReviewChoice.RUN_AGAIN
            ).values_list("tool_call_id", flat=True)
        )
    memory_from_run = None
    if conversation is not None:
        memory_from_run = (
            AgentRun.objects.filter(task_id=task_id, memory__isnull=False)
            .exclude(pk=run_id)
            .order_by("number")
            .values_list("id", flat=True)
            .first()
        )
    return SavedState(
        task=task,
        claim_count=loaded["run_claim_count"],
        connection_id=loaded["run_connection_id"] or task.connection_id,
        conversation=conversation,
        turns=turns,
        next_index=rows[-1].index + 1 if rows else first_turn,
        approvals=approvals,
        run_again=run_again,
        usage=usage,
        memory_from_run=memory_from_run,
        memory_to_rank=loaded["has_memory"],
    )


class Recorder:
    """Writes a run's steps. `checkpoint` is called inside each transaction, after the step's
    rows exist, for what remains of each limit and which operations are pending."""

    def __init__(
        self,
        *,
        task_id: int,
        run_id: int,
        actor: Actor,
        connection_id: int | None = None,
        task: Task | None = None,
    ) -> None:
        self.task_id = task_id
        self.run_id = run_id
        self.actor = actor
        self.run = AgentRun(pk=run_id, task_id=task_id, connection_id=connection_id)
        self.task = task  # as the run read it: what a hand-off is decided from

    def status(self) -> str:
        """The task's status, through the fence (one statement; AttemptLost when lost)."""
        return store.renew_lease(task_id=self.task_id, run_id=self.run_id)

    def commit(
        self,
        step: Step,
        *,
        checkpoint: Checkpoint,
        outcome: Outcome | None = None,
        verdict: SupervisorVerdict | None = None,
    ) -> str:
        """Write `step` (and the run's `outcome`, if given) in one fenced transaction. Returns
        the task's status. A connection that died while the model or a tool ran (nothing was
        written yet) is reopened once; AttemptLost when the run no longer holds its task."""
        try:
            return self._commit(step, checkpoint, outcome, verdict)
        except (OperationalError, InterfaceError):
            if db.in_atomic_block:
                raise
            log.warning("loop.reconnect", extra={"task_id": self.task_id})
            db.close()
            return self._commit(step, checkpoint, outcome, verdict)

    def _commit(
        self,
        step: Step,
        checkpoint: Checkpoint,
        outcome: Outcome | None,
        verdict: SupervisorVerdict | None,
    ) -> str:
        if not db.in_atomic_block:
            # The common step: one statement, autocommitted (agents.engine.store.statement), with
            # the run's end when it is a hand-off (`outcomes.handoff`). Inside a caller's
            # transaction the fenced savepoint below keeps that transaction usable.
            planned = store.plan_step(step, self.actor)
            if planned is not None:
                written = self._statement(planned, step, checkpoint, outcome, verdict)
                if written is not None:
                    return written
        with transaction.atomic():
            held = store.fence(self.run_id, self.task_id, full=outcome is not None)
            self._write(step, held.task, checkpoint)
            status = held.status
            if outcome is not None:
                task = held.task
                assert task is not None  # the full fence returns the task's row
                if step.clear_feedback:
                    task.feedback = ""
                status = handle(
                    task,
                    self.run,
                    actor=self.actor,
                    outcome=outcome,
                    verdict=verdict,
                    now=held.now,
                )
        return status

    def _statement(
        self,
        planned: StepPlan,
        step: Step,
        checkpoint: Checkpoint,
        outcome: Outcome | None,
        verdict: SupervisorVerdict | None,
    ) -> str | None:
        """The step as one statement, with the run's end when that is a hand-off; None when the
        end is not one, or the statement declined it (nothing written)."""
        given = None
        if outcome is not None:
            if self.task is None:
                return None
            given = handoff(
                self.task,
                self.run,
                actor=self.actor,
                outcome=outcome,
                verdict=verdict,
                now=timezone.now(),
            )
            if given is None:
                return None
        status = store.write_step(
            planned,
            step,
            task_id=self.task_id,
            run_id=self.run_id,
            actor=self.actor,
            checkpoint=checkpoint,
            handoff=given,
        )
        if status is not None and given is not None:
            kind = given.event["kind"]
            log_move(self.task_id, kind, current=given.from_status, to=status, actor=self.actor)
        return status

    # -- the writes, in the order their foreign keys need -----------------------------------------

    def _write(self, step: Step, task: Task | None, checkpoint: Checkpoint) -> None:
        now = timezone.now()
        if step.memory_chosen:
            memory_services.record_selection(self.run, step.memory_chosen)
        elif step.memory_from_run is not None:
            memory_services.copy_selection(from_run_id=step.memory_from_run, to_run=self.run)
        if step.system_prompt is not None:
            # Once a task, or again for the conversation a person started over.
            store.write_conversation(
                self.task_id, step.system_prompt, step.tool_pins, now, restart=step.restart
            )
        elif step.tool_pins is not None:
            Conversation.objects.filter(task_id=self.task_id).update(tool_pins=step.tool_pins)
        self._insert_turns(step.turns, now)
        proposed = [self._propose(task, call, args) for call, args in step.proposals]
        self._move_calls([*step.results, *proposed], now)
        events = [*step.events]
        for result in proposed:  # its event says how it went, which is known only now
            error = result.error_code or None
            events.append(
                Event(
                    EventKind.TOOL_RESULT,
                    {"tool": result.call.tool, "ok": not error, "error": error},
                    result.call,
                )
            )
        if step.artifacts:
            Artifact.objects.bulk_create(
                [
                    Artifact(
                        task_id=self.task_id,
                        run_id=self.run_id,
                        tool_call_id=call.pk,
                        name=a.name,
                        path=str(a.path),
                        size=a.size,
                        sha256=a.sha256,
                        content_type=a.content_type,
                    )
                    for call, a in step.artifacts
                ],
                update_conflicts=True,
                unique_fields=["task", "name"],
                update_fields=["run", "tool_call", "path", "size", "sha256", "content_type"],
            )
        if step.plan is not None:
            Conversation.objects.filter(task_id=self.task_id).update(
                plan=step.plan, plan_updated_at=now
            )
        if step.compaction is not None:
            chosen, before, after = step.compaction
            ids = [c.pk for c in chosen if c.pk is not None]
            ToolCall.objects.filter(pk__in=ids).update(compacted=True)
            decision = CompactionDecision.objects.create(
                task_id=self.task_id,
                run_id=self.run_id,
                estimated_tokens_before=before,
                estimated_tokens_after=after,
            )
            decision.tool_calls.set(ids)
        if step.clear_feedback:
            Task.objects.filter(pk=self.task_id).update(feedback="")
        record_events(
            [
                TaskEvent(
                    task_id=self.task_id,
                    run_id=self.run_id,
                    kind=e.kind,
                    actor_kind=self.actor.kind,
                    actor_label=self.actor.label,
                    data={**e.data, "tool_call_id": e.call.pk} if e.call else e.data,
                )
                for e in events
            ]
        )
        # The step's usage in the statement that writes the checkpoint; its MCP starts commit
        # with the calls' raised run_count (both in this transaction).
        store.write_run_row(self.run_id, step.usage, checkpoint(), step.answer, now)

    def _insert_turns(self, turns: list[NewTurn], now: datetime) -> None:
        calls = store.insert_turns(self.task_id, self.run_id, turns, now)
        request_approvals(
            task_id=self.task_id,
            run_id=self.run_id,
            requests=[(c.state.saved_pk, c.approval) for c in calls if c.approval],
        )

    def _move_calls(self, results: list[Result], now: datetime) -> None:
        if not results:
            return
        store.set_calls_status(self.run_id, results, now)
        request_approvals(
            task_id=self.task_id,
            run_id=self.run_id,
            requests=[(r.call.saved_pk, r.approval) for r in results if r.approval],
        )
        for r in results:
            if r.unknown:
                open_review_row(task_id=self.task_id, tool_call_id=r.call.saved_pk)

    def _propose(self, task: Task | None, call: CallState, args: ProposeTaskArgs) -> Result:
        """propose_task: a linked follow-up task, created in this transaction."""

        parent = task or Task.objects.get(pk=self.task_id)
        text, error = propose_follow_up(actor=self.actor, parent=parent, proposal=args)
        call.result_for_model, call.error_code = text, error
        call.status = ToolCallStatus.FAILED if error else ToolCallStatus.SUCCEEDED
        return Result(
            call, call.status, result=text, result_for_model=text, error_code=error, runs=1
        )
