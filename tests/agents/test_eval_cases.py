"""The shipped suite loads, covers what the issue asks for, and broken case files are refused."""

import pytest

from agents.catalogue.tools import tool_names
from agents.eval.cases import CASES_DIR, InvalidCase, load_cases, parse_case, suite_sha256

pytestmark = pytest.mark.django_db  # tool names come from the registry the app loads


def test_the_suite_has_at_least_twenty_valid_cases_with_unique_ids():
    cases = load_cases()
    assert len(cases) >= 20
    assert len({c.id for c in cases}) == len(cases)
    assert len(list(CASES_DIR.glob("*.yaml"))) == len(cases)
    for case in cases:
        assert set(case.tools) <= set(tool_names()), case.id
        assert case.expect


def test_the_suite_covers_the_tools_and_behaviours_of_the_seed():
    cases = {c.id: c for c in load_cases()}
    used = {tool for c in cases.values() for tool in c.tools}
    assert used >= {
        "update_plan",
        "list_files",
        "read_file",
        "search_files",
        "analyze_csv",
        "write_artifact",
        "fetch_url",
    }
    assert any("first_tool" in c.expect for c in cases.values())  # plan first
    assert any(
        "tools_not_called" in c.expect and "fetch_url" not in c.tools for c in cases.values()
    )
    assert [c.id for c in cases.values() if c.id.startswith("injection_")]
    decisions = {d.decision for c in cases.values() for d in c.decisions}
    assert decisions == {"approve", "deny"}
    assert any(c.limits.get("limit_turns", 99) <= 3 for c in cases.values())
    fetching = [c for c in cases.values() if c.needs_pages]
    assert fetching and all(c.allowed_domains for c in fetching)


def test_a_pattern_selects_cases_and_the_suite_hash_follows_the_selection():
    csv = load_cases("csv_*")
    assert [c.id for c in csv] == ["csv_filter_count", "csv_group_max", "csv_total"]
    assert [c.id for c in load_cases("csv_total, plan_first")] == ["csv_total", "plan_first"]
    assert load_cases("nothing_matches") == []
    assert suite_sha256(csv) == suite_sha256(list(reversed(csv)))
    assert suite_sha256(csv) != suite_sha256(load_cases("csv_total"))


def test_placeholders_become_the_runner_s_loopback_address():
    [case] = load_cases("fetch_page")
    assert "{page_url}" in case.instruction
    text = case.instruction_for("http://127.0.0.1:5000/fetch_page/")
    assert "http://127.0.0.1:5000/fetch_page/status.html" in text
    assert case.domains_for("127.0.0.1") == ["127.0.0.1"]


MINIMAL = "id: ok_case\ntitle: T\ninstruction: Do it.\nexpect: {state: review}\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("- a list", "a case is a mapping"),
        ("id: Bad-Id\ntitle: T\ninstruction: x\nexpect: {state: review}", "id must be"),
        (MINIMAL + "colour: blue\n", "unknown keys colour"),
        ("id: x\ntitle: T\ninstruction: ''\nexpect: {state: review}", "instruction is required"),
        ("id: x\ntitle: T\ninstruction: Do\n", "expect"),
        (MINIMAL + "decisions: [{tool: fetch_url, decision: maybe}]\n", "each decision"),
        (MINIMAL + "limits: {limit_turns: 0}\n", "positive whole numbers"),
        ("id: x\ntitle: T\ninstruction: Do\nexpect: {answer_has: [a]}", "unknown checks"),
        ("id: x\ntitle: [unclosed\n", "not valid YAML"),
    ],
)
def test_a_broken_case_is_refused_with_a_stable_code(text, message):
    with pytest.raises(InvalidCase, match=message) as exc:
        parse_case(text, name="broken.yaml")
    assert exc.value.code == "eval_case_invalid"


def test_one_broken_file_refuses_the_whole_suite(tmp_path):
    (tmp_path / "a.yaml").write_text(MINIMAL)
    assert [c.id for c in load_cases(folder=tmp_path)] == ["ok_case"]
    (tmp_path / "b.yaml").write_text(MINIMAL)
    with pytest.raises(InvalidCase, match="two cases share the id ok_case"):
        load_cases(folder=tmp_path)
