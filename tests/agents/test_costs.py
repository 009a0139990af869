"""Cost in money: cached tokens parsed by the providers from real (scripted) servers, the
turn's cost from the provider's report or the model's prices, prices from the table."""

from decimal import Decimal

import pytest

from agents.catalogue.prices import model_fill_prices, table_prices, turn_cost
from agents.catalogue.providers import Completion, Message, ToolSpec, build_provider
from tests.factories import ConnectionFactory, ModelFactory
from tests.fakes.model_server import ScriptedModelServer, reply_text

TOOL = ToolSpec(name="read_file", description="Read", parameters={"type": "object"})


def ask(provider, tools=()):
    return provider.complete(
        model="test-model",
        messages=[Message(role="system", content="S" * 400), Message(role="user", content="hi")],
        tools=list(tools),
        max_tokens=50,
    )


def test_openai_cached_tokens_and_openrouter_cost_are_parsed():
    usage = {
        "prompt_tokens": 1000,
        "completion_tokens": 50,
        "prompt_tokens_details": {"cached_tokens": 800},
        "cost": 0.00123,
    }
    with ScriptedModelServer([reply_text("a", usage=usage), reply_text("b")]) as server:
        provider = build_provider("openai_compatible", base_url=server.url, timeout=5)
        first = ask(provider)
        second = ask(provider)
    assert (first.input_tokens, first.cached_input_tokens, first.output_tokens) == (1000, 800, 50)
    assert first.reported_cost == Decimal("0.00123")
    assert second.cached_input_tokens == 0 and second.reported_cost is None


def test_deepseek_cache_hit_tokens_count_as_cached():
    usage = {"prompt_tokens": 100, "prompt_cache_hit_tokens": 60}
    with ScriptedModelServer([reply_text("a", usage=usage)]) as server:
        result = ask(build_provider("openai_compatible", base_url=server.url, timeout=5))
    assert (result.input_tokens, result.cached_input_tokens) == (100, 60)


@pytest.mark.parametrize("cost", ["a lot", -1, True, None, {"x": 1}])
def test_odd_reported_costs_are_ignored(cost):
    with ScriptedModelServer([reply_text("a", usage={"cost": cost})]) as server:
        result = ask(build_provider("openai_compatible", base_url=server.url, timeout=5))
    assert result.reported_cost is None


def test_anthropic_marks_the_stable_prefix_and_the_cache_shows_in_usage():
    with ScriptedModelServer(flavor="anthropic", prompt_cache=True, prompt_tokens=7) as server:
        provider = build_provider("anthropic", base_url=server.url, timeout=5)
        first = ask(provider, tools=[TOOL])
        second = ask(provider, tools=[TOOL])
        body = server.completion_requests[-1].json
    assert body["system"] == [
        {"type": "text", "text": "S" * 400, "cache_control": {"type": "ephemeral"}}
    ]
    assert body["tools"][-1]["cache_control"] == {"type": "ephemeral"}
    # First request writes the prefix to the cache, the second reads it.
    assert first.cache_write_tokens > 0 and first.cached_input_tokens == 0
    assert second.cached_input_tokens == first.cache_write_tokens
    assert second.cache_write_tokens == 0
    assert second.input_tokens == 7 + second.cached_input_tokens
    # Same prefix bytes in both requests.
    a, b = (r.json for r in server.completion_requests)
    assert (a["system"], a["tools"]) == (b["system"], b["tools"])


# -- turn_cost ---------------------------------------------------------------------------------


def usage(**kw):
    return Completion(text="", stop_reason="end", **kw)


@pytest.fixture
def priced(db):
    return ModelFactory(
        price_input_per_mtok=Decimal("3"),
        price_cached_input_per_mtok=Decimal("0.3"),
        price_cache_write_per_mtok=Decimal("3.75"),
        price_output_per_mtok=Decimal("15"),
    )


def test_turn_cost_prices_cached_input_apart(priced):
    u = usage(
        input_tokens=1_000_000,
        cached_input_tokens=600_000,
        cache_write_tokens=100_000,
        output_tokens=10_000,
    )
    # 300k plain x 3 + 600k cached x 0.3 + 100k written x 3.75 + 10k out x 15, per million
    expected = Decimal("0.9") + Decimal("0.18") + Decimal("0.375") + Decimal("0.15")
    assert turn_cost(priced, u) == expected


def test_turn_cost_prefers_the_reported_cost(priced):
    u = usage(input_tokens=1_000_000, output_tokens=0, reported_cost=Decimal("0.01"))
    assert turn_cost(priced, u) == Decimal("0.01")
    assert turn_cost(None, u) == Decimal("0.01")


def test_turn_cost_without_cache_prices_uses_the_input_price(db):
    model = ModelFactory(price_input_per_mtok=Decimal("2"), price_output_per_mtok=Decimal("8"))
    u = usage(input_tokens=500_000, cached_input_tokens=500_000, output_tokens=0)
    assert turn_cost(model, u) == Decimal("1")


def test_unknown_prices_give_no_cost(db):
    assert turn_cost(ModelFactory(), usage(input_tokens=10, output_tokens=10)) is None
    assert turn_cost(None, usage(input_tokens=10)) is None


def test_on_a_zero_cost_connection_an_unpriced_turn_costs_nothing(priced):
    assert turn_cost(ModelFactory(), usage(input_tokens=10), free=True) == Decimal(0)
    assert turn_cost(None, usage(input_tokens=10), free=True) == Decimal(0)
    # Prices a person set, or a reported cost, still count.
    assert turn_cost(priced, usage(input_tokens=1_000_000), free=True) > 0


# -- prices from the table ---------------------------------------------------------------------


def test_fill_prices_from_the_table_keeps_what_a_person_set(db, actor):
    conn = ConnectionFactory(kind="anthropic", base_url="https://api.anthropic.com")
    model = ModelFactory(
        connection=conn, name="claude-sonnet-4-5", price_output_per_mtok=Decimal("99")
    )
    assert table_prices(model)["price_input_per_mtok"] > 0
    fill = model_fill_prices(actor=actor, model_id=model.pk)
    model.refresh_from_db()
    assert model.price_output_per_mtok == Decimal("99")  # a person's price stays
    assert model.price_input_per_mtok == Decimal(fill.filled["price_input_per_mtok"]) > 0
    assert model.price_cached_input_per_mtok < model.price_input_per_mtok
    assert model.price_cache_write_per_mtok > model.price_input_per_mtok
    assert model.prices_source == "genai-prices"


def test_fill_prices_for_an_unknown_model_changes_nothing(db, actor):
    conn = ConnectionFactory(kind="openai_compatible", base_url="http://127.0.0.1:1/v1")
    model = ModelFactory(connection=conn, name="local-thing")
    assert model_fill_prices(actor=actor, model_id=model.pk).message == "not in the price table"
    model.refresh_from_db()
    assert model.price_input_per_mtok is None and model.prices_source == ""


def test_turn_usage_fields_fit_a_turn(priced):
    from agents.catalogue.prices import turn_usage_fields
    from tests.factories import TurnFactory

    u = usage(input_tokens=1000, cached_input_tokens=900, output_tokens=10)
    fields = turn_usage_fields(priced, u)
    turn = TurnFactory(**fields)
    turn.refresh_from_db()
    assert (turn.input_tokens, turn.cached_input_tokens, turn.output_tokens) == (1000, 900, 10)
    # 100 plain x 3 + 900 cached x 0.3 + 10 out x 15, per million
    assert turn.cost == turn_cost(priced, u) == Decimal("0.00072")
