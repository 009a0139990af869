"""Acceptance checks: what "finished" means for one task, checked deterministically by the
supervisor before its rules and before any model.

A person attaches checks to a task (`acthelm_task create --expect KIND=VALUE`, the console's New
task form, the API's `expect`); they are validated here when the task is created and stored on
`Task.acceptance_checks` as ``[{"kind": ..., "value": ...}]`` (plus ``"artifact"`` for the kinds
about one artifact's content). The kinds are the evaluation grader's (`agents.eval.grading`) that
make sense for real work, over the same record (`RunRecord`, which the grader's extends), with the
same text normalisation:

=======================  ===========================================================================
kind=VALUE               passes when
=======================  ===========================================================================
artifact=NAME            an artifact is named NAME (a shell pattern such as ``*.md`` may be given)
no_artifact=NAME         no artifact matches NAME
only_artifacts=A,B       every artifact matches one of A, B (empty: no artifact at all)
artifact_contains=N:T    an artifact matches N and every one that does contains T
artifact_not_contains=N:T  no artifact matching N contains T
artifact_matches=N:RE    an artifact matches N and every one that does matches RE
answer_contains=T        the answer contains T (case-insensitive, whitespace collapsed)
answer_not_contains=T    the answer does not contain T
answer_matches=RE        the answer matches RE (a search, case-insensitive, multi-line)
tool_ran=TOOL            TOOL succeeded at least once
tool_not_run=TOOL        TOOL never executed (a refused or denied call is fine)
tool_not_called=TOOL     the model never called TOOL at all
answer_not_echo          the answer is not the instruction repeated back
=======================  ===========================================================================

Regular expressions are a person's input run against a model's output, both untrusted in size:
they are compiled with RE2 (linear time in the text whatever the pattern, no catastrophic
backtracking, the GIL released while it searches; `RE2_MAX_MEM` bounds its memory) and at most 500
characters long; a pattern RE2 cannot run (lookarounds, backreferences) is refused at creation, not
at the verdict.

What a verdict reads of a run (`RunRecord`, within a `Budget`): `agents.engine.verdict.evidence`.
Running the checks over it, and the default checks: `agents.engine.verdict.checking`.
"""

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, NotRequired, Protocol, TypedDict

import re2

from core.exceptions import ErrorCode, InvalidInput

FIELD = "acceptance_checks"
MAX_CHECKS = 50
MAX_VALUE_CHARS = 1000
MAX_PATTERN_CHARS = 500
RE2_MAX_MEM = 8 << 20


class Check(TypedDict):
    """A check as stored in `Task.acceptance_checks`."""

    kind: str
    value: str
    artifact: NotRequired[str]  # the kinds about one artifact's content


class InvalidCheck(InvalidInput):
    error = ErrorCode.ACCEPTANCE_CHECK_INVALID
    field = FIELD


@dataclass(frozen=True)
class Kind:
    name: str
    help: str
    value: str = "text"  # text | pattern | name | names | tool | artifact_text | artifact_pattern
    needs_value: bool = True


KINDS: dict[str, Kind] = {
    k.name: k
    for k in (
        Kind("artifact", "an artifact with this name (or shell pattern) exists", "name"),
        Kind("no_artifact", "no artifact with this name (or pattern) exists", "name"),
        Kind(
            "only_artifacts",
            "no artifact other than these (comma-separated names or patterns; empty: none)",
            "names",
            needs_value=False,
        ),
        Kind("artifact_contains", "NAME:TEXT — the artifact contains the text", "artifact_text"),
        Kind(
            "artifact_not_contains",
            "NAME:TEXT — the artifact does not contain the text",
            "artifact_text",
        ),
        Kind(
            "artifact_matches",
            "NAME:REGEX — the artifact matches the regular expression",
            "artifact_pattern",
        ),
        Kind("answer_contains", "the answer contains the text"),
        Kind("answer_not_contains", "the answer does not contain the text"),
        Kind("answer_matches", "the answer matches the regular expression (RE2)", "pattern"),
        Kind("tool_ran", "the tool succeeded at least once", "tool"),
        Kind("tool_not_run", "the tool never executed", "tool"),
        Kind("tool_not_called", "the model never called the tool", "tool"),
        Kind(
            "answer_not_echo",
            "the answer is not the instruction repeated back",
            "none",
            needs_value=False,
        ),
    )
}


# --- Parsing and validation ------------------------------------------------------------------


class Pattern(Protocol):
    """What is used of a compiled RE2 pattern (the re2 module has no types)."""

    programsize: int

    def search(self, text: str | bytes | bytearray) -> object | None: ...


def compile_pattern(pattern: str | bytes) -> Pattern:
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = False
    options.posix_syntax = False
    options.never_nl = False
    options.max_mem = RE2_MAX_MEM
    compiled: Pattern = re2.compile(pattern, options)
    return compiled


def _pattern_error(pattern: str) -> str | None:
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"a regular expression is at most {MAX_PATTERN_CHARS} characters"
    try:
        compile_pattern(pattern)
    except re2.error as exc:
        detail = exc.args[0] if exc.args else exc
        if isinstance(detail, bytes):
            detail = detail.decode("utf-8", "replace")
        return (
            f"{pattern!r} is not a regular expression the linear-time engine (RE2) can run "
            f"({detail}): lookarounds, backreferences and repetition counts above 1000 are "
            "not supported"
        )
    return None


