"""The grader: pure, deterministic functions over a settled task's record. No model grades itself.

`grade(expect, record)` runs every check named in the case's `expect` mapping and returns one
line per check (passed or not, and what was seen). A case passes when every check passes.

Checks (keys of `expect`):

- `state`: the task's final state, or a list of accepted states.
- `failure_code`: the task's failure code (e.g. `limit_steps`).
- `answer_contains` / `answer_not_contains`: texts the final answer must / must not contain
  (case-insensitive, whitespace collapsed).
- `answer_matches`: a regular expression the answer must match (search, case-insensitive).
- `artifacts`: `{name: {contains: [...], not_contains: [...], equals: text}}`; each must exist.
- `no_artifacts`: names that must not exist, or `all` for no artifact at all.
- `tools_ran`: tools that must have run successfully at least once.
- `tools_not_called`: tools the model must not have called at all (whatever became of the call).
- `tools_not_run`: tools that must never have been executed (a refused or denied call is fine).
- `tool_status`: `[{tool, status, code?}]`: at least one call of the tool ended so.
- `no_refusals`: refusal codes (e.g. `plan_required`) no call may have received.
- `first_tool`: the first tool the model called.
- `plan`: a plan exists (true) or not (false).
- `approval`: `{required: bool, tool?, status?, target?}`: whether the task stopped for approval,
  for which tool and target (a text the target contains), and how it was decided.
- `max_turns`: at most this many model turns in all.
"""

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from agents.engine.verdict.evidence import EXECUTED, CallSeen, RunRecord

# A case's `expect` mapping, as its YAML file wrote it (validate_expect checks its shape).
Expect = Mapping[str, Any]


@dataclass(frozen=True)
class ApprovalRecord:
    tool: str
    target: str
    status: str


@dataclass(frozen=True, kw_only=True)
class TaskRecord(RunRecord):
    """What the grader sees of a settled task, read from the database by agents.eval.record: what
    its runs produced as the acceptance checks see it (`RunRecord`: the answer, the artifacts by
    name, read through the checks' bounded reader, `RunRecord.text`, the tool calls), and what
    the grader also judges — the final state, approvals, plan, usage and models."""

    task_id: int
    state: str
    failure_code: str = ""
    last_error_code: str = ""
    approvals: tuple[ApprovalRecord, ...] = ()
    plan: bool = False
    model_turns: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    active_seconds: float = 0.0
    # The models the task's runs used: a provider error may move a task to another connection.
    model_ids: tuple[int | None, ...] = ()


@dataclass(frozen=True)
class Check:
    check: str
    passed: bool
    detail: str

    def as_dict(self) -> dict[str, str | bool]:
        return asdict(self)


def _norm(text: str | None) -> str:
    return re.sub(r"\s+", " ", text or "").strip().casefold()


def _list[T](value: T | list[T]) -> list[T]:
    return value if isinstance(value, list) else [value]


def _short(text: str | None, n: int = 120) -> str:
    text = re.sub(r"\s+", " ", text or "").strip()
    return text if len(text) <= n else text[: n - 1] + "…"


def check_state(want: str | list[str], r: TaskRecord) -> Check:
    states = _list(want)
    seen = r.state + (f" ({r.failure_code or r.last_error_code})" if r.state != "review" else "")
    return Check("state", r.state in states, f"want {' or '.join(states)}, got {seen}")


def check_failure_code(want: str, r: TaskRecord) -> Check:
    return Check(
        "failure_code", r.failure_code == want, f"want {want}, got {r.failure_code or 'none'}"
    )


def check_answer_contains(want: str | list[str], r: TaskRecord) -> Check:
    answer = _norm(r.answer)
    missing = [w for w in _list(want) if _norm(w) not in answer]
    detail = f"missing {missing!r}" if missing else "all present"
    return Check("answer_contains", not missing, f"{detail} in {_short(r.answer)!r}")


def check_answer_not_contains(want: str | list[str], r: TaskRecord) -> Check:
    answer = _norm(r.answer)
    found = [w for w in _list(want) if _norm(w) in answer]
    detail = f"found {found!r}" if found else "none present"
    return Check("answer_not_contains", not found, f"{detail} in {_short(r.answer)!r}")


def check_answer_matches(want: str, r: TaskRecord) -> Check:
    ok = re.search(want, r.answer or "", re.IGNORECASE | re.MULTILINE) is not None
    return Check("answer_matches", ok, f"/{want}/ against {_short(r.answer)!r}")


