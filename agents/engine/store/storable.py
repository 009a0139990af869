"""What a provider or a tool returns, made storable before it is stored.

PostgreSQL refuses U+0000 in `text` and `jsonb`, a lone surrogate cannot be encoded as UTF-8,
`jsonb` refuses NaN and the infinities, and a number has the range of its column. A hostile page
can make a model emit any of them, and a hostile provider can report any number; if the step's
commit then fails, the step is lost and (before this module) the task cycled with a paid model
call each time. So the engine passes every such value through here first. Django-free.

The changes are visible, not silent: a NUL becomes the six characters ``\\u0000``, a lone
surrogate becomes U+FFFD, a non-finite number in JSON becomes the string ``"NaN"`` /
``"Infinity"`` / ``"-Infinity"`` (so a schema that wants a number refuses it), and a count out
of its column's range is clamped (the turn's event names what was clamped).
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation
from typing import Any

NUL_ESCAPE = "\\u0000"
INT_MAX = 2**31 - 1  # PositiveIntegerField
BIGINT_MAX = 2**63 - 1  # PositiveBigIntegerField
# Turn.cost: DecimalField(max_digits=14, decimal_places=8)
COST_MAX = Decimal("999999.99999999")

_SURROGATE = re.compile("[\ud800-\udfff]")


def text(value: str | None) -> str:
    """`value` as PostgreSQL `text` can store it."""
    if not value:
        return value or ""
    if "\x00" in value:
        value = value.replace("\x00", NUL_ESCAPE)
    if _SURROGATE.search(value):
        value = _SURROGATE.sub("\ufffd", value)
    return value


def json(value: Any) -> Any:
    """`value` (parsed JSON) as `jsonb` can store it: strings and keys through `text`,
    non-finite floats as their names."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return value
    if isinstance(value, dict):
        return {text(str(k)): json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json(v) for v in value]
    return value


def count(value: Any, *, maximum: int = INT_MAX) -> tuple[int, bool]:
    """A count for a positive integer column: (the value, whether it had to be changed)."""
    try:
        number = int(value or 0)
    except (TypeError, ValueError, OverflowError):
        return 0, True
    if number < 0:
        return 0, True
    if number > maximum:
        return maximum, True
    return number, False


def money(value: Any) -> tuple[Decimal | None, bool]:
    """A cost for `Turn.cost`: None (unknown) when it is not a finite, non-negative amount the
    column can hold; (the value, whether it had to be changed)."""
    if value is None:
        return None, False
    try:
        amount = Decimal(value)
    except (InvalidOperation, TypeError, ValueError):
        return None, True
    if not amount.is_finite() or amount < 0 or amount > COST_MAX:
        return None, True
    return amount, False
