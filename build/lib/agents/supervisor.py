"""The supervisor: after a final answer, a verdict. Approved work goes to review, never to done.

The default supervisor checks rules (a non-empty answer, limits respected, nothing pending). When
ACTHELM_SUPERVISOR_CONNECTION names a connection (and ACTHELM_SUPERVISOR_MODEL one of its models),
a model on that connection is asked as well; it is called outside any transaction.
"""

import logging
from dataclasses import dataclass

from django.conf import settings

from agents.limits import task_usage
from agents.models import Model, ToolCall
from agents.providers import Message, ProviderError
from agents.services import provider_for
from agents.states import TOOL_CALL_DONE, ModelTestStatus

log = logging.getLogger("acthelm.supervisor")

MODEL_PROMPT = """You supervise an autonomous agent. Decide whether its answer fulfils the task.
Reply with exactly one line: APPROVED, or REJECTED: <the reason, as feedback for the agent>.

## Task
{instruction}

## The agent's answer
{answer}
"""


@dataclass(frozen=True)
class SupervisorVerdict:
    approved: bool
    reason: str


def rule_checks(task, answer: str, *, usage=None, open_operations=None) -> list[str]:
    """The rule checks. The worker passes the usage and the open operations it keeps in memory;
    without them they are read from the database."""
    problems = []
    if not answer.strip():
        problems.append("the answer is empty")
    usage = usage if usage is not None else task_usage(task.pk)
    if usage.model_turns > task.limit_turns:
        problems.append("the run used more model turns than its limit")
    if usage.tokens > task.limit_token_budget:
        problems.append("the run used more tokens than its budget")
    if usage.network_requests > task.limit_network_requests:
        problems.append("the run made more network requests than its limit")
    if open_operations is None:
        open_operations = ToolCall.objects.filter(task=task).exclude(status__in=TOOL_CALL_DONE)
        open_operations = open_operations.exists()
    if open_operations:
        problems.append("operations are still pending")
    return problems


def uses_model() -> bool:
    """Whether a model is asked as well (a slow external call: the answer is stored first)."""
    return bool(getattr(settings, "ACTHELM_SUPERVISOR_CONNECTION", ""))


def _supervisor_model() -> Model | None:
    name = getattr(settings, "ACTHELM_SUPERVISOR_CONNECTION", "")
    if not name:
        return None
    qs = Model.objects.select_related("connection").filter(
        connection__name=name, test_status=ModelTestStatus.PASSED
    )
    model_name = getattr(settings, "ACTHELM_SUPERVISOR_MODEL", "")
    if model_name:
        qs = qs.filter(name=model_name)
    return qs.first()


def supervise(task, answer: str, *, usage=None, open_operations=None) -> SupervisorVerdict:
    problems = rule_checks(task, answer, usage=usage, open_operations=open_operations)
    if problems:
        return SupervisorVerdict(False, "; ".join(problems))
    model = _supervisor_model()
    if model is None:
        return SupervisorVerdict(True, "rule checks passed")

    prompt = MODEL_PROMPT.format(instruction=task.instruction, answer=answer[:20_000])
    try:
        completion = provider_for(model.connection).complete(
            model=model.name,
            messages=[Message(role="user", content=prompt)],
            tools=[],
            max_tokens=400,
        )
    except ProviderError as exc:
        log.warning("supervisor.model_unavailable", extra={"task_id": task.pk, "code": exc.code})
        return SupervisorVerdict(
            True, f"rule checks passed; model supervisor unavailable ({exc.code})"
        )
    line = (completion.text.strip().splitlines() or [""])[0].strip()
    if line.upper().startswith("APPROVED"):
        return SupervisorVerdict(True, f"approved by {model}")
    if line.upper().startswith("REJECTED"):
        reason = line.partition(":")[2].strip() or "rejected without a reason"
        return SupervisorVerdict(False, reason)
    return SupervisorVerdict(False, f"the supervisor's answer was unclear: {line[:200]!r}")
