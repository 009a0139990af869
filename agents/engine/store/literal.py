"""A value of an enum (a status, a kind, a SQLSTATE) as an SQL literal, for the store's statements
and function templates: the value comes from its TextChoices, never typed into SQL."""

import re

_PLAIN = re.compile(r"^[A-Za-z0-9_]+$")


def literal(value: str) -> str:
    """`'value'`: letters, digits and underscores only (what every state and code is), so that
    nothing needs quoting; anything else is a ValueError."""
    text = str(value)
    if not _PLAIN.match(text):
        raise ValueError(f"not a plain enum value: {text!r}")
    return f"'{text}'"
