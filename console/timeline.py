"""The timeline's details written for a person: a line or two per event, not its raw data.

A small formatter per event kind; any other event (or data a formatter does not expect) falls back
to one "key: value" line per field. Long values are cut, so one event cannot flood the page.
"""

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any

from django.utils import timezone

from console.shared import show
from tasks.models import TaskEvent
from tasks.states import EventKind, TaskStatus

VALUE_CHARS = 200
# Internals a person does not read: row ids, claim counters, the claim's fencing numbers.
_SKIP = frozenset(
    {"tool_call_id", "run_id", "model_id", "check", "newest_run_id_before", "claim_count"}
)
# An event's data: JSON, written by whichever service recorded the event.
type EventData = dict[str, Any]


def _words(value: object) -> str:
    """A value as words: a mapping as "name value, name value", a list comma-separated (never
    JSON's braces and quotes)."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(
            f"{str(k).replace('_', ' ')} {_words(v)}"
            for k, v in value.items()
            if str(k) not in _SKIP and v not in (None, "", [], {})
        )
    if isinstance(value, list | tuple):
        return ", ".join(_words(v) for v in value)
    return json.dumps(value, ensure_ascii=False, default=str)


def _text(value: object) -> str:
    text = _words(value)
    return text if len(text) <= VALUE_CHARS else text[: VALUE_CHARS - 1] + "…"


def _fields(data: EventData) -> list[str]:
    return [
        f"{key.replace('_', ' ')}: {_text(value)}"
        for key, value in data.items()
        if key not in _SKIP and value not in (None, "", [], {})
    ]


def _cancelled(data: EventData) -> list[str]:
    runs = data.get("runs_cancelled") or 0
    lines = [f"Reason: {_text(data['reason'])}"] if data.get("reason") else []
    if runs:
        lines.append(f"{runs} running attempt{'s' if runs != 1 else ''} ended")
    return lines


def _decided(data: EventData) -> list[str]:
    """An approval's decision: the tool and target; an edit's hashes and arguments, before and
    after; a denial's message."""
    lines = [f"{data.get('tool', 'a tool')} {_text(data.get('target') or '')}".rstrip()]
    if data.get("edited"):
        before, after = data.get("arguments_hash", ""), data.get("edited_arguments_hash", "")
        lines.append(f"Arguments edited by the person: hash {before[:12]} → {after[:12]}")
        lines.append(f"Proposed: {_text(data.get('original_arguments'))}")
        lines.append(f"Runs with: {_text(data.get('edited_arguments'))}")
    if data.get("message"):
        lines.append(f"Message to the model: {_text(data['message'])}")
    return lines


def _limits_changed(data: EventData) -> list[str]:
    before, after = data.get("before") or {}, data.get("after") or {}
    return [f"{name}: {before.get(name, '?')} → {value}" for name, value in after.items()]


def _on_model(data: EventData) -> list[str]:
    lines = []
    if data.get("previous_failure"):
        lines.append(f"After: {data['previous_failure']}")
    if data.get("model"):
        lines.append(f"On {data['model']}")
    if data.get("start_over"):
        lines.append("Started over: a fresh conversation from the instruction")
    elif data.get("change_sent"):
        lines.append("The model is told what changed: " + ", ".join(map(str, data["change_sent"])))
    return lines


def _when(value: object) -> str:
    """An ISO time from an event's data as the page's other times read: "2026-12-07 05:04:21
    UTC" (anything else as it is)."""
    try:
        when = datetime.fromisoformat(str(value))
    except ValueError:
        return _text(value)
    if timezone.is_aware(when):
        when = timezone.localtime(when)
    return f"{when:%Y-%m-%d %H:%M:%S} {when.tzname() or ''}".rstrip()


def _tool(data: EventData) -> list[str]:
    line = f"{data.get('tool', 'a tool')}"
    if "ok" in data:
        line += " succeeded" if data["ok"] else f" failed ({data.get('error') or 'error'})"
    if isinstance(data.get("chars"), int):
        line += f", {data['chars']:,} characters"
    rest = {k: v for k, v in data.items() if k not in ("tool", "ok", "error", "chars")}
    return [line, *_fields(rest)]


def _code(data: EventData) -> list[str]:
    head = f"{data['code']}: {_text(data.get('message') or '')}".rstrip(": ")
    return [head, *_fields({k: v for k, v in data.items() if k not in ("code", "message")})]


def _retry(data: EventData) -> list[str]:
    """A failed attempt and the next one: "Attempt 1 of 3 failed; attempt 2 runs in 60 s"
    (a move to another connection or a wait for a cooldown has no attempt number)."""
    failed = data.get("attempt")
    if not isinstance(failed, int):
        return _code(data) if "code" in data else _fields(data)
    of = data.get("of")
    head = f"Attempt {failed}{f' of {of}' if of else ''} failed; attempt {failed + 1} runs"
    delay = data.get("delay_seconds")
    head += f" in {delay} s" if isinstance(delay, int) and delay else " now"
    rest = {k: v for k, v in data.items() if k not in ("attempt", "of", "delay_seconds")}
    return [head, *_code(rest)] if "code" in rest else [head, *_fields(rest)]


