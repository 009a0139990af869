from itertools import product

import pytest
from django.db import transaction

from agents.engine.store import set_call_status
from agents.models import ToolCall
from agents.states import TOOL_CALL_TRANSITIONS, ToolCallStatus
from core.exceptions import TransitionNotAllowed
from tests.factories import ToolCallFactory

pytestmark = pytest.mark.django_db


@pytest.mark.parametrize(("current", "to"), list(product(ToolCallStatus.values, repeat=2)))
def test_every_tool_call_move_follows_the_table(current, to):
    call = ToolCallFactory(status=current)
    with transaction.atomic():
        if to in TOOL_CALL_TRANSITIONS[current]:
            set_call_status(call.pk, to, error_code="x")
        else:
            with pytest.raises(TransitionNotAllowed):
                set_call_status(call.pk, to)
    expected = to if to in TOOL_CALL_TRANSITIONS[current] else current
    assert ToolCall.objects.get(pk=call.pk).status == expected
