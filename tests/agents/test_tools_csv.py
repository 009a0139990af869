"""analyze_csv: exact statistics on a small file, filters/groups, hostile files, 100 MB."""

import json
import math
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from agents.catalogue.tools import ToolContext, ToolError, get_tool

pytestmark = pytest.mark.timeout(30)

ROOT = Path(__file__).resolve().parents[2]

PEOPLE = """id,name,amount,active,joined,region
1,alice,10.5,true,2024-01-05,north
2,bob,20,false,2024-02-10,south
3,carol,,true,2024-03-15,north
4,dave,30.25,yes,2023-12-31,east
5,eve,-5,no,2024-01-01,south
"""


@pytest.fixture
def ws(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    root.mkdir()
    (root / "people.csv").write_text(PEOPLE)
    return root


@pytest.fixture
def ctx(ws: Path) -> ToolContext:
    return ToolContext(workspace=ws, artifacts_dir=ws.parent / "artifacts")


def analyze(ctx, **args):
    tool = get_tool("analyze_csv")
    return tool.run(tool.parse(args), ctx)


def refused(ctx, **args) -> ToolError:
    with pytest.raises(ToolError) as info:
        analyze(ctx, **args)
    return info.value


def cols(result) -> dict:
    return {c["name"]: c for c in result.data["columns"]}


def test_types_and_exact_statistics(ctx):
    r = analyze(ctx, path="people.csv")
    assert r.data["rows"] == 5
    assert r.data["delimiter"] == ","
    assert r.data["column_names"] == ["id", "name", "amount", "active", "joined", "region"]
    c = cols(r)
    assert {n: c[n]["type"] for n in c} == {
        "id": "int",
        "name": "text",
        "amount": "float",
        "active": "bool",
        "joined": "date",
        "region": "text",
    }
    assert c["id"]["min"] == 1 and c["id"]["max"] == 5 and c["id"]["sum"] == 15
    assert c["id"]["mean"] == 3.0
    assert c["id"]["stddev"] == pytest.approx(math.sqrt(2.5), abs=1e-12)
    amounts = [10.5, 20, 30.25, -5]
    assert c["amount"]["count"] == 4 and c["amount"]["nulls"] == 1
    assert c["amount"]["min"] == -5 and c["amount"]["max"] == 30.25
    assert c["amount"]["sum"] == pytest.approx(55.75)
    assert c["amount"]["mean"] == pytest.approx(statistics.mean(amounts), abs=1e-12)
    assert c["amount"]["stddev"] == pytest.approx(statistics.stdev(amounts), abs=1e-12)
    assert c["active"]["true"] == 3 and c["active"]["false"] == 2
    assert c["joined"]["min"] == "2023-12-31" and c["joined"]["max"] == "2024-03-15"
    assert c["name"]["distinct"] == 5 and c["region"]["distinct"] == 3
    assert c["region"]["distinct_capped"] is False
    assert len(r.data["preview"]) == 5
    assert "- amount: float; 4 values; 1 empty/null; min -5, max 30.25, mean 13.9375" in r.text
    json.dumps(r.data)  # JSON-serialisable


def test_filter_preview_and_columns(ctx):
    r = analyze(
        ctx,
        path="people.csv",
        columns=["name", "amount"],
        filter={"column": "amount", "op": "gt", "value": 10},
        preview_rows=2,
    )
    assert r.data["matched_rows"] == 3
    assert r.data["preview_columns"] == ["name", "amount"]
    assert r.data["preview"] == [["alice", "10.5"], ["bob", "20"]]
    assert [c["name"] for c in r.data["columns"]] == ["name", "amount"]
    assert "Filter amount gt 10: 3 matching rows" in r.text
    assert "name,amount\nalice,10.5\nbob,20" in r.text


@pytest.mark.parametrize(
    ("flt", "names"),
    [
        ({"column": "region", "op": "eq", "value": "north"}, ["alice", "carol"]),
        ({"column": "region", "op": "ne", "value": "north"}, ["bob", "dave", "eve"]),
        ({"column": "name", "op": "contains", "value": "AR"}, ["carol"]),
        ({"column": "amount", "op": "le", "value": "20"}, ["alice", "bob", "eve"]),
        ({"column": "amount", "op": "lt", "value": 0}, ["eve"]),
        ({"column": "amount", "op": "ge", "value": 20}, ["bob", "dave"]),
        ({"column": "id", "op": "eq", "value": 3}, ["carol"]),
        ({"column": "active", "op": "eq", "value": True}, ["alice", "carol", "dave"]),
        ({"column": "joined", "op": "ge", "value": "2024-02-01"}, ["bob", "carol"]),
    ],
)
def test_filter_operators(ctx, flt, names):
    r = analyze(ctx, path="people.csv", filter=flt, columns=["name"])
    assert [row[0] for row in r.data["preview"]] == names
    assert r.data["matched_rows"] == len(names)


def test_group_by_with_aggregates(ctx):
    r = analyze(
        ctx, path="people.csv", group_by="region", aggregate={"column": "amount", "func": "sum"}
    )
    groups = {g["key"]: g for g in r.data["groups"]}
    assert [g["key"] for g in r.data["groups"]] == ["east", "north", "south"]
    assert groups["east"]["value"] == 30.25
    assert groups["north"]["value"] == 10.5 and groups["north"]["rows"] == 2
    assert groups["south"]["value"] == 15.0
    assert groups["north"]["non_numeric"] == 0  # empty is not "non-numeric"
    assert "Groups by region (sum of amount): 3 groups" in r.text
    means = analyze(
        ctx, path="people.csv", group_by="region", aggregate={"column": "amount", "func": "mean"}
    )
    assert {g["key"]: g["value"] for g in means.data["groups"]} == {
        "east": 30.25,
        "north": 10.5,
        "south": 7.5,
    }
    counts = analyze(ctx, path="people.csv", group_by="active")
    assert {g["key"]: g["value"] for g in counts.data["groups"]} == {
        "false": 1,
        "no": 1,
        "true": 2,
        "yes": 1,
    }
    non_null = analyze(
        ctx, path="people.csv", group_by="region", aggregate={"column": "amount", "func": "count"}
    )
    assert {g["key"]: g["value"] for g in non_null.data["groups"]}["north"] == 1


def test_aggregate_without_group_over_filtered_rows(ctx):
    r = analyze(
        ctx,
        path="people.csv",
        filter={"column": "region", "op": "eq", "value": "south"},
        aggregate={"column": "amount", "func": "min"},
    )
    assert r.data["aggregate"]["value"] == -5.0 and r.data["aggregate"]["rows"] == 2
    r = analyze(ctx, path="people.csv", aggregate={"column": "amount", "func": "max"})
    assert r.data["aggregate"]["value"] == 30.25
    assert "Aggregate max of amount: 30.25 over 5 rows" in r.text


def test_unknown_columns_are_invalid_arguments(ctx):
    for args in (
        {"filter": {"column": "nope", "op": "eq", "value": 1}},
        {"group_by": "nope"},
        {"columns": ["id", "nope"]},
        {"aggregate": {"column": "nope", "func": "sum"}},
    ):
        err = refused(ctx, path="people.csv", **args)
        assert err.code == "invalid_arguments"
        assert "'nope'" in err.message and "Columns are: id, name, amount" in err.message


@pytest.mark.parametrize(
    "args",
    [
        {"path": "people.csv", "aggregate": {"func": "sum"}},
        {"path": "people.csv", "preview_rows": 201},
        {"path": "people.csv", "delimiter": "ab"},
        {"path": "people.csv", "delimiter": "a"},
        {"path": "people.csv", "filter": {"column": "id", "op": "regex", "value": "x"}},
        {"path": "people.csv", "filter": {"column": "id", "op": "eq"}},
    ],
)
def test_bad_arguments(ctx, args):
    assert refused(ctx, **args).code == "invalid_arguments"


def test_delimiters_sniffed_or_given(ws, ctx):
    (ws / "semi.csv").write_text("a;b;c\n1;2,5;x\n3;4,5;y\n")
    r = analyze(ctx, path="semi.csv")
    assert r.data["delimiter"] == ";" and r.data["column_names"] == ["a", "b", "c"]
    (ws / "tabs.tsv").write_text("a\tb\n1\t2\n3\t4\n")
    for d in ("\t", "\\t", "tab"):
        r = analyze(ctx, path="tabs.tsv", delimiter=d)
        assert r.data["delimiter"] == "\t" and cols(r)["b"]["sum"] == 6
    (ws / "pipes.csv").write_text("x|y\n1|2\n")
    assert analyze(ctx, path="pipes.csv", delimiter="|").data["column_names"] == ["x", "y"]


def test_quoted_fields_bom_crlf_blank_lines_and_headers(ws, ctx):
    (ws / "q.csv").write_bytes(
        b'\xef\xbb\xbfname,,name,note\r\n"Smith, J",1,a,"multi\r\nline"\r\n\r\nDoe,2,b,plain\r\n'
    )
    r = analyze(ctx, path="q.csv")
    assert r.data["column_names"] == ["name", "column_2", "name_2", "note"]
    assert r.data["rows"] == 2 and r.data["blank_lines"] == 1
    assert r.data["preview"][0] == ["Smith, J", "1", "a", "multi\r\nline"]


def test_type_transitions(ws, ctx):
    (ws / "t.csv").write_text("a,b,c\n1,1,x\n2,2.5,\n3,oops,NULL\n")
    c = cols(analyze(ctx, path="t.csv"))
    assert c["a"]["type"] == "int"
    assert c["b"]["type"] == "text" and c["b"]["text_from_row"] == 3
    assert c["b"]["first_text_value"] == "oops"
    assert c["c"]["type"] == "text" and c["c"]["nulls"] == 2
    (ws / "f.csv").write_text("a\n1\n2.5\n")
    assert cols(analyze(ctx, path="f.csv"))["a"]["type"] == "float"
    (ws / "e.csv").write_text("a,b\n,1\n,2\n")
    assert cols(analyze(ctx, path="e.csv"))["a"]["type"] == "empty"
    (ws / "d.csv").write_text("when\n2024-01-05T10:00:00\n2024-01-06\n")
    assert cols(analyze(ctx, path="d.csv"))["when"]["type"] == "datetime"


def test_distinct_and_group_caps(ws, ctx):
    lines = ["k,v"] + [f"key{i},{i}" for i in range(1500)]
    (ws / "wide.csv").write_text("\n".join(lines) + "\n")
    r = analyze(ctx, path="wide.csv", group_by="k", aggregate={"column": "v", "func": "sum"})
    k = cols(r)["k"]
    assert k["distinct_capped"] is True and k["distinct"] == 1000
    assert "distinct 1000+" in r.text
    assert len(r.data["groups"]) == 1000
    assert r.data["groups_truncated"] is True and r.data["rows_outside_groups"] == 500


def test_one_ragged_row_is_tolerated_with_a_warning(ws, ctx):
    (ws / "r.csv").write_text("a,b,c\n1,2,3\n4,5\n6,7,8\n")
    r = analyze(ctx, path="r.csv")
    assert r.data["ragged_rows"] == 1 and r.data["ragged_lines"] == [3]
    assert cols(r)["c"]["nulls"] == 1
    assert "different number of fields" in r.text


def test_many_ragged_rows_are_malformed(ws, ctx):
    rows = ["a,b,c"] + ["1,2,3"] * 20 + ["1,2,3,4,5"] * 10
    (ws / "r.csv").write_text("\n".join(rows) + "\n")
    err = refused(ctx, path="r.csv")
    assert err.code == "csv_malformed"
    assert "10 of 30 rows" in err.message and "lines 22, 23, 24, 25, 26" in err.message


GOOD_ROWS = b"a,b\n" + b"1,2\n" * 20_000  # 80 KB: past the 64 KiB binary sniff


@pytest.mark.parametrize(
    ("content", "fragment"),
    [
        (b"a,b\n1,2\n3,\x004\n", "looks like a binary file"),
        (b"\x00\x01\x02binary", "looks like a binary file"),
        (GOOD_ROWS + b"3,\x004\n", "NUL byte at line 20002"),
        (b"a,b\n1,2\nx,caf\xe9\n", "looks like a binary file"),
        (GOOD_ROWS + b"x,caf\xe9\n" * 5, "not valid UTF-8 near line"),
        (b"", "empty"),
        (b"\n\n\n", "empty"),
    ],
)
def test_malformed_files(ws, ctx, content, fragment):
    (ws / "bad.csv").write_bytes(content)
    err = refused(ctx, path="bad.csv")
    assert err.code == "csv_malformed"
    assert fragment in err.message


def test_field_larger_than_the_limit(ws, ctx):
    (ws / "big_field.csv").write_text('a,b\n1,"' + "x" * 2_000_000 + '"\n')
    err = refused(ctx, path="big_field.csv")
    assert err.code == "csv_malformed" and "field larger than field limit" in err.message


def test_line_without_breaks_is_refused_without_loading_it(ws, ctx):
    with open(ws / "oneline.csv", "wb") as fh:
        fh.write(b"a,b\n")
        chunk = b"1," * 500_000
        for _ in range(10):  # 10 MB with no line break
            fh.write(chunk)
    err = refused(ctx, path="oneline.csv")
    assert err.code == "csv_malformed" and "longer than" in err.message


def test_paths_are_confined(ws, ctx):
    assert refused(ctx, path="../people.csv").code == "path_outside_workspace"
    assert refused(ctx, path="missing.csv").code == "path_not_found"


@pytest.mark.timeout(330)
def test_100mb_csv_in_bounded_memory(ws):
    """Generates >=100 MB quickly (one block written repeatedly) and analyses it in a child
    process, whose peak RSS growth during the analysis must stay far below the file size."""
    regions = ["north", "south", "east", "west", "centre", "islands", "abroad"]
    block = "".join(
        f"{i},{i * 0.5},{regions[i % 7]},{'true' if i % 3 == 0 else 'false'},"
        f"2024-{i % 12 + 1:02d}-{i % 28 + 1:02d},note {i:04d} {'lorem ipsum dolor sit amet ' * 5}\n"
        for i in range(1000)
    ).encode()
    blocks = -(-100_000_000 // len(block))
    path = ws / "big.csv"
    with open(path, "wb") as fh:
        fh.write(b"id,amount,region,flag,day,note\n")
        for _ in range(blocks):
            fh.write(block)
    size = path.stat().st_size
    assert size >= 100_000_000

    # VmHWM (peak RSS) is per process and starts afresh at exec; ru_maxrss would be
    # inherited from this (pytest) process.
    script = f"""
import json, sys, time
from agents.catalogue.tools import ToolContext, get_tool

def hwm_kib():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    return None

tool = get_tool("analyze_csv")
ctx = ToolContext(workspace={str(ws)!r}, artifacts_dir={str(ws)!r} + "/../a")
args = tool.parse({{"path": "big.csv", "group_by": "region",
                   "aggregate": {{"column": "amount", "func": "sum"}},
                   "filter": {{"column": "amount", "op": "gt", "value": 400}}}})
before = hwm_kib()
start = time.monotonic()
result = tool.run(args, ctx)
elapsed = time.monotonic() - start
after = hwm_kib()
print(json.dumps({{"data": result.data, "before_kib": before, "after_kib": after,
                  "elapsed": elapsed}}))
"""
    # Speed belongs in bench/: the timeout only stops a hang, on however loaded a box.
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    data = out["data"]
    if out["before_kib"] is None:
        pytest.skip("no VmHWM in /proc/self/status on this system")
    growth = (out["after_kib"] - out["before_kib"]) * 1024
    assert growth < 32 * 1024 * 1024, f"peak RSS grew by {growth} bytes"
    assert out["after_kib"] * 1024 < size // 2, f"peak RSS {out['after_kib']} KiB"

    assert data["rows"] == blocks * 1000
    c = {col["name"]: col for col in data["columns"]}
    assert c["id"]["type"] == "int" and c["id"]["min"] == 0 and c["id"]["max"] == 999
    assert c["id"]["sum"] == blocks * sum(range(1000))
    assert c["amount"]["mean"] == pytest.approx(249.75)
    assert c["amount"]["stddev"] == pytest.approx(
        statistics.stdev([i * 0.5 for i in range(1000)]), rel=1e-3
    )
    assert c["region"]["distinct"] == 7 and c["note"]["distinct"] == 1000
    assert c["flag"]["true"] == blocks * 334
    assert c["day"]["type"] == "date" and c["day"]["max"] == "2024-12-28"
    per_block = {r: sum(i * 0.5 for i in range(801, 1000) if regions[i % 7] == r) for r in regions}
    groups = {g["key"]: g["value"] for g in data["groups"]}
    assert groups == {r: pytest.approx(v * blocks) for r, v in per_block.items()}
    assert data["matched_rows"] == blocks * 199