def _checks(data: EventData) -> list[str]:
    """The acceptance checks a verdict ran: how many passed, and each that failed or could not
    be checked (unverified) by name."""
    checks = [c for c in data.get("checks") or [] if isinstance(c, dict)]
    if not checks:
        return []
    unseen = [_text(c.get("check", "?")) for c in checks if c.get("unverified")]
    failed = [
        _text(c.get("check", "?"))
        for c in checks
        if not c.get("passed") and not c.get("unverified")
    ]
    passed = len(checks) - len(failed) - len(unseen)
    line = f"Checks: {passed} of {len(checks)} passed"
    line += f"; failed: {', '.join(failed)}" if failed else ""
    line += f"; unverified: {', '.join(unseen)}" if unseen else ""
    return [line]


def _verdict(data: EventData) -> list[str]:
    head = [f"Verdict: {data['verdict']}"] if data.get("verdict") else []
    reason = [f"Reason: {_text(data['reason'])}"] if data.get("reason") else []
    return [*head, *reason, *_checks(data)]


def _accepted(data: EventData) -> list[str]:
    """A person accepted the run the supervisor rejected: why, which run, what had failed."""
    lines = [f"Reason: {_text(data.get('reason', ''))}"]
    if data.get("run"):
        lines.append(f"Run {data['run']} accepted into review over the supervisor's rejection")
    failed = [c for c in data.get("failed_checks") or [] if isinstance(c, dict)]
    if failed:
        names = ", ".join(
            f"{_text(c.get('check', '?'))} ({c.get('source', 'check')})" for c in failed
        )
        lines.append(f"Failed checks: {names}")
    if data.get("retry_cancelled"):
        lines.append(f"Scheduled retry cancelled (was due {_when(data['retry_cancelled'])})")
    return lines


def _edited(data: EventData) -> list[str]:
    """Each changed setting, before → after."""
    before, after = data.get("before") or {}, data.get("after") or {}
    return [
        f"{name.replace('_', ' ')}: {_text(before.get(name))} → {_text(after.get(name))}"
        for name in data.get("fields") or sorted(after)
    ]


def _model_turn(data: EventData) -> list[str]:
    """The model answered: how many tool calls it asked for, the tokens it took, and why it
    stopped when that was not the ordinary end of a turn."""
    calls = data.get("tool_calls") or 0
    line = f"Turn {data['turn']}: " if isinstance(data.get("turn"), int) else ""
    line += f"{calls} tool call{'s' if calls != 1 else ''}" if calls else "an answer"
    if isinstance(data.get("tokens"), int):
        line += f", {data['tokens']:,} tokens"
    lines = [line]
    if data.get("discarded"):
        lines.append(f"Discarded unrun (stopped: {_text(data.get('stop_reason') or '?')})")
    if data.get("adjusted"):
        lines.append(f"Adjusted: {_text(data['adjusted'])}")
    return lines


def _dependency(data: EventData) -> list[str]:
    return [f"Task #{data.get('dependency')} is {data.get('dependency_status', 'stuck')}"]


FORMATTERS: dict[str, Callable[[EventData], list[str]]] = {
    EventKind.CANCELLED: _cancelled,
    EventKind.APPROVED: _decided,
    EventKind.DENIED: _decided,
    EventKind.LIMITS_CHANGED: _limits_changed,
    EventKind.RESUMED: _on_model,
    EventKind.RETRIED: _on_model,
    EventKind.REOPENED: lambda data: [f"Feedback: {_text(data.get('feedback', ''))}"],
    EventKind.REJECTED: _verdict,
    EventKind.SUBMITTED: _verdict,
    EventKind.TOOL_RESULT: _tool,
    EventKind.APPROVAL_REQUESTED: _tool,
    EventKind.FAILED: _code,
    EventKind.RETRY_SCHEDULED: _retry,
    EventKind.UNBLOCK_BLOCKED: _dependency,
    EventKind.ACCEPTED: _accepted,
    EventKind.EDITED: _edited,
    EventKind.MODEL_TURN: _model_turn,
}


def event_details(event: TaskEvent) -> list[str]:
    """Lines a person reads for this event's data."""
    data = event.data
    if not data:
        return []
    if not isinstance(data, dict):
        return [_text(data)]
    formatter = FORMATTERS.get(event.kind)
    if formatter is not None:
        try:
            return formatter(data)
        except (KeyError, TypeError, AttributeError, ValueError):
            pass  # data of another shape than expected: show it field by field
    return _fields(data)


def _state_word(status: str) -> str:
    return str(TaskStatus(status).label) if status in TaskStatus.values else status or "·"


def state_change(event: TaskEvent) -> str:
    """ "In progress → Awaiting approval": the states' words, not their codes."""
    if not (event.from_status or event.to_status):
        return ""
    return f"{_state_word(event.from_status)} → {_state_word(event.to_status)}"


def timeline_rows(events: list[TaskEvent]) -> list[TaskEvent]:
    """The events as the timeline's rows, oldest first, each with its `details` and `state`
    words. The run that stops for an approval records the request (tool, target, why) and then
    its move to `awaiting_approval` under the same kind: one row says both."""
    rows: list[TaskEvent] = []
    for event in events:
        details, state = event_details(event), state_change(event)
        last = rows[-1] if rows else None
        if (
            last is not None
            and event.kind == EventKind.APPROVAL_REQUESTED == last.kind
            and state
            and not details
            and not getattr(last, "state", "")
            and last.run_id == event.run_id
        ):
            show(last, state=state)
            continue
        show(event, details=details, state=state)
        rows.append(event)
    return rows
