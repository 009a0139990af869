"""The loop-internal tools: `update_plan` (required first) and `propose_task` (planning tasks).

They touch only the task's own saved state, which the agent loop persists; `run` renders the
result the model sees.
"""

from pydantic import Field

from .base import Tool, ToolArgs, ToolContext, ToolResult
from .recovery_class import RecoveryClass
from .registry import register


class PlanStep(ToolArgs):
    step: str = Field(min_length=1, max_length=500)
    status: str = Field(default="pending", pattern="^(pending|in_progress|done)$")


class UpdatePlanArgs(ToolArgs):
    steps: list[PlanStep] = Field(min_length=1, max_length=50)
    note: str = Field(default="", max_length=2000)


@register
class UpdatePlan(Tool[UpdatePlanArgs]):
    name = "update_plan"
    description = (
        "Record or revise your plan: an ordered list of steps with a status each. Call this "
        "first; every other tool answers plan_required until a plan exists."
    )
    effect = "Updates the task's plan"
    recovery_class = RecoveryClass.IDEMPOTENT
    internal = True
    Args = UpdatePlanArgs

    def target(self, args: UpdatePlanArgs) -> str:
        return "the task's plan"

    def run(self, args: UpdatePlanArgs, ctx: ToolContext) -> ToolResult:
        lines = [f"{i}. [{s.status}] {s.step}" for i, s in enumerate(args.steps, 1)]
        return ToolResult(
            text="Plan recorded:\n" + "\n".join(lines),
            data={"steps": [s.model_dump() for s in args.steps], "note": args.note},
        )


class ProposeTaskArgs(ToolArgs):
    title: str = Field(min_length=1, max_length=200)
    instruction: str = Field(min_length=1, max_length=20_000)
    depends_on_titles: list[str] = Field(default_factory=list, max_length=20)
    tools: list[str] | None = Field(
        default=None,
        max_length=50,
        description=(
            "The tools the follow-up needs, from your own tools (never propose_task). Omit to "
            "give it all of yours."
        ),
    )
    inherit_checks: bool = Field(
        default=False,
        description=(
            "Give the follow-up this task's and its goal's acceptance checks (default: none)."
        ),
    )


@register
class ProposeTask(Tool[ProposeTaskArgs]):
    name = "propose_task"
    description = (
        "Create a follow-up task for this goal. It runs after the tasks named in "
        "depends_on_titles (titles of tasks you proposed earlier in this run) are done. It "
        "gets at most your tools, your allowed domains and what remains of your limits; a task "
        "may propose only a limited number of follow-ups."
    )
    effect = "Creates a follow-up task: {target}"
    recovery_class = RecoveryClass.IDEMPOTENT
    internal = True
    Args = ProposeTaskArgs

    def target(self, args: ProposeTaskArgs) -> str:
        return args.title

    def run(self, args: ProposeTaskArgs, ctx: ToolContext) -> ToolResult:
        return ToolResult(text=f"Follow-up task proposed: {args.title}", data=args.model_dump())
