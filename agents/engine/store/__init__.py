"""The run's store: the one door to a run's storage, and the only place in the engine that runs
SQL for a run (tests/agents/test_store_boundary.py keeps it so).

- the claim (`claim`): ready tasks become held ones, each with its run and claim event, in one
  statement, the function `acthelm_claim`;
- the fence and the lease (`fence`): every write of a run proves it still holds its task; the
  heartbeat renews the leases of a process; which held tasks lost their worker (what recovery
  ends);
- the step: as one statement (`statement`, the function `acthelm_step`), else its rows in the
  fenced transaction (`writes`); a step is the values of `values` (`Step`, `Result`, ...),
  built into rows once for both paths;
- the run's end and the calls' moves (`runs`: the only writer of a run's and a call's status);
- what a task used over its runs (`usage`: the `Usage` value and its sum);
- the database functions' templates (`sql/*.sql`) and their rendering (`functions`).

The store takes values and imports nothing above it: the verdict (`agents.engine.verdict.outcomes`)
hands it a run's end as a `Handoff`, the recorder a `Step`; it never imports them.
"""

from agents.engine.store.claim import Claim, claim_batch, claim_next
from agents.engine.store.fence import (
    Fence,
    fence,
    fenced,
    holds_attempt,
    holds_now,
    renew_lease,
    renew_leases,
    seconds_to_earliest_expiry,
    stale_task_ids,
)
from agents.engine.store.functions import HANDOFF_RUN_COLUMNS, HANDOFF_TASK_COLUMNS
from agents.engine.store.runs import (
    end_started_runs,
    end_values,
    finish_run,
    set_call_status,
    set_calls_status,
    settle_for_cancelled_task,
)
from agents.engine.store.statement import Handoff, StepPlan
from agents.engine.store.statement import plan as plan_step
from agents.engine.store.statement import write as write_step
from agents.engine.store.usage import Usage, task_usage
from agents.engine.store.values import (
    CallState,
    Checkpoint,
    Event,
    NewCall,
    NewTurn,
    Result,
    Step,
    TurnState,
)
from agents.engine.store.writes import insert_turns, write_conversation, write_run_row

__all__ = [
    "HANDOFF_RUN_COLUMNS",
    "HANDOFF_TASK_COLUMNS",
    "CallState",
    "Checkpoint",
    "Claim",
    "Event",
    "Fence",
    "Handoff",
    "NewCall",
    "NewTurn",
    "Result",
    "Step",
    "StepPlan",
    "TurnState",
    "Usage",
    "claim_batch",
    "claim_next",
    "end_started_runs",
    "end_values",
    "fence",
    "fenced",
    "finish_run",
    "holds_attempt",
    "holds_now",
    "insert_turns",
    "plan_step",
    "renew_lease",
    "renew_leases",
    "seconds_to_earliest_expiry",
    "set_call_status",
    "set_calls_status",
    "settle_for_cancelled_task",
    "stale_task_ids",
    "task_usage",
    "write_conversation",
    "write_run_row",
    "write_step",
]
