"""Structured logs: with ACTHELM_LOG_FORMAT=json every line is one JSON object carrying the dotted
event name and the record's structured fields."""

import io
import json
import logging
import subprocess
import sys

import pytest

from core.logging import JsonFormatter
from tasks.models import Task
from tasks.states import TaskStatus
from tests.conftest import ROOT
from tests.factories import TaskFactory

_CHILD = """
import logging, django
django.setup()
from agents.engine.store import claim_next
claim = claim_next(worker_id="host-a:4242:0")
print("claimed", claim.task_id, flush=True)
log = logging.getLogger("acthelm.worker")
log.info("task.claimed", extra={"task_id": 7, "run_id": 3, "worker": "host-a:4242:0"})
try:
    raise RuntimeError("first line\\nsecond line")
except RuntimeError:
    log.exception("worker.crashed", extra={"task_id": 7})
"""


def _run_child(env) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _CHILD],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_every_log_line_is_one_json_object_with_event_and_ids(worker_env):
    task = TaskFactory(status=TaskStatus.READY)
    result = _run_child({**worker_env, "ACTHELM_LOG_FORMAT": "json"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"claimed {task.pk}"

    lines = [line for line in result.stderr.splitlines() if line.strip()]
    records = [json.loads(line) for line in lines]  # each line parses on its own
    assert all(isinstance(r, dict) for r in records)
    by_event = {}
    for record in records:
        assert {"time", "level", "logger", "event"} <= record.keys()
        by_event.setdefault(record["event"], []).append(record)

    # The real claim logs through tasks.transitions with its structured fields.
    claimed = [r for r in by_event["task.claimed"] if r["logger"] == "acthelm.tasks"]
    assert len(claimed) == 1
    run_id = Task.objects.get(pk=task.pk).runs.get().pk
    assert claimed[0]["task_id"] == task.pk
    assert claimed[0]["run_id"] == run_id
    assert claimed[0]["worker"] == "host-a:4242:0"
    assert claimed[0]["level"] == "INFO"

    direct = [r for r in by_event["task.claimed"] if r["logger"] == "acthelm.worker"]
    assert direct[0]["task_id"] == 7 and direct[0]["run_id"] == 3

    # A traceback stays inside its one line.
    (crash,) = by_event["worker.crashed"]
    assert crash["level"] == "ERROR" and crash["task_id"] == 7
    assert crash["exc_type"] == "RuntimeError"
    assert "Traceback" in crash["exc"] and "second line" in crash["exc"]


def test_without_the_setting_logs_stay_plain_text(worker_env):
    TaskFactory(status=TaskStatus.READY)
    env = {k: v for k, v in worker_env.items() if k != "ACTHELM_LOG_FORMAT"}
    result = _run_child(env)
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stderr.splitlines() if "task.claimed" in x)
    assert "INFO acthelm.tasks task.claimed" in line
    with pytest.raises(json.JSONDecodeError):
        json.loads(line)


def _format(**kwargs) -> dict:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tests.json_formatter")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    try:
        logger.warning(kwargs.pop("msg"), *kwargs.pop("args", ()), extra=kwargs)
    finally:
        logger.handlers[:] = []
    output = stream.getvalue()
    assert output.count("\n") == 1
    return json.loads(output)


def test_format_arguments_make_the_event_name():
    """transitions log "task.%s" with the event kind as argument."""
    record = _format(msg="task.%s", args=("paused",), task_id=4, to="paused")
    assert record["event"] == "task.paused"
    assert record["task_id"] == 4 and record["to"] == "paused"
    assert record["level"] == "WARNING" and record["logger"] == "tests.json_formatter"
    assert record["time"].endswith("+00:00")


def test_values_that_json_cannot_hold_are_made_readable():
    class Request:
        method = "GET"
        path = "/metrics"

    record = _format(msg="http.request", request=Request(), ids={1, 2}, nested={"a": (1, None)})
    assert record["request"] == "GET /metrics"
    assert sorted(record["ids"]) == [1, 2]
    assert record["nested"] == {"a": [1, None]}


def test_extra_fields_cannot_overwrite_the_fixed_ones():
    record = _format(msg="task.claimed", level="fake", logger="fake", task_id=1)
    assert record["level"] == "WARNING"
    assert record["logger"] == "tests.json_formatter"
    assert record["event"] == "task.claimed"
