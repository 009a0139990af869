"""What an MCP tool's input schema may cost (issue 48 item 1): judged when it is listed, and
bounded at every check of a call's arguments — CPU, memory, a cancel.

Bounds here are on work done (thread CPU time, bytes traced, polls), generous against what the
old checker took (151 s of CPU for a uniqueItems of 8,000 items, ~3 KiB an error), never on
wall-clock speed."""

import gc
import itertools
import threading
import time
import tracemalloc

import pytest

from agents.catalogue.tools import ERROR_CODES, ToolError
from agents.catalogue.tools import schemas as schemas_module
from agents.catalogue.tools.mcp import McpTool, RemoteTool, ServerSpec, tool_refusal
from agents.catalogue.tools.schemas import (
    MAX_CHECK_BYTES,
    MAX_NAMES,
    POLL_EVERY,
    CheckStopped,
    OutsideSchema,
)

SPEC = ServerSpec(name="s", transport="stdio", command=("x",))


def tool(schema: dict, spec: ServerSpec = SPEC) -> McpTool:
    """A tool as a task pinned it: built from its schema without the listing's judgement."""
    return McpTool(spec, RemoteTool("t", "", schema))


def listed(schema: dict) -> str | None:
    refusal = tool_refusal(RemoteTool("t", "", schema))
    return refusal[0] if refusal else None


def fan_out(levels: int, leaf: dict) -> dict:
    """allOf [a1, a1], a1: allOf [a2, a2], …: the leaf applied 2**levels times to ``x``."""
    defs = {f"a{i}": {"allOf": [{"$ref": f"#/$defs/a{i + 1}"}] * 2} for i in range(levels)}
    defs[f"a{levels}"] = leaf
    return {"type": "object", "$defs": defs, "properties": {"x": {"$ref": "#/$defs/a0"}}}


def required_of(count: int) -> dict:
    return {"type": "object", "required": [f"name{i}" for i in range(count)]}


def cpu_and_peak(fn):
    """``fn()``'s outcome (its value or the exception it raised), the thread CPU time it took
    and the most memory it held at once (tracemalloc)."""
    tracemalloc.start()
    started = time.thread_time()
    try:
        outcome = fn()
    except Exception as exc:  # noqa: BLE001 - the test looks at what it raised
        outcome = exc
    spent = time.thread_time() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return outcome, spent, peak


def test_arguments_too_costly_is_a_registered_code():
    assert "arguments_too_costly" in ERROR_CODES


# -- at listing --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "pattern",
    [
        "\\pL{1000}",  # too large: 50-200 ms of RE2 at each application before
        "^(?=x)y",  # look-ahead
        "(a)\\1",  # a back-reference
    ],
    ids=["too-large", "look-ahead", "back-reference"],
)
def test_a_pattern_re2_refuses_is_not_allowed(pattern):
    schema = {"type": "object", "properties": {"q": {"type": "string", "pattern": pattern}}}
    assert listed(schema) == "schema_not_allowed"


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"x": required_of(5_000)}},
        {"type": "object", "properties": {"x": {"enum": list(range(5_000))}}},
        {"type": "object", "properties": {f"p{i}": {} for i in range(5_000)}},
        {"type": "object", "dependentRequired": {"a": [f"n{i}" for i in range(5_000)]}},
        {
            "type": "object",
            "properties": {f"p{i}": {"type": "string", "pattern": f"^{i}$"} for i in range(200)},
        },
    ],
    ids=["required", "enum", "properties", "dependentRequired", "patterns"],
)
def test_long_lists_of_names_values_or_patterns_are_not_allowed(schema):
    assert listed(schema) == "schema_not_allowed"


def test_lists_up_to_the_bound_are_offered():
    schema = {
        "type": "object",
        "properties": {
            "x": required_of(MAX_NAMES),
            "e": {"enum": list(range(MAX_NAMES))},
            "q": {"type": "string", "pattern": "^\\p{Lu}[a-z]{1,20}$"},
        },
    }
    assert listed(schema) is None


