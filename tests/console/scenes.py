"""Database scenes for the console's tests: tasks with a transcript, pending approvals and
needs_review decisions, built with the factories (no worker involved)."""

from datetime import timedelta

from django.utils import timezone

from agents.catalogue.tools import get_tool, operation_hash
from agents.states import RecoveryClass, Role, RunStatus, ToolCallStatus
from approvals.states import ApprovalReason
from core.actors import ActorKind
from tasks.states import EventKind, TaskStatus
from tests.factories import (
    AgentRunFactory,
    ApprovalFactory,
    ArtifactFactory,
    ConversationFactory,
    MemoryEntryFactory,
    MemorySelectionFactory,
    ReviewDecisionFactory,
    TaskEventFactory,
    TaskFactory,
    ToolCallFactory,
    TurnFactory,
)

NOTES = (
    "2024-03-01 Kick-off with the supplier; delivery dates agreed for Q2.\n"
    "2024-03-08 Supplier reports a two-week delay on the housings.\n"
    "2024-03-15 Decision: move the launch from April 2 to April 16.\n"
)
FULL_RESULT = NOTES * 40
ANSWER = (
    "Summary of the project notes\n\n"
    "- The supplier delayed the housings by two weeks (2024-03-08).\n"
    "- The launch moved from April 2 to April 16 (decision of 2024-03-15).\n"
    "- The full summary is in the artifact summary.md."
)
PLAN = {
    "steps": [
        {"step": "List the input files", "status": "done"},
        {"step": "Read notes.txt and extract the decisions", "status": "done"},
        {"step": "Write summary.md", "status": "done"},
    ],
    "note": "Keep it short: the founder reads it on a phone.",
}

_RUN_END = {
    TaskStatus.REVIEW: RunStatus.SUCCEEDED,
    TaskStatus.DONE: RunStatus.SUCCEEDED,
    TaskStatus.FAILED: RunStatus.FAILED,
    TaskStatus.CANCELLED: RunStatus.CANCELLED,
    TaskStatus.PAUSED: RunStatus.SUCCEEDED,
    TaskStatus.AWAITING_APPROVAL: RunStatus.SUCCEEDED,
    TaskStatus.NEEDS_REVIEW: RunStatus.FAILED,
}


def event(task, kind, *, actor_kind=ActorKind.SYSTEM, label="system", frm="", to="", **data):
    return TaskEventFactory(
        task=task,
        kind=kind,
        actor_kind=actor_kind,
        actor_label=label,
        from_status=frm,
        to_status=to,
        data=data,
    )


def run_for(task, *, number=1, **kwargs):
    status = _RUN_END.get(task.status, RunStatus.STARTED)
    if status != RunStatus.STARTED:
        kwargs.setdefault("finished_at", timezone.now())
    return AgentRunFactory(task=task, number=number, claim_count=number, status=status, **kwargs)


