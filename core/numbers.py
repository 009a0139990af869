"""Numbers from people and commands, bounded before they reach a column or a timer.

PostgreSQL's integer columns end at 2**31 - 1; a float can be nan or infinite. Either would
otherwise surface as a 500 (a DataError) or as a limit that silently never applies.
"""

import math
from decimal import Decimal

from core.exceptions import ErrorCode, InvalidInput

INT32_MAX = 2**31 - 1
INT32_MIN = -(2**31)


def whole_number(
    value: object, *, name: str, minimum: int = INT32_MIN, maximum: int = INT32_MAX
) -> int:
    """``value`` as an int within [minimum, maximum]; else InvalidInput (``invalid_input`` for
    what is not a whole number, ``number_out_of_range`` for a number outside the bounds)."""
    if isinstance(value, bool):
        raise InvalidInput(f"{name} must be a whole number, not {value!r}", field=name)
    if isinstance(value, float):
        if not math.isfinite(value) or value != int(value):
            raise InvalidInput(f"{name} must be a whole number, not {value!r}", field=name)
        value = int(value)
    try:
        number = int(str(value).strip()) if not isinstance(value, int) else value
    except (TypeError, ValueError):
        raise InvalidInput(f"{name} must be a whole number, not {value!r}", field=name) from None
    if not minimum <= number <= maximum:
        bounds = (
            f"positive and at most {maximum}"
            if minimum == 1
            else f"between {minimum} and {maximum}"
        )
        raise InvalidInput(
            f"{name} must be {bounds}, not {number}", code=ErrorCode.NUMBER_OUT_OF_RANGE, field=name
        )
    return number


def finite_number(value: object, *, name: str, minimum: float, maximum: float) -> float:
    """``value`` as a finite float within [minimum, maximum] (nan and infinity refused)."""
    try:
        # Any value may come (a form's, a file's): float() refusing it (TypeError) is the check.
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise InvalidInput(f"{name} must be a number, not {value!r}", field=name) from None
    if not math.isfinite(number):
        raise InvalidInput(f"{name} must be a finite number, not {value!r}", field=name)
    if not minimum <= number <= maximum:
        raise InvalidInput(
            f"{name} must be between {minimum:g} and {maximum:g}, not {number:g}",
            code=ErrorCode.NUMBER_OUT_OF_RANGE,
            field=name,
        )
    return number


def money_text(value: Decimal | None) -> str | None:
    """An amount as the API and `--json` publish it: a fixed-point decimal string ("0.00000000",
    "1.25"), never an exponent ("0E-8") that a script would have to parse; None stays None."""
    return None if value is None else f"{value:f}"
