"""The scorecard in a real browser: each chart's labels stand side by side, none over another."""

import itertools

import pytest

from tests.agents.test_scorecard import outcomes  # noqa: F401  (the fixture set)

pytestmark = [pytest.mark.e2e, pytest.mark.django_db(transaction=True)]


def test_the_chart_labels_do_not_overlap(page, login, screenshot, outcomes):  # noqa: F811
    from tests.factories import UserFactory

    UserFactory(username="analyst", perms=["agents.view_agentrun", "tasks.view_task"])
    login("analyst")
    page.goto("/scorecard/?period=week")
    charts = page.locator("svg.scorecard-chart")
    assert charts.count() == 2
    for index in range(charts.count()):
        boxes = [label.bounding_box() for label in charts.nth(index).locator("text").all()]
        assert len(boxes) == 6
        for left, right in itertools.pairwise(boxes):
            assert left["x"] + left["width"] <= right["x"], (left, right)
    screenshot("scorecard.png")