def transcript_task(
    *,
    status=TaskStatus.REVIEW,
    extra_turns: int = 0,
    extra_events: int = 0,
    content: str | None = None,
    **task_kwargs,
):
    """A task after a run: plan, five turns (one discarded), tool calls (one compacted),
    memory, an artifact, a verdict and a timeline; plus `extra_turns` assistant turns with a
    tool call each and `extra_events` more events."""
    task_kwargs.setdefault("title", "Summarise the project notes")
    task_kwargs.setdefault(
        "instruction", "Read notes.txt and summarise the decisions in summary.md."
    )
    task_kwargs.setdefault(
        "tools", ["update_plan", "list_files", "read_file", "write_artifact", "fetch_url"]
    )
    task = TaskFactory(status=status, **task_kwargs)
    settled = status in (TaskStatus.REVIEW, TaskStatus.DONE)
    run = run_for(
        task,
        model_turns=4 + extra_turns,
        input_tokens=5200,
        output_tokens=830,
        active_seconds=42.5,
        answer=ANSWER if settled else "",
        verdict="approved" if settled else "",
        verdict_reason="The summary names both decisions and cites the notes." if settled else "",
    )
    ConversationFactory(task=task, plan=PLAN)
    index = iter(range(10_000))

    def turn(role, text, **kwargs):
        return TurnFactory(task=task, run=run, index=next(index), role=role, content=text, **kwargs)

    def call(on, tool, arguments, *, result="", for_model=None, **kwargs):
        kwargs.setdefault("status", ToolCallStatus.SUCCEEDED)
        kwargs.setdefault(
            "recovery_class",
            RecoveryClass.EXTERNAL if tool == "fetch_url" else RecoveryClass.READ_ONLY,
        )
        return ToolCallFactory(
            turn=on,
            tool=tool,
            arguments=arguments,
            arguments_hash=operation_hash(tool, get_tool(tool).parse(arguments)),
            result=result,
            result_for_model=result if for_model is None else for_model,
            run_count=1,
            **kwargs,
        )

    turn(Role.USER, task.instruction)
    first = turn(
        Role.ASSISTANT,
        content if content is not None else "I will plan first, then read the notes.",
        stop_reason="tool_use",
    )
    call(first, "update_plan", {"steps": PLAN["steps"]}, result="Plan recorded: 3 steps")
    second = turn(Role.ASSISTANT, "Reading the notes.", stop_reason="tool_use")
    call(
        second,
        "read_file",
        {"path": "notes.txt"},
        result=FULL_RESULT,
        for_model=NOTES + "[… truncated at the tool output limit]",
        compacted=True,
    )
    turn(
        Role.ASSISTANT,
        "Summary: the supplier dela",
        stop_reason="max_tokens",
        discarded=True,
    )
    for n in range(extra_turns):
        more = turn(Role.ASSISTANT, f"Checking detail {n}.", stop_reason="tool_use")
        call(more, "list_files", {"path": f"part-{n}"}, result=f"part-{n}/notes.txt")
    third = turn(Role.ASSISTANT, "Writing the summary.", stop_reason="tool_use")
    call(
        third,
        "write_artifact",
        {"name": "summary.md", "content": ANSWER},
        result="Wrote summary.md (212 bytes)",
        recovery_class=RecoveryClass.IDEMPOTENT,
    )
    if settled:
        turn(Role.ASSISTANT, ANSWER, stop_reason="end_turn")

    entry = MemoryEntryFactory(title="House style", body="Reports are short and in plain English.")
    MemorySelectionFactory(run=run, entry=entry, title=entry.title, position=0, chars=41)
    ArtifactFactory(task=task, run=run, name="summary.md", size=212, content_type="text/markdown")

    event(task, EventKind.CREATED, actor_kind=ActorKind.PERSON, label="founder", to="ready")
    event(
        task,
        EventKind.CLAIMED,
        actor_kind=ActorKind.WORKER,
        label="worker-1",
        frm="ready",
        to="in_progress",
        run_id=run.pk,
    )
    for n in range(extra_events):
        event(task, EventKind.TOOL_RESULT, actor_kind=ActorKind.WORKER, label="worker-1", n=n)
    if settled:
        event(
            task,
            EventKind.SUBMITTED,
            actor_kind=ActorKind.WORKER,
            label="worker-1",
            frm="in_progress",
            to="review",
        )
    return task


def pending_approval(*, url="https://example.org/report.csv", task=None, age_minutes=5, **kw):
    """A task awaiting approval of one fetch_url call, with the real operation hash."""
    title = kw.pop("title", "Fetch the quarterly report")
    task = task or TaskFactory(
        status=TaskStatus.AWAITING_APPROVAL,
        title=title,
        instruction="Fetch the report and summarise it.",
        tools=["update_plan", "fetch_url"],
    )
    run = task.runs.order_by("-number").first() or run_for(task)
    turn = TurnFactory(
        task=task,
        run=run,
        index=task.turns.count(),
        role=Role.ASSISTANT,
        content="I need the report.",
    )
    arguments = {"url": url}
    call = ToolCallFactory(
        turn=turn,
        tool="fetch_url",
        arguments=arguments,
        arguments_hash=operation_hash("fetch_url", get_tool("fetch_url").parse(arguments)),
        status=ToolCallStatus.AWAITING_APPROVAL,
        recovery_class=RecoveryClass.EXTERNAL,
    )
    approval = ApprovalFactory(
        tool_call=call,
        target=url,
        reason=kw.pop("reason", ApprovalReason.DOMAIN_NOT_ALLOWED),
        effect=f"Sends an HTTP GET request to {url}",
        **kw,
    )
    from approvals.models import Approval

    Approval.objects.filter(pk=approval.pk).update(
        created_at=timezone.now() - timedelta(minutes=age_minutes)
    )
    approval.refresh_from_db()
    return approval


def pending_review(*, url="https://example.org/data.json"):
    """A task in needs_review: one fetch_url call whose outcome is unknown."""
    task = TaskFactory(
        status=TaskStatus.NEEDS_REVIEW,
        title="Fetch the data feed",
        tools=["update_plan", "fetch_url"],
    )
    run = run_for(task)
    turn = TurnFactory(task=task, run=run, index=0, role=Role.ASSISTANT, content="Fetching.")
    arguments = {"url": url}
    call = ToolCallFactory(
        turn=turn,
        tool="fetch_url",
        arguments=arguments,
        arguments_hash=operation_hash("fetch_url", get_tool("fetch_url").parse(arguments)),
        status=ToolCallStatus.UNKNOWN,
        recovery_class=RecoveryClass.EXTERNAL,
    )
    return ReviewDecisionFactory(tool_call=call, task=task)
