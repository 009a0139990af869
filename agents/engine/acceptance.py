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

**A check that could not see everything does not pass.** Each result is passed, failed or
*unverified* (`CheckResult.unverified`: neither a pass nor a failure; the supervisor sends such a
run to review marked unverified). What a pass of each kind rests on:

=======================  ===========================================================================
kind                     a pass needs
=======================  ===========================================================================
artifact                 one matching name (names are listed from the database, all of them)
no_artifact              every name: a negative check
only_artifacts           every name: a negative check
artifact_contains        every name, and each matching artifact read until the text appears (found
                         in a prefix is found; not found in a cut-off artifact is unverified)
artifact_not_contains    every name, and each matching artifact read in full: a negative check
artifact_matches         every name, and each matching artifact read in full — a match on a prefix
                         is not sound (``\\z``, ``$`` or ``\\A[^<]*\\z`` take the cut for the end)
answer_*                 the whole answer (stored in full)
tool_*                   every tool call of the task (all read)
answer_not_echo          the whole answer
=======================  ===========================================================================

An artifact is read in chunks (`READ_CHUNK`), never whole, for the text checks; a pattern check
holds one artifact's bytes at a time. A check reads at most `RunRecord.read_limit` bytes of one
artifact — the task's `limit_artifact_bytes`, at most `MAX_CHECK_READ_BYTES`; an artifact larger
than that leaves the check unverified unless what was read already decides it (a forbidden text
found is a failure). More than `MAX_ARTIFACT_NAMES` artifacts leave the checks that need every name
unverified. The work of one verdict's checks has a budget (`Budget`): units of work — a byte
scanned for a text counts `SCAN_WEIGHT`, a byte searched by a pattern counts the pattern's RE2
program size — and seconds (`time.monotonic`, looked at before every chunk and every pattern). A
check the budget cannot pay for is unverified, never passed.

