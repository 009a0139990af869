"""docs/api.md's curl example of `GET /api/tasks/{id}/events`, run as written in bash against the
live server: a running task whose turn a worker's side publishes through real NOTIFYs, then a
person's cancel; the first curl prints the stored events, the deltas and the end, and exits 0
when the task settles; the second resumes after a stored event."""

import re
import subprocess
import time

import pytest

from acthelm_site.api.tokens import token_create
from agents.actions.task import task_cancel
from core.actors import Actor
from tasks import livestream
from tasks.states import EventKind, TaskStatus
from tests.api.conftest import ALL_PERMS
from tests.conftest import ROOT
from tests.factories import AgentRunFactory, TaskEventFactory, TaskFactory, UserFactory
from tests.live.helpers import WorkerSide

pytestmark = pytest.mark.django_db(transaction=True)

HEADING = "## Watching a task as it works"


def example() -> str:
    text = (ROOT / "docs" / "api.md").read_text()
    section = text[text.index(HEADING) :]
    found = re.search(r"^```sh\n(.*?)^```", section, re.S | re.M)
    assert found, "docs/api.md: the section has no sh block"
    return found.group(1)


@pytest.fixture(autouse=True)
def fresh_hub(monkeypatch):
    monkeypatch.setattr(livestream, "_hub", None)


def test_the_curl_example_runs_as_written(live_server):
    user = UserFactory(username="founder", perms=ALL_PERMS)
    token = token_create(user=user, name="docs").secret
    task = TaskFactory(status=TaskStatus.IN_PROGRESS)
    run = AgentRunFactory(task=task)
    claimed = TaskEventFactory(task=task, kind=EventKind.CLAIMED, run=run)
    env = {
        "PATH": "/usr/bin:/bin",
        "ACTHELM": live_server.url,
        "ACTHELM_TOKEN": token,
        "TASK": str(task.pk),
        "LAST": str(claimed.pk),
    }
    with WorkerSide() as worker:
        shell = subprocess.Popen(
            ["bash", "-c", example()],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        worker.wait_watched(task.pk, seconds=10)
        worker.publisher.publish(task.pk, run.pk, "turn", {})
        worker.publisher.publish(task.pk, run.pk, "text", {"text": "Summarising notes.txt"})
        time.sleep(1.0)
        task_cancel(actor=Actor.person(user), task_id=task.pk, reason="seen enough")
        out, err = shell.communicate(timeout=30)
    assert shell.returncode == 0, err
    first, _, resumed = out.partition("event: end")
    assert f"id: {claimed.pk}\nevent: task_event" in first  # every stored event, the claim's too
    assert "event: delta" in first and "Summarising notes.txt" in first
    assert '"kind":"cancelled"' in first
    assert out.count("event: end") == 2  # the first curl ended at the final state, then the second
    assert f"id: {claimed.pk}\n" not in resumed  # resumed after it
    assert '"kind":"cancelled"' in resumed and "event: delta" not in resumed
