"""The limits table is the one description of the limits: every place that lists them reads it."""

from decimal import Decimal

import pytest

from acthelm_site.api.schemas import TaskCreateIn
from agents.engine.run.usage import Usage
from console.forms import TaskCreateForm
from tasks.limits import (
    BY_FIELD,
    CUMULATIVE,
    LIMITS,
    PER_ITEM,
    BadLimit,
    limit_for_failure,
    money_amount,
)
from tasks.models import Task
from tasks.selectors import task_as_dict
from tasks.services import default_limits
from tests.factories import TaskFactory


def test_every_limit_is_a_task_column_with_the_tables_default():
    for limit in LIMITS:
        field = Task._meta.get_field(limit.field)
        if limit.money:
            assert field.null and limit.default is None
        else:
            assert field.default == limit.default


def test_every_limit_has_its_setting_and_new_tasks_take_it(settings):
    for limit in LIMITS:
        assert hasattr(settings, limit.setting)
    settings.ACTHELM_LIMIT_TURNS = 7
    settings.ACTHELM_LIMIT_COST = "2.5"
    assert default_limits()["limit_turns"] == 7
    assert default_limits()["limit_cost"] == Decimal("2.5000")


def test_the_environment_gives_the_defaults():
    turns, cost = BY_FIELD["limit_turns"], BY_FIELD["limit_cost"]
    assert turns.from_environment({}) == 24
    assert turns.from_environment({"ACTHELM_LIMIT_TURNS": "40"}) == 40
    assert cost.from_environment({}) is None
    assert cost.from_environment({"ACTHELM_LIMIT_COST": " 3.00 "}) == "3.00"


def test_cumulative_limits_name_a_usage_counter_a_failure_code_and_a_message():
    # Every field of Usage (each a column of AgentRun), and tokens (input + output).
    counters = {*Usage.__dataclass_fields__, "tokens"}
    for limit in CUMULATIVE:
        assert limit.counter in counters
        assert limit.failure_code.startswith("limit_")
        assert limit.reached and limit.usage_label and limit.checked_before
        assert limit_for_failure(limit.failure_code) == limit.field
    assert {limit.field for limit in PER_ITEM} == {
        "limit_output_tokens",
        "limit_tool_output_chars",
        "limit_artifact_bytes",
    }
    assert limit_for_failure("provider_auth") is None


@pytest.mark.parametrize("value", ["0", "-1", "abc", "NaN", "Infinity", "100000000"])
def test_a_money_limit_refuses_what_is_not_a_positive_amount(value):
    with pytest.raises(BadLimit):
        money_amount("limit_cost", value)


def test_the_form_the_api_and_the_task_json_list_every_limit(db):
    form = TaskCreateForm()
    api_fields = TaskCreateIn.model_fields
    task_limits = task_as_dict(TaskFactory(limit_cost=Decimal("1.5")))["limits"]
    for limit in LIMITS:
        assert form.fields[limit.field].label == limit.label
        assert limit.field in api_fields
        assert limit.key in task_limits
    assert Decimal(task_limits["cost"]) == Decimal("1.5")
    assert [bound.name for bound in form.limit_fields()] == [limit.field for limit in LIMITS]


def test_every_limit_failure_code_is_a_failure_code_and_no_other_is_a_limit():
    from agents.states import FailureCode

    codes = {limit.failure_code for limit in CUMULATIVE}
    for code in codes:
        assert FailureCode(code).is_limit
        assert not FailureCode(code).is_final and FailureCode(code).is_attempt
    assert FailureCode.limits() == codes
    assert not any(limit.failure_code for limit in PER_ITEM)
