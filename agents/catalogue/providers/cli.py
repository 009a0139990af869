"""``cli``: a model command line tool (``llm``, ``claude -p``, ``codex exec``, ...).

The command is an argument list (never run through a shell). The conversation is rendered
into one prompt text and written to the process's stdin; the answer is stdout (stripped),
or, with ``answer_field`` set, a field of stdout parsed as JSON (dotted path such as
``result`` or ``choices.0.text``).

Tools are not supported (``supports_tools = False``): tool specs passed to ``complete()``
are ignored and the model can only answer with text. The API key, if any, is passed to the
child only through the environment variable named by ``api_key_env`` (never on the command
line); without ``api_key_env`` the key is not passed at all.

The child never inherits the server's environment: it gets ``PATH``, ``HOME``, ``LANG`` and its
one credential, nothing else, and runs in a scratch working directory removed afterwards. With
``allowed_executables`` set, only those executables may be started (an entry with a ``/`` must
equal ``command[0]``; a bare name matches a bare ``command[0]`` looked up on ``PATH``).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from typing import IO, Any

from core import fibers
from core.credentials import EXEC_PREFIX

from .base import (
    PROBE_PROMPT,
    PROVIDER_AUTH,
    PROVIDER_BAD_RESPONSE,
    PROVIDER_CANCELLED,
    PROVIDER_CLI_FAILED,
    PROVIDER_OUTPUT_TOO_LARGE,
    PROVIDER_QUOTA,
    PROVIDER_RATE_LIMITED,
    PROVIDER_TIMEOUT,
    PROVIDER_UNREACHABLE,
    Completion,
    Message,
    OnDelta,
    ProbeResult,
    Provider,
    ProviderError,
    ToolSpec,
    executable_refusal,
    register,
)

POLL_INTERVAL = 0.1
STDERR_CAP = 64 * 1024
#: After the main process exits, how long to wait for stdout/stderr to reach EOF (a
#: grandchild may have inherited them) before killing the process group.
EXIT_GRACE = 2.0
_CHUNK = 64 * 1024

_QUOTA_RE = re.compile(
    r"quota|billing|credit|usage limit|insufficient[_ ]funds|payment required|\b402\b",
    re.IGNORECASE,
)
_RATE_RE = re.compile(r"rate[ _-]?limit|\b429\b|too many requests", re.IGNORECASE)
_AUTH_RE = re.compile(
    r"\b401\b|\b403\b|unauthori[sz]ed|authenticat|invalid[ _-]?(x-)?api[ _-]?key|api key"
    r"|not logged in|log ?in\b|login|forbidden",
    re.IGNORECASE,
)

#: The only variables of the server's environment a model CLI child sees (besides its key).
CHILD_ENV_PASSED = ("PATH", "HOME", "LANG")
DEFAULT_LANG = "C.UTF-8"

_ROLE_LABELS = {"system": "SYSTEM", "user": "USER", "assistant": "ASSISTANT", "tool": "TOOL"}


def render_prompt(messages: list[Message]) -> str:
    """Render a conversation into one labelled prompt text (system messages first)."""
    system = [m for m in messages if m.role == "system" and m.content]
    rest = [m for m in messages if m.role != "system"]
    sections: list[str] = []
    if system:
        sections.append("=== SYSTEM ===\n" + "\n\n".join(m.content for m in system))
    for msg in rest:
        if msg.role == "tool":
            label = f"=== TOOL RESULT ({msg.name or msg.tool_call_id or 'tool'}) ==="
            sections.append(f"{label}\n{msg.content}")
            continue
        body = msg.content
        for call in msg.tool_calls:
            body += f"\n[called tool {call.name} with arguments {call.arguments_raw}]"
        sections.append(f"=== {_ROLE_LABELS[msg.role]} ===\n{body.strip()}")
    return "\n\n".join(s for s in sections if s).strip() + "\n"


def extract_field(data: Any, path: str) -> Any:
    """Follow a dotted path (``a.b.0.c``) through dicts and lists; KeyError if missing."""
    current = data
    for part in path.split("."):
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.lstrip("-").isdigit():
            index = int(part)
            if not -len(current) <= index < len(current):
                raise KeyError(path)
            current = current[index]
        else:
            raise KeyError(path)
    return current


def classify_failure(text: str) -> str:
    """Error code for a failed CLI run from its stderr+stdout text."""
    if _QUOTA_RE.search(text):
        return PROVIDER_QUOTA
    if _RATE_RE.search(text):
        return PROVIDER_RATE_LIMITED
    if _AUTH_RE.search(text):
        return PROVIDER_AUTH
    return PROVIDER_CLI_FAILED


class _Reader(threading.Thread):
    """Drain a pipe incrementally. With ``keep_tail`` the oldest bytes beyond ``cap`` are
    discarded (stderr); otherwise reading stops and ``overflow`` is set past ``cap``."""

    def __init__(self, pipe: IO[bytes], cap: int, keep_tail: bool) -> None:
        super().__init__(daemon=True)
        self.pipe = pipe
        self.cap = cap
        self.keep_tail = keep_tail
        self.buffer = bytearray()
        self.overflow = threading.Event()
        self.eof = threading.Event()

    def run(self) -> None:
        fd = self.pipe.fileno()
        try:
            while True:
                chunk = os.read(fd, _CHUNK)
                if not chunk:
                    break
                self.buffer += chunk
                if len(self.buffer) > self.cap:
                    if self.keep_tail:
                        del self.buffer[: len(self.buffer) - self.cap]
                    else:
                        self.overflow.set()
                        return
        except OSError:
            pass
        finally:
            self.eof.set()

    def text(self) -> str:
        return bytes(self.buffer).decode("utf-8", "replace")


@register
class CLIProvider(Provider):
    kind = "cli"
    label = "Model CLI"
    telemetry_name = "acthelm.cli"
    supports_tools = False
    supports_cancel = True
    needs_base_url = False
    needs_command = True

    @classmethod
    def connection_arguments(
        cls,
        *,
        base_url: str,
        command: list[str],
        answer_field: str,
        credential_env: str,
        allowed_executables: list[str],
    ) -> dict[str, Any]:
        """The command, its answer field and the allow-list; the key reaches the child only
        through the connection's own variable name."""
        arguments: dict[str, Any] = {
            "command": list(command),
            "answer_field": answer_field,
            "allowed_executables": list(allowed_executables),
        }
        if credential_env:
            arguments["api_key_env"] = credential_env
        return arguments

    @classmethod
    def credential_destination(cls, *, base_url: str, command: list[str] | None) -> str:
        """The child gets the key in its environment: the destination is the program."""
        return f"{EXEC_PREFIX}{command[0] if command else ''}"

    def __init__(self, *, allowed_executables: list[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not self.command:
            raise ValueError("the cli provider needs a non-empty command list")
        if isinstance(kwargs.get("command"), str):
            raise ValueError("command must be a list of arguments, not a shell string")
        refusal = executable_refusal(self.command, allowed_executables or [])
        if refusal and not self.config_error:
            self.config_error = refusal

    def child_env(self) -> dict[str, str]:
        """PATH, HOME, LANG and the one credential: never the server's other variables."""
        env = {name: os.environ[name] for name in CHILD_ENV_PASSED if os.environ.get(name)}
        env.setdefault("LANG", DEFAULT_LANG)
        if self.api_key_env and self.api_key:
            env[self.api_key_env] = self.api_key
        return env

    def complete(
        self,
        *,
        model: str,
        messages: list[Message],
        tools: list[ToolSpec],
        max_tokens: int,
        cancel_event: threading.Event | None = None,
        on_delta: OnDelta | None = None,
    ) -> Completion:
        # ``tools``, ``max_tokens`` and ``on_delta`` are ignored: a CLI has no tool-calling
        # interface, its output limit is configured in its own arguments, and it answers whole.
        prompt = render_prompt(messages)
        stdout = self.run(prompt, cancel_event=cancel_event)
        return self.parse_output(stdout, model)

    def run(self, prompt: str, *, cancel_event: threading.Event | None = None) -> str:
        """Run the command with ``prompt`` on stdin; return stdout (decoded, unstripped)."""
        self.check_config()
        if cancel_event is not None and cancel_event.is_set():
            raise self.error(PROVIDER_CANCELLED, "cancelled before the command was started")
        with tempfile.TemporaryDirectory(prefix="acthelm-cli-", ignore_cleanup_errors=True) as cwd:
            return self._run_in(prompt, cwd, cancel_event)

    def _run_in(self, prompt: str, cwd: str, cancel_event: threading.Event | None) -> str:
        try:
            proc = subprocess.Popen(
                self.command,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=self.child_env(),
                cwd=cwd,
                start_new_session=True,
                close_fds=True,
            )
        except FileNotFoundError:
            raise self.error(
                PROVIDER_UNREACHABLE, f"executable not found: {self.command[0]!r}"
            ) from None
        except PermissionError:
            raise self.error(
                PROVIDER_UNREACHABLE, f"executable not runnable: {self.command[0]!r}"
            ) from None
        except OSError as exc:
            raise self.error(
                PROVIDER_UNREACHABLE, f"cannot start {self.command[0]!r}: {exc}"
            ) from None

        assert proc.stdin and proc.stdout and proc.stderr
        out = _Reader(proc.stdout, self.max_response_bytes, keep_tail=False)
        err = _Reader(proc.stderr, STDERR_CAP, keep_tail=True)
        writer = threading.Thread(target=_write_stdin, args=(proc.stdin, prompt), daemon=True)
        out.start()
        err.start()
        writer.start()
        deadline = time.monotonic() + self.timeout
        exited_at: float | None = None
        try:
            while True:
                if out.overflow.is_set():
                    _kill_group(proc)
                    raise self.error(
                        PROVIDER_OUTPUT_TOO_LARGE,
                        f"output exceeded {self.max_response_bytes} bytes; process killed",
                    )
                if cancel_event is not None and cancel_event.is_set():
                    _kill_group(proc)
                    raise self.error(PROVIDER_CANCELLED, "cancelled by the caller")
                now = time.monotonic()
                if now >= deadline:
                    _kill_group(proc)
                    raise self.error(
                        PROVIDER_TIMEOUT, f"command did not finish within {self.timeout:g} s"
                    )
                if proc.poll() is not None:
                    if out.eof.is_set() and err.eof.is_set():
                        break
                    if exited_at is None:
                        exited_at = now
                    elif now - exited_at > EXIT_GRACE:
                        _kill_group(proc)  # a leftover grandchild holds the pipes open
                        out.eof.wait(1.0)
                        err.eof.wait(1.0)
                        break
                fibers.wait_event(out.eof, POLL_INTERVAL)  # a run in a fiber holds no step thread
        finally:
            if proc.poll() is None:
                _kill_group(proc)
            _finish(proc, out, err, writer)

        if out.overflow.is_set():
            raise self.error(
                PROVIDER_OUTPUT_TOO_LARGE, f"output exceeded {self.max_response_bytes} bytes"
            )
        stdout = out.text()
        code = proc.returncode
        if code != 0:
            stderr = err.text()
            code_for = classify_failure(f"{stderr}\n{stdout[-2000:]}")
            detail = f"killed by signal {-code}" if code < 0 else f"exited with code {code}"
            # Redacted before the tail is cut (and the start of a kept stderr tail may begin
            # inside the key: the helper redacts such a piece too).
            tail = self.redact(stderr.strip() or stdout.strip())[-500:]
            raise self.error(code_for, f"command {detail}: {tail}", status=code)
        return stdout

    def parse_output(self, stdout: str, model: str) -> Completion:
        input_tokens = output_tokens = 0
        if not self.answer_field:
            text = stdout.strip()
        else:
            try:
                data = json.loads(stdout)
            except ValueError:
                raise self.error(
                    PROVIDER_BAD_RESPONSE,
                    f"output is not valid JSON: {self.redact(stdout.strip())[:200]!r}",
                ) from None
            if isinstance(data, dict) and data.get("is_error") is True:
                # e.g. ``claude -p --output-format json`` reports failures this way
                detail = self.redact(str(data.get("result") or data.get("error") or "error"))[:500]
                raise self.error(classify_failure(detail), f"command reported an error: {detail}")
            try:
                value = extract_field(data, self.answer_field)
            except KeyError:
                raise self.error(
                    PROVIDER_BAD_RESPONSE,
                    f"field {self.answer_field!r} not found in output",
                ) from None
            if value is None:
                raise self.error(PROVIDER_BAD_RESPONSE, f"field {self.answer_field!r} is null")
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            text = text.strip()
            usage = data.get("usage") if isinstance(data, dict) else None
            if isinstance(usage, dict):
                input_tokens = sum(
                    _int(usage.get(key))
                    for key in (
                        "input_tokens",
                        "cache_read_input_tokens",
                        "cache_creation_input_tokens",
                    )
                )
                output_tokens = _int(usage.get("output_tokens"))
        return Completion(
            text=text,
            tool_calls=[],
            stop_reason="end",
            raw_stop_reason="exit_0",
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            model=model,
        )

    def probe(self, *, model: str, tools: bool) -> ProbeResult:
        try:
            answer = self.complete(
                model=model,
                messages=[Message(role="user", content=PROBE_PROMPT)],
                tools=[],
                max_tokens=16,
            )
        except ProviderError as exc:
            return ProbeResult(ok=False, message=str(exc), error_code=exc.code)
        supports_tools = False if tools else None
        if not answer.text:
            return ProbeResult(
                ok=False,
                message="command succeeded but printed an empty answer",
                supports_tools=supports_tools,
                error_code=PROVIDER_BAD_RESPONSE,
            )
        message = f"command answered: {answer.text[:80]!r}"
        if tools:
            message += "; note: the cli provider does not support tool calling"
        return ProbeResult(ok=True, message=message, supports_tools=supports_tools)


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def _write_stdin(pipe: IO[bytes], prompt: str) -> None:
    # The command may not read stdin at all (or may die): that is not an error here.
    with contextlib.suppress(OSError, ValueError):
        try:
            pipe.write(prompt.encode("utf-8"))
            pipe.flush()
        finally:
            pipe.close()


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        proc.kill()


def _finish(
    proc: subprocess.Popen[bytes], out: _Reader, err: _Reader, writer: threading.Thread
) -> None:
    with contextlib.suppress(subprocess.TimeoutExpired):  # SIGKILL cannot be ignored
        proc.wait(timeout=5)
    for thread in (out, err, writer):
        thread.join(timeout=1.0)
    for pipe in (proc.stdout, proc.stderr, proc.stdin):
        if pipe is not None:
            with contextlib.suppress(OSError, ValueError):
                pipe.close()