The default checks (`default_checks`, on unless ACTHELM_SUPERVISOR_DEFAULT_CHECKS is off) need no
configuration: see that function. Everything here is pure except `run_record`, a selector, and the
reading of artifact files by the checks (after `run_record` has returned: no query runs then).
"""

import codecs
import contextlib
import io
import os
import re
import stat
import time
from collections.abc import Collection, Iterable, Iterator
from dataclasses import dataclass, field
from fnmatch import fnmatchcase
from itertools import islice
from typing import IO, Any, NotRequired, Protocol, TypedDict

import re2
from django.conf import settings

from agents.catalogue.tools import all_tools
from agents.catalogue.tools.recovery_class import RecoveryClass
from agents.engine.usage import is_mcp_tool
from agents.states import ToolCallStatus
from core import fastsql
from core.exceptions import InvalidInput
from tasks.models import Task
from tasks.states import TaskKind
from tasks.workspace import workspace_dir

FIELD = "acceptance_checks"
MAX_CHECKS = 50
MAX_VALUE_CHARS = 1000
MAX_PATTERN_CHARS = 500
RE2_MAX_MEM = 8 << 20
# What the checks read of a run's artifacts: every name (up to MAX_ARTIFACT_NAMES, far more than
# a run writes), and of each artifact a check needs, up to the task's artifact limit — at most
# MAX_CHECK_READ_BYTES — in chunks of READ_CHUNK.
MAX_ARTIFACT_NAMES = 10_000
MAX_CHECK_READ_BYTES = 8 << 20
READ_CHUNK = 256 * 1024
# The budget of one verdict's checks (`Budget`): units of work and seconds. A byte a pattern
# searches costs the pattern's RE2 program size (the bound of its work per byte: a search of 1 MiB
# with a program of 8,000 instructions took ~5 s when RE2 fell back from its DFA); a byte scanned
# for a text costs SCAN_WEIGHT (measured: decoding, normalising and finding, ~36 ns a byte, what a
# program of ~60 instructions costs).
VERDICT_WORK = 8 << 30
SCAN_WEIGHT = 64
VERDICT_SECONDS = 30.0

# A call that was executed: the tool code ran (or was running when the worker stopped) — as the
# grader counts it.
EXECUTED = frozenset({"running", "succeeded", "failed", "unknown"})
# A call a person stopped: denied at its approval, or skipped when its outcome was unknown.
PERSON_STOPPED = frozenset({ToolCallStatus.DENIED, ToolCallStatus.SKIPPED})


class Check(TypedDict):
    """A check as stored in `Task.acceptance_checks`."""

    kind: str
    value: str
    artifact: NotRequired[str]  # the kinds about one artifact's content


class InvalidCheck(InvalidInput):
    code = "acceptance_check_invalid"
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


# --- The record a verdict is made over ---------------------------------------------------------


@dataclass(frozen=True)
class CallSeen:
    tool: str
    status: str
    error_code: str = ""
    run_count: int = 0


@dataclass(frozen=True)
class ArtifactFile:
    """An artifact as stored: its file, read by the checks that need its content."""

    path: str
    size: int = 0  # as recorded; what is read is the file itself


# An artifact's content for the checks: its file, its text (a record built in memory), or None
# (not readable text).
ArtifactSource = ArtifactFile | str | None


@dataclass(frozen=True)
class RunRecord:
    """What the checks see of a finished run: the task's instruction and tools, the answer, every
    artifact by name (its content is read by the checks that need it), every tool call with its
    outcome. The evaluation grader's record is this one with the facts it also grades
    (`agents.eval.grading.TaskRecord`)."""

    instruction: str = ""
    answer: str = ""
    tools: tuple[str, ...] = ()
    artifacts: dict[str, ArtifactSource] = field(default_factory=dict)
    calls: tuple[CallSeen, ...] = ()
    input_files: tuple[str, ...] = ()
    # A planning task proposes work; the files and pages its goal names are its follow-ups' job.
    planning: bool = False
    # False: the run has more than MAX_ARTIFACT_NAMES artifacts and `artifacts` holds the first.
    artifacts_complete: bool = True
    # The most a check reads of one artifact (the task's artifact limit, bounded).
    read_limit: int = MAX_CHECK_READ_BYTES

    def text(self, name: str) -> str | None:
        """An artifact's whole text, read through the checks' reader (at most `read_limit`
        bytes, in chunks): None when it is not readable text or goes on past that."""
        decoder = codecs.getincrementaldecoder("utf-8")("strict")
        try:
            parts = [
                decoder.decode(data) for data in _chunks(self.artifacts.get(name), self.read_limit)
            ]
            parts.append(decoder.decode(b"", final=True))
        except (_NotText, _Cut, UnicodeDecodeError):
            return None
        return "".join(parts)

    def preview(self, name: str, max_chars: int) -> str | None:
        """The start of an artifact's text, at most `max_chars` characters (None: not readable
        text) — what a person or the model supervisor is shown, never what a check decides on."""
        source = self.artifacts.get(name)
        if source is None or isinstance(source, str):
            return source[:max_chars] if source is not None else None
        try:
            with _open(source) as fh:
                data = fh.read(max_chars * 4)
            # Not final: a prefix cut inside a character is still text.
            return codecs.getincrementaldecoder("utf-8")().decode(data)[:max_chars]
        except (OSError, UnicodeDecodeError):
            return None


#: The verdict's read, one statement: every artifact's name, path and size, in name order (one
#: more than MAX_ARTIFACT_NAMES, to know there were too many), then every tool call in the
#: order it was made.
_RECORD_SQL = """
SELECT part, name, path, size, status, error_code, run_count FROM (
  (SELECT 0 AS part, row_number() OVER (ORDER BY a.name) AS ord, a.name, a.path, a.size,
      NULL::varchar AS status, NULL::varchar AS error_code, NULL::integer AS run_count
    FROM agents_artifact a WHERE a.task_id = %(task)s ORDER BY a.name LIMIT %(names)s)
  UNION ALL
  (SELECT 1, row_number() OVER (ORDER BY t.index, c.position), c.tool, NULL, NULL,
      c.status, c.error_code, c.run_count
    FROM agents_toolcall c JOIN agents_turn t ON t.id = c.turn_id WHERE c.task_id = %(task)s)
) AS seen ORDER BY part, ord"""


def run_record(task: Task, answer: str, *, read: bool = True) -> RunRecord:
    """Read what a verdict needs of `task` from the database: every artifact's name and file (up
    to MAX_ARTIFACT_NAMES), every tool call. No file content: the checks read it afterwards.
    `read=False`: the caller knows the task has made no tool call, so it has no artifact either
    (only a call writes one): nothing to read (the task's input files are still listed)."""
    found = (
        fastsql.execute(_RECORD_SQL, {"task": task.pk, "names": MAX_ARTIFACT_NAMES + 1}).fetchall()
        if read
        else []
    )
    rows = [(name, path, size) for part, name, path, size, *_ in found if part == 0]
    calls = tuple(
        CallSeen(tool=tool, status=status, error_code=error_code, run_count=run_count)
        for part, tool, _, _, status, error_code, run_count in found
        if part == 1
    )
    return RunRecord(
        instruction=task.instruction,
        answer=answer or "",
        tools=tuple(task.tools),
        artifacts={
            name: ArtifactFile(path, size) for name, path, size in rows[:MAX_ARTIFACT_NAMES]
        },
        calls=calls,
        input_files=_input_files(task.pk),
        planning=task.kind == TaskKind.PLANNING,
        artifacts_complete=len(rows) <= MAX_ARTIFACT_NAMES,
        read_limit=min(task.limit_artifact_bytes, MAX_CHECK_READ_BYTES),
    )


def _input_files(task_id: int) -> tuple[str, ...]:
    folder = workspace_dir(task_id, create=False)
    if not folder.is_dir():
        return ()
    return tuple(sorted(p.name for p in islice(folder.iterdir(), MAX_ARTIFACT_NAMES)))


# --- Parsing and validation ------------------------------------------------------------------


class _Pattern(Protocol):
    """What is used of a compiled RE2 pattern (the re2 module has no types)."""

    programsize: int

    def search(self, text: str | bytes | bytearray) -> object | None: ...


def _compile(pattern: str | bytes) -> _Pattern:
    options = re2.Options()
    options.log_errors = False
    options.case_sensitive = False
    options.posix_syntax = False
    options.never_nl = False
    options.max_mem = RE2_MAX_MEM
    compiled: _Pattern = re2.compile(pattern, options)
    return compiled


def _pattern_error(pattern: str) -> str | None:
    if len(pattern) > MAX_PATTERN_CHARS:
        return f"a regular expression is at most {MAX_PATTERN_CHARS} characters"
    try:
        _compile(pattern)
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


# --- Running them ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CheckResult:
    check: str  # the check's text form, e.g. "artifact=summary.md"
    passed: bool
    detail: str
    default: bool = False  # one of the default checks, not the task's own
    # Neither passed nor failed: the check could not see what its pass needs (`detail` says
    # what); `passed` is False.
    unverified: bool = False

    @property
    def failed(self) -> bool:
        return not self.passed and not self.unverified

    def as_dict(self) -> dict[str, str | bool]:
        return {
            "check": self.check,
            "passed": self.passed,
            "unverified": self.unverified,
            "detail": self.detail,
            "default": self.default,
        }


class Unverified(Exception):
    """What a check needs cannot be seen (or paid for): the check is unverified."""


class _NotText(Exception):
    """The artifact is not readable text (not UTF-8, not a regular file, gone)."""


class _Cut(Exception):
    """The artifact goes on past what a check reads."""


@dataclass
class Budget:
    """What the checks of one verdict may spend: units of work (a byte scanned for a text costs
    SCAN_WEIGHT, a byte searched by a pattern its RE2 program size) and seconds, measured with
    `time.monotonic` before every chunk and every pattern. What it cannot pay for is unverified."""

    work: int = VERDICT_WORK
    seconds: float = VERDICT_SECONDS
    spent: int = 0
    started: float = field(default_factory=time.monotonic)

    def charge(self, units: int, what: str) -> None:
        if time.monotonic() - self.started >= self.seconds:
            raise Unverified(f"the checks' time budget ({self.seconds:g} s) ran out before {what}")
        if self.spent + units > self.work:
            raise Unverified(
                f"the checks' work budget ({self.work:,} units: bytes read × pattern size) "
                f"cannot pay for {what} ({units:,} units; {self.work - self.spent:,} left)"
            )
        self.spent += units


@contextlib.contextmanager
def _open(source: ArtifactFile | str) -> Iterator[IO[bytes]]:
    """An artifact's bytes: a regular file (opened without following a final link or waiting on
    a pipe), or a text held in memory."""
    if isinstance(source, str):
        yield io.BytesIO(source.encode("utf-8", "surrogatepass"))
        return
    fd = os.open(source.path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{source.path} is not a regular file")
        fh = os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise
    with fh:
        yield fh


def _chunks(source: ArtifactSource, limit: int) -> Iterator[bytes]:
    """An artifact's bytes in chunks of READ_CHUNK, at most `limit` in all, then _Cut when the
    artifact goes on; _NotText when it cannot be read."""
    if source is None:
        raise _NotText
    try:
        with _open(source) as fh:
            read = 0
            while True:
                data = fh.read(min(READ_CHUNK, limit + 1 - read))
                if not data:
                    return
                read += len(data)
                if read > limit:
                    if len(data) > 1:
                        yield data[:-1]
                    raise _Cut
                yield data
    except OSError:
        raise _NotText from None


def _texts(source: ArtifactSource, limit: int, budget: Budget, name: str) -> Iterator[str]:
    """An artifact's text chunk by chunk (whole characters), each chunk paid for first."""
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    for data in _chunks(source, limit):
        budget.charge(len(data) * SCAN_WEIGHT, f"reading {name}")
        try:
            text = decoder.decode(data)
        except UnicodeDecodeError:
            raise _NotText from None
        yield text
    try:
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise _NotText from None


_WS = re.compile(r"\s+")


def _norm_contains(needle: str, texts: Iterable[str]) -> bool:
    """Whether the normalised stream of `texts` contains the normalised `needle` (as `_norm`
    both: whitespace collapsed, case folded), keeping only a needle's length between chunks."""
    want = _norm(needle)
    keep = max(len(want) - 1, 1)
    carry = ""
    for text in texts:
        norm = _WS.sub(" ", text).casefold()
        if carry.endswith(" ") and norm.startswith(" "):
            norm = norm[1:]
        window = carry + norm
        if want in window:
            return True
        carry = window[-keep:]
    return False


def _search(pattern: str, text: str, budget: Budget, what: str) -> bool:
    compiled = _compile(f"(?m){pattern}")
    budget.charge(len(text.encode("utf-8", "surrogatepass")) * compiled.programsize, what)
    return compiled.search(text or "") is not None


def _artifact_matches(
    pattern: str, source: ArtifactSource, r: RunRecord, b: Budget, name: str
) -> bool:
    """The pattern searched over the whole artifact (a pattern needs all of it at once: one
    artifact's bytes, at most `read_limit`, are held while it runs). Each chunk read is paid for
    at the pattern's price first, so the search runs only when the whole of it is paid for."""
    compiled = _compile(f"(?m){pattern}".encode())
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    data = bytearray()
    try:
        for chunk in _chunks(source, r.read_limit):
            b.charge(len(chunk) * compiled.programsize, f"searching {name}")
            decoder.decode(chunk)  # valid text, checked as it comes; the text is not kept
            data += chunk
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise _NotText from None
    except (Unverified, _Cut):
        b.spent -= len(data) * compiled.programsize  # never searched: give it back
        raise
    return compiled.search(data) is not None


def _norm(text: str | None) -> str:
    return re.sub(r"\s+", " ", text or "").strip().casefold()


def _short(text: str | None, n: int = 120) -> str:
    text = re.sub(r"\s+", " ", text or "").strip()
    return text if len(text) <= n else text[: n - 1] + "…"


def _matching(record: RunRecord, pattern: str) -> list[str]:
    return sorted(n for n in record.artifacts if fnmatchcase(n, pattern))


def _names(names: list[str], n: int = 10) -> str:
    return ", ".join(names[:n]) + (f" and {len(names) - n} more" if len(names) > n else "")


def _have(record: RunRecord) -> str:
    names = sorted(record.artifacts)
    return ", ".join(names[:10]) + (" …" if len(names) > 10 else "") if names else "none"


def _not_all_listed(record: RunRecord) -> str:
    return f"the run has more than the {MAX_ARTIFACT_NAMES:,} artifacts a verdict lists"


# None: unverified.
Outcome = tuple[bool | None, str]


def _artifact_content(check: Check, r: RunRecord, budget: Budget) -> Outcome:
    """artifact_contains / artifact_not_contains / artifact_matches over every artifact whose
    name matches. A failure seen is a failure whatever else could not be read; a pass needs every
    matching artifact read (in full, or until the wanted text appeared)."""
    kind, value = check["kind"], check["value"]
    want = kind != "artifact_not_contains"
    names = _matching(r, check["artifact"])
    if not names:
        if not r.artifacts_complete:
            return None, f"no artifact {check['artifact']} among those listed: {_not_all_listed(r)}"
        if not want:
            return True, f"no artifact {check['artifact']}"
        return False, f"no artifact {check['artifact']} (have: {_have(r)})"
    bad: list[str] = []
    unseen: list[str] = []
    for name in names:
        source = r.artifacts[name]
        try:
            if kind == "artifact_matches":
                seen = _artifact_matches(value, source, r, budget, name)
            else:
                seen = _norm_contains(value, _texts(source, r.read_limit, budget, name))
        except _NotText:
            bad.append(f"{name} is not readable text")
            continue
        except _Cut:
            unseen.append(f"{name} is larger than the {r.read_limit:,} bytes a check reads")
            continue
        except Unverified as exc:
            unseen.append(f"{name}: {exc}")
            continue
        if seen != want:
            bad.append(name)
    if bad:
        what = {
            "artifact_contains": "does not contain the text",
            "artifact_not_contains": "contains the text",
            "artifact_matches": "does not match the pattern",
        }[kind]
        return False, f"{_names(bad)}: {what}"
    if unseen or not r.artifacts_complete:
        reasons = unseen if unseen else [_not_all_listed(r)]
        return None, f"not checked: {_names(reasons, 3)}"
    return True, f"{_names(names)}: ok"


def _executed(c: CallSeen) -> bool:
    return c.status in EXECUTED or c.run_count > 0


def _run_one(check: Check, r: RunRecord, budget: Budget) -> Outcome:
    kind, value = check["kind"], check["value"]
    complete = r.artifacts_complete
    if kind == "artifact":
        names = _matching(r, value)
        if names:
            return True, f"found {_names(names)}"
        return (False if complete else None), (
            f"have: {_have(r)}" if complete else f"not found: {_not_all_listed(r)}"
        )
    if kind == "no_artifact":
        names = _matching(r, value)
        if names:
            return False, f"present: {_names(names)}"
        return (True, "none present") if complete else (None, _not_all_listed(r))
    if kind == "only_artifacts":
        allowed = [p.strip() for p in value.split(",") if p.strip()]
        extra = sorted(n for n in r.artifacts if not any(fnmatchcase(n, p) for p in allowed))
        if extra:
            return False, f"other artifacts: {_names(extra)}"
        return (True, "none other") if complete else (None, _not_all_listed(r))
    if kind in ("artifact_contains", "artifact_not_contains", "artifact_matches"):
        return _artifact_content(check, r, budget)
    if kind in ("answer_contains", "answer_not_contains"):
        budget.charge(len(r.answer) * SCAN_WEIGHT, "reading the answer")
        found = _norm_contains(value, [r.answer])
        if kind == "answer_contains":
            return found, f"{'found' if found else 'missing'} in {_short(r.answer)!r}"
        return not found, f"{'found' if found else 'absent'} in {_short(r.answer)!r}"
    if kind == "answer_matches":
        ok = _search(value, r.answer, budget, "searching the answer")
        return ok, f"/{value}/ {'matches' if ok else 'does not match'} {_short(r.answer)!r}"
    calls = [c for c in r.calls if c.tool == value]
    if kind == "tool_ran":
        ok = any(c.status == "succeeded" for c in calls)
        return ok, "succeeded" if ok else f"never succeeded (calls: {[c.status for c in calls]})"
    if kind == "tool_not_run":
        ran = [c.status for c in calls if _executed(c)]
        return not ran, f"executed ({ran})" if ran else "never executed"
    if kind == "tool_not_called":
        seen = [c.status for c in calls]
        return not seen, f"called ({seen})" if seen else "not called"
    if kind == "answer_not_echo":
        echo = is_echo(r.answer, r.instruction)
        return not echo, "the answer repeats the instruction" if echo else "not an echo"
    raise InvalidCheck(f"unknown check kind {kind!r}")  # validated at creation: a stored bug


def _result(text: str, outcome: Outcome, *, default: bool = False) -> CheckResult:
    passed, detail = outcome
    return CheckResult(text, passed is True, detail, default=default, unverified=passed is None)


def run_checks(
    checks: list[Check],
    record: RunRecord,
    *,
    default: bool = False,
    budget: Budget | None = None,
) -> list[CheckResult]:
    """Each check's result, in order; all of them share `budget` (a fresh one if none)."""
    budget = budget if budget is not None else Budget()
    out = []
    for check in checks or []:
        try:
            outcome = _run_one(check, record, budget)
        except Unverified as exc:
            outcome = (None, str(exc))
        out.append(_result(check_text(check), outcome, default=default))
    return out


# --- Default checks: no person configures them ---------------------------------------------------

_WORDS = re.compile(r"[\w.-]+")
# An output file the instruction asks for: a writing verb, then (within a short clause, no
# sentence end) a file name with an extension.
_OUTPUT_FILE = re.compile(
    r"\b(?:write|create|save|produce|generate|store|put)\b(?:(?![.!?]\s|\n)[^\n]){0,60}?"
    r"(?<![\w.-])([\w-]+(?:\.[\w-]+)*\.[A-Za-z][A-Za-z0-9]{0,7})(?![\w-])",
    re.IGNORECASE,
)
# What the instruction names that a run can only know through its tools: an input file of the
# task's workspace, or a web address.
_URL = re.compile(r"https?://\S+", re.IGNORECASE)


# "do not write x.md", "never create", "cannot save", "without writing": not a file asked for.
_NEGATED = re.compile(r"(?:not|never|n't|without|no)\W*$", re.IGNORECASE)
# A sentence of the answer ends at a full stop, a question or exclamation mark followed by a
# space (not the dot inside ``summary.md``), or at a line break.
_SENTENCE_END = re.compile(r"[.!?](?=\s|$)|\n")
# A sentence that says a file was not written ("could not write summary.md", "the write of
# summary.md was denied"): not a claim to have written it.
_NOT_WRITTEN = re.compile(
    r"\b(?:not|never|no|without|cannot|unable|denied|refused|declined|rejected|failed|"
    r"skipped|instead)\b|n't\b",
    re.IGNORECASE,
)


def named_output_files(instruction: str) -> list[str]:
    """The files the instruction asks the run to write, by name (not those it forbids)."""
    text = instruction or ""
    return sorted(
        {
            m.group(1)
            for m in _OUTPUT_FILE.finditer(text)
            if not _NEGATED.search(text[max(0, m.start() - 12) : m.start()])
        }
    )


def answer_names(answer: str, name: str) -> bool | None:
    """How the answer speaks of the file `name`: True when a sentence names it without saying it
    was not written ("I wrote summary.md", "see summary.md") — a claim; False when every sentence
    that names it says it was not (no, not, denied, could not, …); None when it does not name it.
    Linear in the answer: it is split into sentences once."""
    wanted = re.compile(r"(?<![\w.-])" + re.escape(name) + r"(?![\w-])", re.IGNORECASE)
    named = [s for s in _SENTENCE_END.split(answer or "") if wanted.search(s)]
    if not named:
        return None
    return any(not _NOT_WRITTEN.search(s) for s in named)


def _named_output(record: RunRecord, name: str) -> Outcome:
    """`named_output=NAME`: the instruction asks for NAME. Written: passed. Not written: failed —
    unless a person denied or skipped a write (the file is then their decision) and the answer
    does not name it; an answer that claims it anyway fails, whatever stopped the write; one
    that names it only to say it was not written is unverified (a person reads it)."""
    if name in record.artifacts:
        return True, "written"
    if not record.artifacts_complete:
        return None, f"{name} not found: {_not_all_listed(record)}"
    writes = [c.status for c in record.calls if c.tool == "write_artifact"]
    stopped = [s for s in writes if s != ToolCallStatus.SUCCEEDED]
    how = f"; write_artifact calls: {', '.join(sorted(set(stopped)))}" if stopped else ""
    said = answer_names(record.answer, name)
    by_person = sorted({s for s in stopped if s in PERSON_STOPPED})
    if said:
        return False, f"the answer names {name}, which the run never wrote{how}"
    if not by_person:
        return False, f"the instruction asks for {name}; artifacts: {_have(record)}{how}"
    if said is False:
        return None, (
            f"{name} was not written (write_artifact {', '.join(by_person)} by a person) and "
            "the answer mentions it: read what it says"
        )
    return True, f"not written: write_artifact {', '.join(by_person)} by a person"


def is_echo(answer: str, instruction: str) -> bool:
    """The answer repeats the instruction instead of answering it:

    - the whole instruction is in it, with at most two words of its own ("Done:", "OK");
    - or it opens (after at most two words) with the instruction's first line, when that line
      has five words or more — "Done: <the task>" followed by boilerplate;
    - or it is a long piece (six words or more) of the instruction itself."""
    a, i = _norm(answer), _norm(instruction)
    if not a or not i:
        return False
    if len(i) >= 20 and i in a and len(_WORDS.findall(a.replace(i, " "))) <= 2:
        return True
    first = _norm((instruction or "").strip().splitlines()[0])
    if len(_WORDS.findall(first)) >= 5:
        at = a.find(first)
        if at != -1 and len(_WORDS.findall(a[:at])) <= 2:
            return True
    return len(_WORDS.findall(a)) >= 6 and a.strip(" .:") in i


def _effectful(name: str) -> bool:
    """A tool that changes something or reaches out: a built-in one that is not read-only (and
    not the loop's own, like update_plan), or any MCP tool (its effect is the server's)."""
    if is_mcp_tool(name):
        return True
    tool = all_tools().get(name)
    return (
        tool is not None
        and not getattr(tool, "internal", False)
        and tool.recovery_class != RecoveryClass.READ_ONLY
    )


def default_checks(record: RunRecord) -> list[CheckResult]:
    """The checks every task gets (when ACTHELM_SUPERVISOR_DEFAULT_CHECKS is on), each
    conservative — it fires only on evidence, and each was measured on the evaluation suite for
    false rejections of good work (docs/eval.md):

    - `named_output`: the instruction asks to write/create/save a file by name (``summary.md``),
      the task has `write_artifact`, and the run wrote no such artifact — unless a person denied
      or skipped a write (then the missing file is the person's decision) and the answer does
      not name the file. An answer that claims a file the run never wrote fails, whatever
      stopped the write (denied, skipped, refused, failed, never tried): the person decided the
      file, not what the answer may claim. One that names it only to say it was not written
      ("the write of summary.md was denied") is unverified after a person's denial
      (`answer_names`).
    - `answer_not_echo`: the answer only repeats the instruction.
    - `used_tools`: the instruction names one of the task's input files and the task has a tool
      that reads a file's content (`Tool.reads_files`: `read_file`, `search_files`,
      `analyze_csv`), but the run called none of them; or it names a web address, the task has
      `fetch_url`, and the run never called it. (Listing the files is not reading one; a task
      without such tools is exempt.)

    A planning task gets neither `named_output` nor `used_tools`: the files and pages its goal
    names are for the follow-ups it proposes. None reads an artifact's content: `named_output`
    rests on every artifact's name (unverified when the run has more than a verdict lists),
    `answer_not_echo` on the whole answer, the others on every tool call.
    - `no_unlisted_tools`: the run never called a tool with an effect that is not on the task's
      list (a call refused with `tool_not_allowed` of `fetch_url`, `write_artifact`, an MCP tool
      — the mark of an instruction injected into a file or a page). A made-up tool name, or a
      read-only tool, refused the same way, is not held against the run: small models guess.
    """
    out: list[CheckResult] = []
    if "write_artifact" in record.tools and not record.planning:
        for name in named_output_files(record.instruction):
            if name not in record.input_files:
                out.append(
                    _result(f"named_output={name}", _named_output(record, name), default=True)
                )
    echo = is_echo(record.answer, record.instruction)
    out.append(
        CheckResult(
            "answer_not_echo",
            not echo,
            "the answer only repeats the instruction" if echo else "not an echo",
            default=True,
        )
    )
    instruction = "" if record.planning else record.instruction or ""
    called = {c.tool for c in record.calls}
    unmet = []
    readers = {t.name for t in all_tools().values() if t.reads_files} & set(record.tools)
    named = [n for n in record.input_files if n in instruction]
    if named and readers and not readers & called:
        unmet.append(f"names {', '.join(named[:3])} but no file was read")
    if _URL.search(instruction) and "fetch_url" in record.tools and "fetch_url" not in called:
        unmet.append("names a web address but fetch_url was never called")
    if (named and readers) or (_URL.search(instruction) and "fetch_url" in record.tools):
        out.append(
            CheckResult(
                "used_tools",
                not unmet,
                "the instruction " + "; ".join(unmet) if unmet else "the tools it needs ran",
                default=True,
            )
        )
    unlisted = sorted(
        {c.tool for c in record.calls if c.error_code == "tool_not_allowed" and _effectful(c.tool)}
    )
    out.append(
        CheckResult(
            "no_unlisted_tools",
            not unlisted,
            f"called tools not on the task's list: {', '.join(unlisted)}" if unlisted else "none",
            default=True,
        )
    )
    return out


def default_checks_on() -> bool:
    return bool(getattr(settings, "ACTHELM_SUPERVISOR_DEFAULT_CHECKS", True))


def evaluate(
    task_checks: list[Check],
    record: RunRecord,
    *,
    defaults: bool | None = None,
    budget: Budget | None = None,
) -> list[CheckResult]:
    """The task's own checks, then the default ones (when on): every result, in that order. The
    task's checks share one budget (`Budget`, a fresh one if none is given); the default checks
    read no artifact's content."""
    results = run_checks(task_checks, record, budget=budget)
    if default_checks_on() if defaults is None else defaults:
        results += default_checks(record)
    return results