def parse_check(text: str) -> Check:
    """One check from its text form ``KIND=VALUE`` (``answer_not_echo`` alone is fine)."""
    kind, sep, value = (text or "").strip().partition("=")
    kind = kind.strip()
    if not sep and kind in KINDS and not KINDS[kind].needs_value:
        return _normalise({"kind": kind, "value": ""})
    if not sep:
        raise InvalidCheck(f"a check looks like KIND=VALUE, not {text!r} (kinds: {kind_names()})")
    return _normalise(_split_artifact({"kind": kind, "value": value.strip()}))


def _split_artifact(check: dict[str, Any]) -> dict[str, Any]:
    spec = KINDS.get(check["kind"])
    if spec is not None and spec.value.startswith("artifact_") and "artifact" not in check:
        name, sep, rest = check["value"].partition(":")
        if not sep or not name.strip():
            raise InvalidCheck(
                f"{check['kind']} looks like {check['kind']}=NAME:TEXT, not {check['value']!r}"
            )
        return {"kind": check["kind"], "artifact": name.strip(), "value": rest.strip()}
    return check


def kind_names() -> str:
    return ", ".join(KINDS)


def _normalise(check: object) -> Check:
    """A validated check as stored; raises InvalidCheck naming the problem."""
    if not isinstance(check, dict) or not isinstance(check.get("kind"), str):
        raise InvalidCheck('a check is {"kind": KIND, "value": VALUE}')
    unknown_keys = sorted(set(check) - {"kind", "value", "artifact"})
    if unknown_keys:
        raise InvalidCheck(f"a check has no field {', '.join(unknown_keys)}")
    kind = check["kind"].strip()
    spec = KINDS.get(kind)
    if spec is None:
        raise InvalidCheck(f"unknown check kind {kind!r} (known: {kind_names()})")
    value = _checked_value(kind, spec, check.get("value", ""))
    out: Check = {"kind": kind, "value": "" if spec.value == "none" else value}
    if spec.value.startswith("artifact_"):
        out["artifact"] = _checked_artifact_name(kind, check.get("artifact"))
    elif "artifact" in check:
        raise InvalidCheck(f"{kind} is not about one artifact: it takes no artifact name")
    if spec.value in ("pattern", "artifact_pattern"):
        problem = _pattern_error(value)
        if problem:
            raise InvalidCheck(f"{kind}: {problem}")
    if spec.value == "tool" and (len(value) > 100 or not re.fullmatch(r"[\w.-]+", value)):
        raise InvalidCheck(f"{kind}: {value!r} is not a tool name")
    return out


def _checked_value(kind: str, spec: Kind, value: object) -> str:
    """The check's value, stripped: text, bounded, present when the kind needs one."""
    if value is None:
        value = ""
    if not isinstance(value, str):
        raise InvalidCheck(f"{kind}: the value must be text")
    value = value.strip()
    if "\x00" in value:
        raise InvalidCheck(f"{kind}: the value contains a NUL character")
    if len(value) > MAX_VALUE_CHARS:
        raise InvalidCheck(f"{kind}: the value is at most {MAX_VALUE_CHARS} characters")
    if spec.needs_value and not value:
        raise InvalidCheck(f"{kind} needs a value: {spec.help}")
    if spec.value == "none" and value and value.lower() not in ("true", "yes", "1"):
        raise InvalidCheck(f"{kind} takes no value")
    return value


def _checked_artifact_name(kind: str, name: object) -> str:
    """The name of the artifact a check is about, stripped and bounded."""
    if not isinstance(name, str) or not name.strip():
        raise InvalidCheck(f"{kind} needs the artifact's name (NAME:TEXT)")
    if len(name) > 200:
        raise InvalidCheck(f"{kind}: an artifact name is at most 200 characters")
    return name.strip()


def validate_checks(values: object, *, tools: Collection[str] | None = None) -> list[Check]:
    """Checks as stored, from a list of dicts or ``KIND=VALUE`` texts (what the CLI, the form and
    the API give). `tools`: the task's tool list — a `tool_ran` check for a tool the task does not
    have could never pass, so it is refused."""
    if values is None:
        return []
    if isinstance(values, str | dict) or not isinstance(values, list | tuple):
        raise InvalidCheck("acceptance checks are a list")
    if len(values) > MAX_CHECKS:
        raise InvalidCheck(f"a task has at most {MAX_CHECKS} acceptance checks")
    out: list[Check] = []
    for item in values:
        if isinstance(item, str):
            if not item.strip():
                continue
            check = parse_check(item)
        else:
            check = _normalise(_split_artifact(item) if isinstance(item, dict) else item)
        if check["kind"] == "tool_ran" and tools is not None and check["value"] not in tools:
            raise InvalidCheck(
                f"tool_ran={check['value']}: the task does not have that tool "
                f"(its tools: {', '.join(tools) or 'none'})"
            )
        if check not in out:
            out.append(check)
    return out


def check_text(check: Check) -> str:
    """The check as a person writes it (and `parse_check` reads it back)."""
    if check["kind"] in KINDS and not KINDS[check["kind"]].needs_value and not check["value"]:
        return check["kind"] if check["kind"] == "answer_not_echo" else f"{check['kind']}="
    if "artifact" in check:
        return f"{check['kind']}={check['artifact']}:{check['value']}"
    return f"{check['kind']}={check['value']}"


def checks_from_lines(text: str) -> list[str]:
    """The console form's textarea: one check per line, blank lines and # comments ignored."""
    lines = [line.strip() for line in (text or "").splitlines()]
    return [line for line in lines if line and not line.startswith("#")]
