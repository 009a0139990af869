"""Every error carries its HTTP status; the console and the API answer with it, not a lookup."""

import pytest

from acthelm_site.api.tokens import TokenNotFound, TokenRefused
from core import exceptions as e


@pytest.mark.parametrize(
    ("error", "status"),
    [
        (e.InvalidInput, 400),
        (e.DependencyCycle, 400),
        (e.NotPermitted, 403),
        (e.NotFound, 404),
        (e.TaskNotFound, 404),
        (e.GoalNotFound, 404),
        (TokenNotFound, 404),
        (TokenRefused, 401),
        (e.TransitionNotAllowed, 409),
        (e.LimitNotRaised, 409),
        (e.StaleDecision, 409),
        (e.ModelCheckFailed, 409),
        (e.ActhelmError, 409),
    ],
)
def test_each_error_says_its_status(error, status):
    assert error("refused").http_status == status
