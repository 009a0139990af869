"""`make run`'s processes (bin/run-demo): one Ctrl-C stops the console, the worker and the demo
model once and cleanly (issue 24: the old trap re-entered itself and the worker got two signals)."""

import os
import re
import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.django_db(transaction=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def answers(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.2):
            return True
    except OSError:
        return False


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_one_ctrl_c_stops_all_three_once(worker_env, tmp_path):
    console, model = free_port(), free_port()
    log = tmp_path / "run.log"
    with log.open("w") as out:
        # Its own process group, as make's recipe is the terminal's foreground group.
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "bin" / "run-demo"), "--port", str(console),
             "--demo-model-port", str(model)],
            env=worker_env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            deadline = time.monotonic() + 60
            while not (answers(console) and answers(model) and "worker.started" in log.read_text()):
                assert proc.poll() is None, log.read_text()
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.2)
            pids = [int(p) for p in re.findall(r"pid (\d+)", log.read_text())]
            assert len(pids) == 3
            os.killpg(proc.pid, signal.SIGINT)  # what the terminal sends on Ctrl-C
            assert proc.wait(timeout=45) == 0
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
    text = log.read_text()
    assert not any(alive(pid) for pid in pids), text
    assert text.count("worker.stopping") == 1, text  # one signal reached the worker
    assert "worker.exit_now" not in text and "Traceback" not in text, text
    assert "killing" not in text, text  # each stopped on its one SIGTERM