def test_a_reference_fan_out_is_not_allowed():
    """2**40 applications of one schema to one argument: refused before any model sees it."""
    assert listed(fan_out(40, {"type": "integer"})) == "schema_not_allowed"
    assert listed(fan_out(9, {"type": "integer"})) == "schema_not_allowed"  # ~2,000 > 1,000
    assert listed(fan_out(6, {"type": "integer"})) is None


def test_a_fan_out_through_any_of_one_of_and_not_is_counted_too():
    wide = {"anyOf": [{"oneOf": [{"not": {"type": "null"}}] * 40}] * 40}
    assert listed({"type": "object", "properties": {"x": wide}}) == "schema_not_allowed"


# -- at every check ----------------------------------------------------------------------------


def test_each_pattern_is_compiled_once_per_tool_not_at_each_application(monkeypatch):
    compiled = []
    real = schemas_module.re2.compile

    def counting(pattern, *args, **kwargs):
        compiled.append(pattern)
        return real(pattern, *args, **kwargs)

    monkeypatch.setattr(schemas_module.re2, "compile", counting)
    item = {"allOf": [{"pattern": "^[a-z]+$"}, {"pattern": "^[a-c]"}] * 4}
    checked = tool({"type": "object", "properties": {"xs": {"type": "array", "items": item}}})
    for _ in range(20):
        checked.parse({"xs": ["abc"] * 50})
    assert sorted(compiled) == ["^[a-c]", "^[a-z]+$"]


def test_unique_items_over_8000_items_is_linear():
    """jsonschema compares every pair: 151 s of CPU for these 8,000 objects."""
    schema = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
    items = [{"id": i, "name": f"item {i}", "tags": [i, str(i)]} for i in range(8_000)]
    checker = OutsideSchema(schema, cpu_seconds=30)
    outcome, spent, _ = cpu_and_peak(lambda: checker.errors({"xs": items}))
    assert outcome == [] and spent < 2.0
    outcome, spent, _ = cpu_and_peak(lambda: checker.errors({"xs": [*items, {**items[17]}]}))
    assert [e.message for e in outcome] == ["item 8000 repeats an earlier item"] and spent < 2.0


@pytest.mark.parametrize(
    "items, unique",
    [
        ([1, 1.0], False),  # one number
        ([1, True], True),  # true is not 1
        ([0, False, None, "", [], {}], True),
        ([[1, {"a": 2.0}], [1.0, {"a": 2}]], False),
        ([{"a": 1, "b": 2}, {"b": 2, "a": 1}], False),  # key order does not count
        ([{"a": [1]}, {"a": [True]}], True),
        (["1", 1], True),
    ],
)
def test_unique_items_keeps_json_schema_equality(items, unique):
    schema = {"type": "object", "properties": {"xs": {"type": "array", "uniqueItems": True}}}
    assert (OutsideSchema(schema).errors({"xs": items}) == []) is unique


def test_a_fan_out_recorded_before_the_listing_check_is_refused_within_the_cpu_budget():
    """A task pinned the schema before it was judged: the call costs ~0.1 s, not an hour."""
    checked = tool(fan_out(40, {"type": "integer"}))
    outcome, spent, _ = cpu_and_peak(lambda: checked.parse({"x": 1}))
    assert isinstance(outcome, ToolError) and outcome.code == "arguments_too_costly"
    assert "CPU" in outcome.message
    assert spent < 2.0


def test_a_long_required_fanned_out_is_refused_within_the_memory_budget():
    """5,000 missing names in each of 2**5 applications: 160,000 errors (~3 KiB each) before;
    the check stops at its budget of bytes or CPU, whichever comes first."""
    checked = tool(fan_out(5, required_of(5_000)), SPEC)
    outcome, spent, peak = cpu_and_peak(lambda: checked.parse({"x": {}}))
    assert isinstance(outcome, ToolError) and outcome.code == "arguments_too_costly"
    assert spent < 2.0
    assert peak < MAX_CHECK_BYTES + 16 * 1024 * 1024


