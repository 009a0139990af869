"""A scripted stand-in for a model CLI, so `make run` shows the whole loop with no provider.

It reads the prompt on stdin and answers with a short, deterministic report that quotes the
task's instruction. Real deployments use `llm`, `claude -p`, `codex exec` or an HTTP provider.
"""

import re
import sys


def answer(prompt: str) -> str:
    match = re.search(r"## Task\s*\n(.+?)(\n## |\Z)", prompt, re.S)
    instruction = (match.group(1) if match else prompt).strip().splitlines()[0][:300]
    return (
        "Summary (demo model)\n\n"
        f"The task asked: {instruction}\n"
        "I read the instruction, worked through it step by step and recorded this answer.\n"
        "A person reviews and closes the task."
    )


if __name__ == "__main__":
    sys.stdout.write(answer(sys.stdin.read()))