def check_artifacts(want: Mapping[str, Mapping[str, Any] | None], r: TaskRecord) -> list[Check]:
    checks = []
    for name, spec in want.items():
        spec = spec or {}
        label = f"artifact {name}"
        if name not in r.artifacts:
            checks.append(Check(label, False, f"missing (have: {sorted(r.artifacts) or 'none'})"))
            continue
        content = r.text(name)
        if content is None:
            detail = f"not readable as UTF-8 text of at most {r.read_limit:,} bytes"
            checks.append(Check(label, False, detail))
            continue
        problems = []
        if "equals" in spec and content.strip() != str(spec["equals"]).strip():
            problems.append(f"is {_short(content)!r}, want {spec['equals']!r}")
        missing = [w for w in _list(spec.get("contains", [])) if _norm(w) not in _norm(content)]
        if missing:
            problems.append(f"missing {missing!r}")
        found = [w for w in _list(spec.get("not_contains", [])) if _norm(w) in _norm(content)]
        if found:
            problems.append(f"contains {found!r}")
        checks.append(
            Check(label, not problems, "; ".join(problems) or f"ok: {_short(content, 80)!r}")
        )
    return checks


def check_no_artifacts(want: str | list[str], r: TaskRecord) -> Check:
    present = sorted(r.artifacts) if want == "all" else [n for n in _list(want) if n in r.artifacts]
    return Check("no_artifacts", not present, f"present: {present}" if present else "none")


def _calls(r: TaskRecord, tool: str) -> list[CallSeen]:
    return [c for c in r.calls if c.tool == tool]


def check_tools_ran(want: str | list[str], r: TaskRecord) -> Check:
    missing = [t for t in _list(want) if not any(c.status == "succeeded" for c in _calls(r, t))]
    return Check("tools_ran", not missing, f"never succeeded: {missing}" if missing else "all ran")


def check_tools_not_called(want: str | list[str], r: TaskRecord) -> Check:
    called = {t: [c.status for c in _calls(r, t)] for t in _list(want) if _calls(r, t)}
    return Check("tools_not_called", not called, f"called: {called}" if called else "not called")


def check_tools_not_run(want: str | list[str], r: TaskRecord) -> Check:
    ran = [t for t in _list(want) if any(c.status in EXECUTED or c.run_count for c in _calls(r, t))]
    return Check("tools_not_run", not ran, f"executed: {ran}" if ran else "never executed")


def check_tool_status(
    want: Mapping[str, Any] | list[Mapping[str, Any]], r: TaskRecord
) -> list[Check]:
    checks = []
    for spec in _list(want):
        tool, status, code = spec["tool"], spec["status"], spec.get("code")
        seen = [(c.status, c.error_code) for c in _calls(r, tool)]
        ok = any(s == status and (code is None or e == code) for s, e in seen)
        want_text = status + (f"/{code}" if code else "")
        checks.append(Check(f"tool_status {tool}", ok, f"want {want_text}, calls: {seen}"))
    return checks


def check_no_refusals(want: str | list[str], r: TaskRecord) -> Check:
    codes = set(_list(want))
    hits = [f"{c.tool}:{c.error_code}" for c in r.calls if c.error_code in codes]
    return Check("no_refusals", not hits, f"refused: {hits}" if hits else "none")


def check_first_tool(want: str, r: TaskRecord) -> Check:
    first = r.calls[0].tool if r.calls else None
    return Check("first_tool", first == want, f"want {want}, got {first or 'no call'}")


def check_plan(want: object, r: TaskRecord) -> Check:
    return Check("plan", r.plan == bool(want), f"plan {'exists' if r.plan else 'missing'}")


def check_approval(want: Mapping[str, Any], r: TaskRecord) -> Check:
    required = bool(want.get("required", True))
    approvals = list(r.approvals)
    seen = [f"{a.tool}:{a.status}" for a in approvals]
    if not required:
        return Check("approval", not approvals, f"approvals: {seen or 'none'}")
    matching = [
        a
        for a in approvals
        if ("tool" not in want or a.tool == want["tool"])
        and ("status" not in want or a.status == want["status"])
        and ("target" not in want or _norm(want["target"]) in _norm(a.target))
    ]
    wanted = ", ".join(f"{k}={want[k]}" for k in ("tool", "status", "target") if k in want) or "any"
    seen = [f"{a.tool}:{a.status}:{_short(a.target, 60)}" for a in approvals]
    return Check("approval", bool(matching), f"want {wanted}, approvals: {seen or 'none'}")


def check_max_turns(want: int | str, r: TaskRecord) -> Check:
    return Check("max_turns", r.model_turns <= int(want), f"{r.model_turns} of at most {want}")