def test_the_memory_budget_holds_without_the_cpu_budget():
    """The bytes counted are what the errors hold: a check allowed 16 MiB and all the CPU it
    wants stops holding about that much (tracemalloc), not the ~480 MB the errors would take."""
    budget = 16 * 1024 * 1024
    checker = OutsideSchema(fan_out(5, required_of(5_000)), cpu_seconds=600, max_bytes=budget)
    outcome, _, peak = cpu_and_peak(lambda: checker.errors({"x": {}}))
    assert isinstance(outcome, schemas_module.TooCostly) and "16 MiB" in str(outcome)
    assert budget / 2 < peak < budget * 1.5


def test_ordinary_arguments_are_checked_well_within_the_budget():
    schema = {
        "type": "object",
        "properties": {
            "rows": {
                "type": "array",
                "uniqueItems": True,
                "items": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "integer"},
                        "email": {"type": "string", "pattern": "^[^@]+@[^@]+$"},
                        "kind": {"enum": ["a", "b", "c"]},
                    },
                    "required": ["id", "email"],
                },
            }
        },
    }
    assert listed(schema) is None
    rows = [{"id": i, "email": f"u{i}@example.com", "kind": "a"} for i in range(300)]
    assert tool(schema).parse({"rows": rows})


# -- a cancel ---------------------------------------------------------------------------------


def test_a_cancel_stops_a_long_check_at_its_next_poll():
    """A check allowed ten minutes of CPU (a test's setting) is asked to stop after 0.3 s: it
    stops at the poll that follows, and polls come at most a few milliseconds of CPU apart (a
    cancel is honoured well within a second)."""
    checker = OutsideSchema(fan_out(40, {"type": "integer"}), cpu_seconds=600, max_steps=10**12)
    cancel = threading.Event()
    polls: list[tuple[float, bool]] = []

    def should_stop() -> bool:
        polls.append((time.thread_time(), cancel.is_set()))
        return cancel.is_set()

    timer = threading.Timer(0.3, cancel.set)
    timer.start()
    try:
        with pytest.raises(CheckStopped):
            checker.errors({"x": 1}, should_stop=should_stop)
    finally:
        timer.cancel()
    assert [asked for _, asked in polls].count(True) == 1 and polls[-1][1]
    gaps = [later - earlier for (earlier, _), (later, _) in itertools.pairwise(polls)]
    assert len(polls) > 10 and max(gaps) < 0.1
    assert POLL_EVERY <= 64


def test_the_engines_stop_signal_reaches_a_check_through_stop_checks_when():
    checker = OutsideSchema(fan_out(40, {"type": "integer"}), cpu_seconds=600, max_steps=10**12)
    with schemas_module.stop_checks_when(lambda: True), pytest.raises(CheckStopped):
        checker.errors({"x": 1})
    small = OutsideSchema({"type": "object", "properties": {"x": {"type": "integer"}}})
    assert [e.message for e in small.errors({"x": "no"})] == ["'no' is not of type 'integer'"]


def test_a_full_garbage_collection_inside_a_check_is_not_charged_to_it():
    """A full collection runs in whichever thread allocates when one is due, and costs the whole
    heap's size (over 100 ms in a worker holding thousands of runs): landing in a cheap check, it
    must not make the call "too costly". The check's own work is still bounded: a check whose
    work passes the budget is refused with or without collections (the tests above)."""
    heap = [[None] for _ in range(600_000)]  # a worker's heap: a full collection takes a while
    took: list[float] = []

    def collect_once() -> bool:  # polled inside the check, every POLL_EVERY steps
        if not took:
            started = time.thread_time()
            gc.collect()
            took.append(time.thread_time() - started)
        return False

    budget = 0.004
    schema = {
        "type": "object",
        "properties": {"xs": {"type": "array", "items": {"type": "integer"}}},
    }
    checker = OutsideSchema(schema, cpu_seconds=budget)
    checker.errors({"xs": [1]})  # built and warmed: the check below is a few steps' work
    assert checker.errors({"xs": list(range(4 * POLL_EVERY))}, should_stop=collect_once) == []
    assert took and took[0] > budget, took  # the collection alone took more than the budget
    assert len(heap) == 600_000
