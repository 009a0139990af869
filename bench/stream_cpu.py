"""The CPU a streamed answer costs the worker's side, against the same answer whole: a 200-word
answer from the scripted model (`tests/fakes/model_server.py`, in a process of its own, on
loopback), asked `--turns` times each way, alternately, from one process.

    python bench/stream_cpu.py [--turns 200] [--words 200]

Prints the process CPU (`time.process_time`) and wall time per turn, and the pieces per turn.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--words", type=int, default=200)
    args = parser.parse_args()
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "acthelm_site.settings")
    import django

    django.setup()
    from agents.catalogue.providers import Message, build_provider

    text = " ".join(f"word{i}" for i in range(args.words))
    ready = Path(tempfile.mkdtemp()) / "ready"
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tests.fakes.model_server",
            "--ready-file",
            str(ready),
            "--default",
            json.dumps({"type": "text", "text": text}),
        ],
        cwd=ROOT,
    )
    try:
        while not ready.exists():
            time.sleep(0.05)
        provider = build_provider("openai_compatible", base_url=ready.read_text())
        ask = {
            "model": "test-model",
            "messages": [Message(role="user", content="hi")],
            "tools": [],
            "max_tokens": args.words * 2,
        }
        for mode in ("whole", "streamed", "whole", "streamed"):
            pieces: list[dict[str, object]] = []
            kwargs = {"on_delta": lambda k, d, p=pieces: p.append(d)} if mode == "streamed" else {}
            cpu, wall = time.process_time(), time.monotonic()
            for _ in range(args.turns):
                assert provider.complete(**ask, **kwargs).text == text
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
            print(
                f"{mode:9s} {1000 * cpu / args.turns:.2f} ms CPU/turn, "
                f"{1000 * wall / args.turns:.2f} ms wall/turn, "
                f"{len(pieces) / args.turns:.0f} pieces/turn",
                flush=True,
            )
    finally:
        server.terminate()
        server.wait()


if __name__ == "__main__":
    main()
