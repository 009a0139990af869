"""Each shape the API returns is written once: its output schema is the typed dict's keys."""

from typing import get_type_hints

import pytest
from ninja import Schema

from acthelm_site.api import schemas as s
from acthelm_site.api.schedules import SlotOut
from acthelm_site.api.selectors import (
    ApprovalDict,
    ConnectionDict,
    ModelDict,
    PendingOperations,
    ReviewDict,
    ToolCallDict,
)
from agents.selectors import RunDict
from schedules.selectors import SlotDict
from tasks.selectors import EventJSON

PAIRS = [
    (s.ApprovalOut, ApprovalDict),
    (s.ReviewOut, ReviewDict),
    (s.ToolCallOut, ToolCallDict),
    (s.RunOut, RunDict),
    (s.EventOut, EventJSON),
    (s.PendingOut, PendingOperations),
    (s.ModelOut, ModelDict),
    (s.ConnectionOut, ConnectionDict),
    (SlotOut, SlotDict),
]


@pytest.mark.parametrize(("schema", "typed"), PAIRS, ids=lambda x: x.__name__)
def test_an_output_schema_has_its_typed_dicts_keys(schema: type[Schema], typed: type) -> None:
    fields = [field.alias or name for name, field in schema.model_fields.items()]
    assert fields == list(get_type_hints(typed))


def test_a_typed_dict_key_the_schema_does_not_know_is_refused() -> None:
    with pytest.raises(TypeError, match="no key"):
        s.from_typed_dict("Wrong", ModelDict, nickname=str)
