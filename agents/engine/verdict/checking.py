"""The acceptance checks run over a run's record: the task's own checks
(`agents.engine.verdict.acceptance`, each passed, failed or unverified), then the default ones,
which no person configures (`default_checks`, on unless ACTHELM_SUPERVISOR_DEFAULT_CHECKS is off).
`evaluate` is what the supervisor calls. What the checks read: `agents.engine.verdict.evidence`."""

import codecs
import re
from collections.abc import Iterable
from dataclasses import dataclass
from fnmatch import fnmatchcase

from django.conf import settings

from agents.catalogue.tools import all_tools
from agents.catalogue.tools.mcp import is_mcp_tool
from agents.catalogue.tools.recovery_class import RecoveryClass
from agents.engine.verdict.acceptance import Check, InvalidCheck, check_text, compile_pattern
from agents.engine.verdict.evidence import (
    EXECUTED,
    MAX_ARTIFACT_NAMES,
    SCAN_WEIGHT,
    ArtifactSource,
    Budget,
    CallSeen,
    Cut,
    NotText,
    RunRecord,
    Unverified,
    chunks,
    texts,
)
from agents.states import ToolCallStatus


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
    compiled = compile_pattern(f"(?m){pattern}")
    budget.charge(len(text.encode("utf-8", "surrogatepass")) * compiled.programsize, what)
    return compiled.search(text or "") is not None


def _artifact_matches(
    pattern: str, source: ArtifactSource, r: RunRecord, b: Budget, name: str
) -> bool:
    """The pattern searched over the whole artifact (a pattern needs all of it at once: one
    artifact's bytes, at most `read_limit`, are held while it runs). Each chunk read is paid for
    at the pattern's price first, so the search runs only when the whole of it is paid for."""
    compiled = compile_pattern(f"(?m){pattern}".encode())
    decoder = codecs.getincrementaldecoder("utf-8")("strict")
    data = bytearray()
    try:
        for chunk in chunks(source, r.read_limit):
            b.charge(len(chunk) * compiled.programsize, f"searching {name}")
            decoder.decode(chunk)  # valid text, checked as it comes; the text is not kept
            data += chunk
        decoder.decode(b"", final=True)
    except UnicodeDecodeError:
        raise NotText from None
    except (Unverified, Cut):
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
                seen = _norm_contains(value, texts(source, r.read_limit, budget, name))
        except NotText:
            bad.append(f"{name} is not readable text")
            continue
        except Cut:
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
# A call a person stopped: denied at its approval, or skipped when its outcome was unknown.
PERSON_STOPPED = frozenset({ToolCallStatus.DENIED, ToolCallStatus.SKIPPED})


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
