"""Can this model run this task: one rule, one code per reason, one order — and the intake, the
loop and the fallback give the same answer for the same model."""

from datetime import timedelta
from itertools import product

import pytest
from django.utils import timezone

from agents.catalogue.connections import model_check_for_task, usable_models
from agents.catalogue.eligibility import (
    REASONS,
    eligible_models,
    model_refusal,
    model_refusals,
)
from agents.engine.run.intake import task_create
from agents.engine.runtime.worker import Worker
from agents.engine.store import claim_next
from agents.engine.verdict.outcomes import fallback_model
from agents.models import AgentRun, Connection, Model
from agents.states import FailureCode
from core.actors import Actor
from core.exceptions import InvalidInput
from tests.factories import ConnectionFactory, ModelFactory, TaskFactory

ACTOR = Actor.system("test")


@pytest.mark.django_db
def test_the_reasons_come_one_at_a_time_in_one_order():
    now = timezone.now()
    assert model_refusal(None, with_tools=False).code == FailureCode.CONNECTION_MISSING
    conn = ConnectionFactory(enabled=False, cooldown_until=now + timedelta(minutes=5))
    model = ModelFactory(connection=conn, test_status="untested", supports_tools=False)
    every = [r.code for r in model_refusals(model, with_tools=True, now=now)]
    assert every == list(REASONS[1:])
    cures = [
        lambda: setattr(conn, "enabled", True),
        lambda: setattr(model, "test_status", "passed"),
        lambda: setattr(model, "supports_tools", True),
        lambda: setattr(conn, "cooldown_until", now),
    ]
    seen = []
    for cure in cures:
        seen.append(model_refusal(model, with_tools=True, now=now).code)
        cure()
    assert seen == list(REASONS[1:])
    assert model_refusal(model, with_tools=True, now=now) is None
    # Without `now` a cooldown is not a reason; without tools tool support is not one.
    conn.cooldown_until = now + timedelta(minutes=5)
    model.supports_tools = False
    assert model_refusal(model, with_tools=False) is None
    assert model_refusal(model, with_tools=False, now=now).code == FailureCode.PROVIDER_COOLING_DOWN


@pytest.mark.django_db
def test_a_model_cli_calls_no_tools_whatever_its_record_says():
    cli = ConnectionFactory(kind="cli", command=["llm"], base_url="")
    overridden = ModelFactory(connection=cli, supports_tools=True)
    refusal = model_refusal(overridden, with_tools=True)
    assert refusal.code == FailureCode.MODEL_NOT_TOOL_CAPABLE
    assert "does not support tool calling" in refusal.message
    assert model_refusal(overridden, with_tools=False) is None
    assert overridden not in usable_models()
    check = model_check_for_task(task=TaskFactory(tools=["read_file"]), model=overridden)
    assert check.problems == [refusal.message]


@pytest.mark.django_db
def test_the_query_is_the_same_rule():
    now = timezone.now()
    models = []
    for enabled, status, tools, kind, cooling in product(
        (True, False),
        ("passed", "failed"),
        (True, False),
        ("openai_compatible", "cli"),
        (True, False),
    ):
        conn = ConnectionFactory(
            enabled=enabled,
            kind=kind,
            **({"command": ["llm"], "base_url": ""} if kind == "cli" else {}),
            cooldown_until=now + timedelta(minutes=1) if cooling else None,
        )
        models.append(ModelFactory(connection=conn, test_status=status, supports_tools=tools))
    for with_tools, at in product((True, False), (None, now)):
        fit = {m.pk for m in models if model_refusal(m, with_tools=with_tools, now=at) is None}
        assert set(eligible_models(with_tools=with_tools, now=at).values_list("pk", flat=True)) == (
            fit
        )
        assert fit  # each query keeps some and drops some
        assert len(fit) < len(models)


def _with_reason(reason: str) -> Model:
    """A zero-cost model that a task with tools cannot run on, for this reason."""
    match reason:
        case "every_reason":  # the first in the one order is given, by every door
            disabled = ConnectionFactory(enabled=False)
            return ModelFactory(connection=disabled, test_status="failed", supports_tools=False)
        case "connection_disabled":
            return ModelFactory(connection=ConnectionFactory(enabled=False))
        case "model_untested":
            return ModelFactory(test_status="failed")
        case "model_not_tool_capable":
            return ModelFactory(supports_tools=False)
        case "model_cli":
            cli = ConnectionFactory(kind="cli", command=["llm"], base_url="")
            return ModelFactory(connection=cli, supports_tools=True)
        case _:  # cooling down: set once the task is claimed (a cooling task is not claimed)
            return ModelFactory()


@pytest.mark.django_db(transaction=True)
def test_the_intake_the_loop_and_the_fallback_give_the_same_code(fast_worker_settings):
    cases = [
        ("every_reason", FailureCode.CONNECTION_DISABLED),
        ("connection_disabled", FailureCode.CONNECTION_DISABLED),
        ("model_untested", FailureCode.MODEL_UNTESTED),
        ("model_not_tool_capable", FailureCode.MODEL_NOT_TOOL_CAPABLE),
        ("model_cli", FailureCode.MODEL_NOT_TOOL_CAPABLE),
        ("cooling_down", FailureCode.PROVIDER_COOLING_DOWN),  # last: its task is requeued
    ]
    for reason, code in cases:
        model = _with_reason(reason)
        cooling = code == FailureCode.PROVIDER_COOLING_DOWN
        new = {"actor": ACTOR, "title": reason, "instruction": "I", "tools": ["read_file"]}
        if cooling:  # a new task waits a cooldown out: not refused
            task = task_create(**new, model=model, check_model=True)
        else:
            with pytest.raises(InvalidInput) as refused:
                task_create(**new, model=model, check_model=True)
            assert (refused.value.code, refused.value.field) == (code, "model"), reason
            task = task_create(**new, model=model)  # the engine's own callers check nothing
        claim = claim_next(worker_id="w")
        assert claim is not None and claim.task_id == task.pk
        now = timezone.now()
        if cooling:
            Connection.objects.filter(pk=model.connection_id).update(
                cooldown_until=now + timedelta(minutes=5)
            )
            model.connection.refresh_from_db()
        refusal = model_refusal(model, with_tools=True, now=now)
        assert refusal is not None and refusal.code == code
        assert fallback_model(task, exclude_connection_id=None, now=now) is None, reason
        Worker(worker_id="w").process(claim)
        run = AgentRun.objects.get(pk=claim.run_id)
        assert run.error_code == code, reason
        assert run.error_message.startswith(refusal.message)
    good = ModelFactory()
    assert fallback_model(task, exclude_connection_id=None, now=timezone.now()) == good
