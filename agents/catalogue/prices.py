"""What a model turn cost in money, and the models' prices.

``turn_cost(model, usage)`` is pure: the provider's reported cost when it gives one
(OpenRouter's ``usage.cost``), else the tokens at the model's prices per million, with cache
reads and cache writes at their own prices (an empty cached price falls back to the input
price). None when neither is known: an unknown cost is not zero — except on a zero-cost
connection (a local model, a free tier), whose unpriced turns cost nothing: $0.

``model_fill_prices`` fills empty prices from the ``genai-prices`` table; a price a person
entered is never overwritten.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from typing import Any, Protocol

from django.db import transaction

from agents.catalogue.providers import get_provider_class
from agents.models import Model
from agents.permissions import MANAGE_CONNECTIONS
from core.actors import Actor

log = logging.getLogger("acthelm.costs")

MILLION = Decimal(1_000_000)
COST_PLACES = Decimal("0.00000001")  # Turn.cost has 8 decimal places
PRICE_FIELDS = (
    "price_input_per_mtok",
    "price_cached_input_per_mtok",
    "price_cache_write_per_mtok",
    "price_output_per_mtok",
)
TABLE_SOURCE = "genai-prices"


class TokenUsage(Protocol):
    """What ``turn_cost`` reads; a provider ``Completion`` has it."""

    @property
    def input_tokens(self) -> int: ...  # every input token, cached ones included
    @property
    def cached_input_tokens(self) -> int: ...
    @property
    def cache_write_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...
    @property
    def reported_cost(self) -> Decimal | None: ...


def turn_cost(model: Model | None, usage: TokenUsage, *, free: bool = False) -> Decimal | None:
    """The cost of one model turn in US dollars, or None when it cannot be known. `free`: the
    turn ran on a zero-cost connection, so a turn without a reported cost or prices cost $0."""
    reported = getattr(usage, "reported_cost", None)
    if reported is not None:
        return Decimal(reported).quantize(COST_PLACES)
    if model is None:
        return Decimal(0).quantize(COST_PLACES) if free else None
    price_in, price_out = model.price_input_per_mtok, model.price_output_per_mtok
    if price_in is None or price_out is None:
        return Decimal(0).quantize(COST_PLACES) if free else None
    cached = max(0, getattr(usage, "cached_input_tokens", 0) or 0)
    written = max(0, getattr(usage, "cache_write_tokens", 0) or 0)
    plain = max(0, usage.input_tokens - cached - written)
    price_cached = model.price_cached_input_per_mtok
    price_write = model.price_cache_write_per_mtok
    total = (
        plain * price_in
        + cached * (price_in if price_cached is None else price_cached)
        + written * (price_in if price_write is None else price_write)
        + usage.output_tokens * price_out
    ) / MILLION
    return total.quantize(COST_PLACES)


def turn_usage_fields(
    model: Model | None, usage: TokenUsage, *, free: bool = False
) -> dict[str, Any]:
    """The ``Turn`` fields of a model turn's usage and cost: ``Turn(..., **turn_usage_fields(
    task.model, completion))`` in the transaction that stores the turn (`free`: on a zero-cost
    connection)."""
    return {
        "input_tokens": usage.input_tokens,
        "cached_input_tokens": getattr(usage, "cached_input_tokens", 0) or 0,
        "cache_write_tokens": getattr(usage, "cache_write_tokens", 0) or 0,
        "output_tokens": usage.output_tokens,
        "cost": turn_cost(model, usage, free=free),
    }


# -- prices from the maintained table ----------------------------------------------------------


@dataclass(frozen=True)
class PriceFill:
    model: str
    filled: dict[str, str]
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"model": self.model, "filled": self.filled, "message": self.message}


def _base(value: Any) -> Decimal | None:
    """A table price (a Decimal, or tiered prices: their base) as a Decimal."""
    if value is None:
        return None
    base = getattr(value, "base", value)
    try:
        return Decimal(str(base))
    except ArithmeticError:
        return None


def table_prices(model: Model) -> dict[str, Decimal]:
    """The model's prices per million tokens in the genai-prices table ({} when unknown)."""
    from genai_prices import data_snapshot

    conn = model.connection
    provider_id = get_provider_class(conn.kind).price_provider_id
    api_url = conn.base_url or None if provider_id is None else None
    if provider_id is None and api_url is None:
        return {}
    try:
        _, info = data_snapshot.get_snapshot().find_provider_model(
            model.name, None, provider_id, api_url
        )
    except LookupError:
        return {}
    prices = info.get_prices(datetime.now(UTC))
    found = {
        "price_input_per_mtok": _base(prices.input_mtok),
        "price_cached_input_per_mtok": _base(prices.cache_read_mtok),
        "price_cache_write_per_mtok": _base(prices.cache_write_mtok),
        "price_output_per_mtok": _base(prices.output_mtok),
    }
    return {k: v for k, v in found.items() if v is not None}


def model_fill_prices(*, actor: Actor, model_id: int) -> PriceFill:
    """Fill the model's empty prices from the table; never overwrite a price a person set."""
    actor.require(MANAGE_CONNECTIONS)
    model = Model.objects.select_related("connection").get(pk=model_id)
    found = table_prices(model)  # outside the transaction: it may read a file
    with transaction.atomic():
        model = Model.objects.select_for_update().get(pk=model_id)
        filled = {
            field: value
            for field, value in found.items()
            if getattr(model, field) is None and value is not None
        }
        if filled:
            for field, value in filled.items():
                setattr(model, field, value)
            model.prices_source = TABLE_SOURCE
            model.save(update_fields=[*filled, "prices_source"])
    if not found:
        message = "not in the price table"
    elif not filled:
        message = "prices already set; nothing changed"
    else:
        message = "filled " + ", ".join(sorted(filled))
    log.info("model.prices_filled", extra={"model_id": model_id, "fields": sorted(filled)})
    return PriceFill(str(model), {k: str(v) for k, v in filled.items()}, message)
