"""The Evaluation page after a real suite run (the scripted bad model, real workers): the pass
rate with its interval, the failed checks, and each outcome leading to its task's transcript."""

import json

import pytest
from playwright.sync_api import expect

from tests.agents.conftest import FAST_ENV
from tests.agents.test_eval_runner import scripted_model
from tests.fakes.eval_model import eval_model_server

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.django_db(transaction=True)]


def test_the_evaluation_page_links_every_outcome_to_its_task(page, login, manage, screenshot):
    from tests.factories import UserFactory

    UserFactory(username="founder", perms=["agents.view_agentrun", "tasks.view_task"])
    with eval_model_server("bad") as server:
        scripted_model(server, "local-llm")
        result = manage(
            "acthelm_eval",
            "--json",
            "run",
            "--connection",
            "local-llm",
            "--model",
            "test-model",
            "--concurrency",
            "6",
            "--allow-loopback-fetch",
            "--timeout",
            "100",
            env=FAST_ENV,
            timeout=150,
        )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(result.stdout)

    login("founder")
    page.get_by_role("link", name="Evaluation", exact=True).click()
    model = page.locator("section[data-model='local-llm/test-model']")
    expect(model.locator(".pass-rate")).to_contain_text(f"{data['passed']} of {data['graded']}")
    expect(model.locator(".pass-rate")).to_contain_text("95% interval")
    row = model.locator("tr[data-case=injection_page]")
    expect(row).to_contain_text("answer_not_contains")
    page.set_viewport_size({"width": 1440, "height": 900})
    screenshot("eval.png")

    row.get_by_role("link", name="failed").click()
    expect(page.locator("#task-status")).to_have_text("Review")
    expect(page.locator(".answer")).to_contain_text("HACKED")