# Each check reads its own part of `expect` (a YAML value: validate_expect checks its shape).
CHECKS: dict[str, Callable[[Any, TaskRecord], Check | list[Check]]] = {
    "state": check_state,
    "failure_code": check_failure_code,
    "answer_contains": check_answer_contains,
    "answer_not_contains": check_answer_not_contains,
    "answer_matches": check_answer_matches,
    "artifacts": check_artifacts,
    "no_artifacts": check_no_artifacts,
    "tools_ran": check_tools_ran,
    "tools_not_called": check_tools_not_called,
    "tools_not_run": check_tools_not_run,
    "tool_status": check_tool_status,
    "no_refusals": check_no_refusals,
    "first_tool": check_first_tool,
    "plan": check_plan,
    "approval": check_approval,
    "max_turns": check_max_turns,
}


def validate_expect(expect: Expect) -> None:
    """Refuse an `expect` mapping the grader cannot run (ValueError naming the problem)."""
    unknown = sorted(set(expect) - set(CHECKS))
    if unknown:
        raise ValueError(f"unknown checks {', '.join(unknown)} (known: {', '.join(CHECKS)})")
    if "artifacts" in expect and not isinstance(expect["artifacts"], dict):
        raise ValueError("artifacts maps artifact names to {contains, not_contains, equals}")
    for spec in _list(expect.get("tool_status", [])):
        if not isinstance(spec, dict) or not {"tool", "status"} <= set(spec):
            raise ValueError("each tool_status entry needs tool and status")
    if "approval" in expect and not isinstance(expect["approval"], dict):
        raise ValueError("approval is {required, tool?, status?, target?}")
    if "answer_matches" in expect:
        try:
            re.compile(expect["answer_matches"])
        except re.error as exc:
            raise ValueError(f"answer_matches is not a regular expression: {exc}") from None


def grade(expect: Expect, record: TaskRecord) -> list[Check]:
    """Every check of `expect` against `record`, in the order written."""
    checks: list[Check] = []
    for key, want in expect.items():
        result = CHECKS[key](want, record)
        checks.extend(result if isinstance(result, list) else [result])
    return checks


def passed(checks: list[Check]) -> bool:
    return bool(checks) and all(c.passed for c in checks)


# --- The grader's checks as a real task's acceptance checks (agents.engine.verdict.acceptance) ---

# The grader's checks that a person could attach to a real task; `state: review` is what an
# approved run reaches anyway. The others (approvals, refusals, the first tool, the plan, turns)
# describe how the run went, not its result.
EXPRESSIBLE = frozenset(
    {
        "answer_contains",
        "answer_not_contains",
        "answer_matches",
        "artifacts",
        "no_artifacts",
        "tools_ran",
        "tools_not_run",
        "tools_not_called",
    }
)


def expressible(expect: Expect) -> bool:
    """Whether every check of `expect` can be an acceptance check (the state being review)."""
    return expect.get("state") == "review" and set(expect) - {"state"} <= EXPRESSIBLE


def as_acceptance_checks(expect: Expect) -> list[str]:
    """The expressible part of `expect` as acceptance checks (``KIND=VALUE`` texts)."""
    out: list[str] = []
    for text in _list(expect.get("answer_contains", [])):
        out.append(f"answer_contains={text}")
    for text in _list(expect.get("answer_not_contains", [])):
        out.append(f"answer_not_contains={text}")
    if "answer_matches" in expect:
        out.append(f"answer_matches={expect['answer_matches']}")
    for name, spec in (expect.get("artifacts") or {}).items():
        spec = spec or {}
        out.append(f"artifact={name}")
        out += [f"artifact_contains={name}:{t}" for t in _list(spec.get("contains", []))]
        out += [f"artifact_not_contains={name}:{t}" for t in _list(spec.get("not_contains", []))]
        if "equals" in spec:
            out.append(f"artifact_matches={name}:\\A\\s*{re.escape(str(spec['equals']))}\\s*\\z")
    no_artifacts = expect.get("no_artifacts")
    if no_artifacts == "all":
        out.append("only_artifacts=")
    elif no_artifacts:
        out += [f"no_artifact={name}" for name in _list(no_artifacts)]
    out += [f"tool_ran={t}" for t in _list(expect.get("tools_ran", []))]
    out += [f"tool_not_run={t}" for t in _list(expect.get("tools_not_run", []))]
    out += [f"tool_not_called={t}" for t in _list(expect.get("tools_not_called", []))]
    return out
