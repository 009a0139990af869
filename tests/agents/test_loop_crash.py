"""SIGKILL of a worker between a tool result's commit and the next model request."""

import json
import subprocess
import sys

import pytest

from agents.models import AgentRun, ToolCall
from tasks.models import Task
from tasks.states import TaskStatus
from tasks.workspace import add_input_file
from tests.agents.conftest import ROOT, read_jsonl, wait_for

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture
def server_process(tmp_path):
    procs = []

    def start(script):
        script_file = tmp_path / "script.json"
        script_file.write_text(json.dumps(script))
        ready, record = tmp_path / "ready.txt", tmp_path / "record.jsonl"
        proc = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "tests" / "fakes" / "model_server.py"),
                "--flavor",
                "openai",
                "--port",
                "0",
                "--script",
                str(script_file),
                "--ready-file",
                str(ready),
                "--record",
                str(record),
            ],
        )
        procs.append(proc)
        url = wait_for(lambda: ready.exists() and ready.read_text().strip(), message="server")
        return url, record

    yield start
    for proc in procs:
        proc.kill()
        proc.wait()


def test_no_tool_is_run_again_and_the_model_request_is_simply_sent_again(
    server_process, spawn_worker, loop_task, db
):
    from agents.models import Connection, Model

    plan = {"steps": [{"step": "read"}]}
    url, record = server_process(
        [
            {"type": "tool_calls", "calls": [{"name": "update_plan", "arguments": plan}]},
            {
                "type": "tool_calls",
                "calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}],
            },
            {"type": "hang", "seconds": 120},  # the worker dies while this request is in flight
            {"type": "text", "text": "the file says alpha"},
        ]
    )
    conn = Connection.objects.create(
        name="srv", kind="openai_compatible", base_url=url, cost_tier="zero_cost"
    )
    model = Model.objects.create(
        connection=conn, name="test-model", test_status="passed", context_window=32000
    )
    task = loop_task(model)
    add_input_file(task.pk, name="a.txt", data="alpha")

    def requests():
        return [
            r
            for r in read_jsonl(record)
            if r.get("event") == "request" and r.get("path", "").endswith("/chat/completions")
        ]

    doomed = spawn_worker(worker_id="doomed")
    wait_for(lambda: len(requests()) == 3, timeout=30, message="the third model request")
    doomed.kill()
    rescuer = spawn_worker(worker_id="rescuer")
    wait_for(
        lambda: Task.objects.get(pk=task.pk).status == TaskStatus.REVIEW,
        timeout=45,
        message="review",
    )
    rescuer.stop()
    sent = requests()
    assert len(sent) == 4
    # The request in flight was sent again, identical: same prefix, same history.
    assert sent[3]["json"]["messages"] == sent[2]["json"]["messages"]
    # Steps recorded as complete were not run again.
    assert ToolCall.objects.get(task=task, tool="read_file").run_count == 1
    assert ToolCall.objects.get(task=task, tool="update_plan").run_count == 1
    runs = list(AgentRun.objects.filter(task=task).order_by("number"))
    assert [r.error_code for r in runs] == ["worker_lost", ""]
    assert runs[-1].answer == "the file says alpha"


def test_an_external_call_that_returned_is_not_unknown_after_a_crash(
    server_process, spawn_worker, loop_task, db
):
    """Issue 21, item 8: a fetch_url result commits as soon as it returns, so a SIGKILL during
    the next model request leaves the call succeeded (not needs_review, whose "run again" would
    repeat it), and the rescuer goes on without fetching again."""
    from agents.models import Connection, Model
    from tests.fakes.http_target import HttpTarget

    with HttpTarget() as target:
        fetch = {"url": f"{target.url}/text"}
        url, record = server_process(
            [
                {"type": "tool_calls", "calls": [{"name": "fetch_url", "arguments": fetch}]},
                {"type": "hang", "seconds": 120},  # the worker dies while this is in flight
                {"type": "text", "text": "fetched"},
            ]
        )
        conn = Connection.objects.create(
            name="srv", kind="openai_compatible", base_url=url, cost_tier="zero_cost"
        )
        model = Model.objects.create(
            connection=conn, name="test-model", test_status="passed", context_window=32000
        )
        task = loop_task(model, tools=["fetch_url"], allowed_domains=["127.0.0.1"])

        def requests():
            return [
                r
                for r in read_jsonl(record)
                if r.get("event") == "request" and r.get("path", "").endswith("/chat/completions")
            ]

        doomed = spawn_worker(worker_id="doomed", env={"ACTHELM_FETCH_ALLOW_PRIVATE": "1"})
        wait_for(lambda: len(requests()) == 2, timeout=30, message="the second model request")
        doomed.kill()
        call = ToolCall.objects.get(task=task, tool="fetch_url")
        assert call.status == "succeeded"
        rescuer = spawn_worker(worker_id="rescuer", env={"ACTHELM_FETCH_ALLOW_PRIVATE": "1"})
        wait_for(
            lambda: Task.objects.get(pk=task.pk).status == TaskStatus.REVIEW,
            timeout=45,
            message="review",
        )
        rescuer.stop()
    call.refresh_from_db()
    assert call.run_count == 1
    assert len(target.requests) == 1
