"""The suite's cases: one YAML file per case in `agents/eval/cases/`, loaded and validated here.

A case file::

    id: files_read_fact                 # unique, [a-z0-9_]
    title: Read one fact from a file
    instruction: |                      # the task's instruction; {page_url} is replaced by the
      ...                               # loopback address the runner serves `pages` on
    files: {notes.txt: "..."}           # input files copied into the task's workspace
    pages: {status.html: "..."}         # served by the runner at {page_url}<name>
    tools: [update_plan, read_file]     # the task's tool list (nothing else is offered)
    policies: {write_artifact: ask}     # tool policies
    allowed_domains: ["{page_host}"]    # {page_host} is the loopback host of the pages
    limits: {limit_turns: 8}            # task limits (names as on Task)
    decisions:                          # what the runner decides, in order, like a person
      - {tool: write_artifact, decision: approve}
    expect: {...}                       # the grader's checks (agents.eval.grading.CHECKS)

Nothing here touches the database.
"""

import hashlib
import re
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import yaml

from agents.eval.grading import validate_expect
from core.exceptions import ErrorCode, InvalidInput

CASES_DIR = Path(__file__).resolve().parent / "cases"
_ID = re.compile(r"^[a-z0-9][a-z0-9_]{0,99}$")
_KEYS = {
    "id",
    "title",
    "instruction",
    "files",
    "pages",
    "tools",
    "policies",
    "allowed_domains",
    "limits",
    "decisions",
    "expect",
}
DECISIONS = ("approve", "deny")


class InvalidCase(InvalidInput):
    error = ErrorCode.EVAL_CASE_INVALID


@dataclass(frozen=True)
class Decision:
    tool: str
    decision: str  # approve | deny


@dataclass(frozen=True)
class Case:
    id: str
    title: str
    instruction: str
    files: dict[str, str] = field(default_factory=dict)
    pages: dict[str, str] = field(default_factory=dict)
    tools: tuple[str, ...] = ()
    policies: dict[str, str] = field(default_factory=dict)
    allowed_domains: tuple[str, ...] = ()
    limits: dict[str, int] = field(default_factory=dict)
    decisions: tuple[Decision, ...] = ()
    expect: dict[str, Any] = field(default_factory=dict)
    source: str = ""  # the file's text, for the suite's hash

    @property
    def needs_pages(self) -> bool:
        """The case may fetch from the runner's loopback server (a page only as a lure does not
        count: without fetch_url the case never reaches it)."""
        return bool(self.pages) and "fetch_url" in self.tools

    def instruction_for(self, page_url: str) -> str:
        return self.instruction.replace("{page_url}", page_url)

    def domains_for(self, page_host: str) -> list[str]:
        return [d.replace("{page_host}", page_host) for d in self.allowed_domains]


def _strings(value: object, where: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise InvalidCase(f"{where} must be a list of strings")
    return tuple(value)


def _text_map(value: object, where: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise InvalidCase(f"{where} must map file names to text")
    return dict(value)


def parse_case(text: str, *, name: str = "<case>") -> Case:
    """One case from a file's text; raises InvalidCase naming the file and the problem."""

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise InvalidCase(f"{name}: not valid YAML: {exc}") from None
    if not isinstance(data, dict):
        raise InvalidCase(f"{name}: a case is a mapping")
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise InvalidCase(f"{name}: unknown keys {', '.join(unknown)}")
    case_id = data.get("id")
    if not isinstance(case_id, str) or not _ID.match(case_id):
        raise InvalidCase(f"{name}: id must be lowercase letters, digits and '_'")
    where = f"{name} ({case_id})"
    for key in ("title", "instruction"):
        if not isinstance(data.get(key), str) or not data[key].strip():
            raise InvalidCase(f"{where}: {key} is required")
    decisions = []
    for item in data.get("decisions") or []:
        if (
            not isinstance(item, dict)
            or set(item) != {"tool", "decision"}
            or item["decision"] not in DECISIONS
        ):
            raise InvalidCase(f"{where}: each decision is {{tool: NAME, decision: approve|deny}}")
        decisions.append(Decision(tool=str(item["tool"]), decision=item["decision"]))
    limits = data.get("limits") or {}
    if not isinstance(limits, dict) or not all(
        isinstance(v, int) and v > 0 for v in limits.values()
    ):
        raise InvalidCase(f"{where}: limits map limit names to positive whole numbers")
    policies = data.get("policies") or {}
    if not isinstance(policies, dict):
        raise InvalidCase(f"{where}: policies map tool names to allow|ask")
    expect = data.get("expect")
    if not isinstance(expect, dict) or not expect:
        raise InvalidCase(f"{where}: expect (the grader's checks) is required")
    try:
        validate_expect(expect)
    except ValueError as exc:
        raise InvalidCase(f"{where}: {exc}") from None
    return Case(
        id=case_id,
        title=data["title"].strip(),
        instruction=data["instruction"].strip(),
        files=_text_map(data.get("files"), f"{where}: files"),
        pages=_text_map(data.get("pages"), f"{where}: pages"),
        tools=_strings(data.get("tools"), f"{where}: tools"),
        policies={str(k): str(v) for k, v in policies.items()},
        allowed_domains=_strings(data.get("allowed_domains"), f"{where}: allowed_domains"),
        limits=dict(limits),
        decisions=tuple(decisions),
        expect=expect,
        source=text,
    )


def load_cases(pattern: str | None = None, *, folder: Path | None = None) -> list[Case]:
    """The cases whose id matches `pattern` (shell-style, comma-separated; all when empty),
    sorted by id. Every file is validated, matching or not: a broken suite is refused whole."""
    folder = Path(folder or CASES_DIR)
    cases = [parse_case(p.read_text(encoding="utf-8"), name=p.name) for p in _files(folder)]
    seen: set[str] = set()
    for case in cases:
        if case.id in seen:
            raise InvalidCase(f"two cases share the id {case.id}")
        seen.add(case.id)
    patterns = [p.strip() for p in (pattern or "").split(",") if p.strip()]
    if patterns:
        cases = [c for c in cases if any(fnmatch(c.id, p) for p in patterns)]
    return sorted(cases, key=lambda c: c.id)


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())


def suite_sha256(cases: list[Case]) -> str:
    """One hash over the selected cases' files: results of different suites stay apart."""
    digest = hashlib.sha256()
    for case in sorted(cases, key=lambda c: c.id):
        digest.update(case.id.encode() + b"\0" + case.source.encode() + b"\0")
    return digest.hexdigest()
