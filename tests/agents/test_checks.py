"""Settings that contradict each other are refused by `manage.py check` and by the worker."""

import os
import subprocess
import sys

import pytest
from django.core.checks import run_checks

from tests.agents.conftest import ROOT


def ids() -> list[str]:
    return sorted(m.id for m in run_checks(tags=["acthelm"]))


def test_the_defaults_pass(settings):
    assert ids() == []


def test_a_heartbeat_not_shorter_than_the_lease_is_an_error(settings):
    settings.ACTHELM_LEASE_SECONDS = 10
    settings.ACTHELM_HEARTBEAT_SECONDS = 10
    assert ids() == ["acthelm.E003"]
    settings.ACTHELM_HEARTBEAT_SECONDS = 6
    assert ids() == ["acthelm.W001"]
    settings.ACTHELM_HEARTBEAT_SECONDS = 3
    assert ids() == []


@pytest.mark.parametrize("name", ["ACTHELM_RETRY_DELAYS", "ACTHELM_NOTIFY_RETRY_DELAYS"])
@pytest.mark.parametrize("value", [[], [60, -1]])
def test_an_empty_or_negative_retry_table_is_an_error(settings, name, value):
    setattr(settings, name, value)
    assert ids() == ["acthelm.E002"]


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("ACTHELM_LEASE_SECONDS", 0),
        ("ACTHELM_DB_POOL_SIZE", 0),
        ("ACTHELM_CLAIM_BATCH", -5),
        ("ACTHELM_MAX_ATTEMPTS", 0),  # a task needs one attempt at least
    ],
)
def test_a_number_that_must_be_positive(settings, name, value):
    setattr(settings, name, value)
    assert ids() == ["acthelm.E001"]


def test_a_run_timeout_shorter_than_the_lease_is_a_warning(settings):
    settings.ACTHELM_RUN_TIMEOUT_SECONDS = 30
    assert ids() == ["acthelm.W002"]


def test_the_worker_refuses_to_start_with_them(db):
    env = {**os.environ, "ACTHELM_LEASE_SECONDS": "5", "ACTHELM_HEARTBEAT_SECONDS": "5"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "acthelm_worker", "--burst"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode != 0
    assert "acthelm.E003" in done.stderr and "ACTHELM_HEARTBEAT_SECONDS" in done.stderr
