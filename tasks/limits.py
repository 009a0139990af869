"""A task's limits, one row each: the one place that says what a limit is called, which setting
gives its default, how people read it, what it counts and the code a task fails with when it is
reached. Settings, the model's field defaults, forms, the API, the agent loop, the task page and
the CLI read this table; nothing else lists the limits.

Plain Python (no Django import), so that `acthelm_site.settings` can read the defaults from it.
What a task has *used* is counted by the engine (`agents.engine.run.usage.task_usage`): `counter`
names the attribute of its `Usage` that a cumulative limit is compared with.
"""

import os
from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation


@dataclass(frozen=True)
class Limit:
    field: str  # the Task column, e.g. limit_turns
    setting: str  # the setting (and environment variable) with the default for new tasks
    default: int | None  # when the environment sets nothing; None: no limit
    label: str  # for people: form labels, the task page, the CLI
    unit: str  # what one unit is ("turns", "USD", …)
    # The Usage attribute compared with the limit across all runs, or "" for a cap that applies
    # to one item (one model answer, one tool result, one artifact) and never fails a task.
    counter: str = ""
    failure_code: str = ""  # the task's failure code when a cumulative limit is reached
    money: bool = False  # an amount (Decimal, may be empty = no limit), not a whole number
    usage_label: str = ""  # what the counter is called beside its bar on the task page
    # When the engine checks a cumulative limit: before each model turn, network request or MCP
    # call; and the failure message once it is reached ({granted}, {used}).
    checked_before: str = ""
    reached: str = ""

    @property
    def key(self) -> str:
        """The short name in JSON (`limits.turns`)."""
        return self.field.removeprefix("limit_")

    @property
    def cumulative(self) -> bool:
        return bool(self.counter)

    def from_environment(self, environ: Mapping[str, str] = os.environ) -> int | str | None:
        """The default for new tasks, from the environment (settings use this)."""
        value = (environ.get(self.setting) or "").strip()
        if self.money:
            return value or None
        return int(value) if value else self.default


LIMITS: tuple[Limit, ...] = (
    Limit(
        "limit_turns",
        "ACTHELM_LIMIT_TURNS",
        24,
        "Model turns",
        "turns",
        counter="model_turns",
        usage_label="Model turns",
        failure_code="limit_steps",
        checked_before="model_turn",
        reached="the task used its {granted} model turns",
    ),
    Limit(
        "limit_runtime_seconds",
        "ACTHELM_LIMIT_RUNTIME_SECONDS",
        900,
        "Runtime (seconds)",
        "seconds",
        counter="active_seconds",
        usage_label="Runtime (s)",
        failure_code="limit_runtime",
        checked_before="model_turn",
        reached="the task ran for its {granted} s of runtime",
    ),
    Limit(
        "limit_output_tokens",
        "ACTHELM_LIMIT_OUTPUT_TOKENS",
        16_000,
        "Output per turn (tokens)",
        "tokens",
    ),
    Limit(
        "limit_token_budget",
        "ACTHELM_LIMIT_TOKEN_BUDGET",
        600_000,
        "Token budget",
        "tokens",
        counter="tokens",
        usage_label="Tokens",
        failure_code="limit_tokens",
        checked_before="model_turn",
        reached="the task used its budget of {granted} tokens",
    ),
    Limit(
        "limit_tool_output_chars",
        "ACTHELM_LIMIT_TOOL_OUTPUT_CHARS",
        24_000,
        "Tool output (characters)",
        "characters",
    ),
    Limit(
        "limit_network_requests",
        "ACTHELM_LIMIT_NETWORK_REQUESTS",
        8,
        "Network requests",
        "requests",
        counter="network_requests",
        usage_label="Network requests",
        failure_code="limit_network",
        checked_before="network_request",
        reached="the task used its {granted} network requests",
    ),
    Limit(
        "limit_artifact_bytes",
        "ACTHELM_LIMIT_ARTIFACT_BYTES",
        1_048_576,
        "Artifact size (bytes)",
        "bytes",
    ),
    Limit(
        "limit_mcp_calls",
        "ACTHELM_LIMIT_MCP_CALLS",
        20,
        "MCP tool calls",
        "calls",
        counter="mcp_calls",
        usage_label="MCP tool calls",
        failure_code="limit_mcp",
        checked_before="mcp_call",
        reached="the task used its {granted} MCP tool calls",
    ),
    Limit(
        "limit_cost",
        "ACTHELM_LIMIT_COST",
        None,
        "Money budget (USD, empty = none)",
        "USD",
        counter="cost",
        usage_label="Cost",
        failure_code="limit_cost",
        checked_before="model_turn",
        reached="the task spent its budget of {granted} USD (used {used:.4f})",
        money=True,
    ),
)

BY_FIELD: dict[str, Limit] = {limit.field: limit for limit in LIMITS}
BY_FAILURE_CODE: dict[str, Limit] = {
    limit.failure_code: limit for limit in LIMITS if limit.cumulative
}
LIMIT_FIELDS: tuple[str, ...] = tuple(BY_FIELD)
CUMULATIVE: tuple[Limit, ...] = tuple(limit for limit in LIMITS if limit.cumulative)
BEFORE_A_MODEL_TURN: tuple[Limit, ...] = tuple(
    limit for limit in CUMULATIVE if limit.checked_before == "model_turn"
)
BEFORE_A_NETWORK_REQUEST: tuple[Limit, ...] = tuple(
    limit for limit in CUMULATIVE if limit.checked_before == "network_request"
)
BEFORE_AN_MCP_CALL: tuple[Limit, ...] = tuple(
    limit for limit in CUMULATIVE if limit.checked_before == "mcp_call"
)
PER_ITEM: tuple[Limit, ...] = tuple(limit for limit in LIMITS if not limit.cumulative)

#: A limit's value on a task, by its field: a whole number, or an amount (None: no limit).
type LimitValues = dict[str, int | Decimal | None]

#: The largest amount of money a budget may be (the column holds 12 digits, 4 after the point).
MAX_MONEY = Decimal("100000000")


class BadLimit(ValueError):
    """A limit value that is not acceptable; the message says why (for people)."""


def money_amount(field: str, value: object) -> Decimal | None:
    """An amount for a money limit: empty means no limit; else positive, at most 4 decimals."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    try:
        number = Decimal(str(value).strip())
    except InvalidOperation:
        raise BadLimit(f"{field} must be an amount like 2.50, not {value!r}") from None
    if not number.is_finite() or number <= 0:
        raise BadLimit(f"{field} must be positive (leave it empty for no limit)")
    if number >= MAX_MONEY:
        raise BadLimit(f"{field} is too large")
    amount = number.quantize(Decimal("0.0001"))
    if amount <= 0:  # the column holds 4 decimals: 0.00001 would be stored as a budget of 0
        raise BadLimit(f"{field} must be at least 0.0001 (it is kept to 4 decimals)")
    return amount


def limit_for_failure(code: str) -> str | None:
    """The task limit a failure code refers to (limit_steps -> limit_turns), if any."""
    if code in BY_FAILURE_CODE:
        return BY_FAILURE_CODE[code].field
    if code in BY_FIELD:
        return code
    return None
