"""``analyze_csv``: one streaming pass over a CSV file in the workspace.

Memory stays bounded whatever the file size: rows are read one at a time with
the ``csv`` module from a line reader that caps physical line length, numeric
statistics use Welford's running mean/variance, distinct values are tracked as
hashes up to ``DISTINCT_CAP`` per column, the preview keeps ``preview_rows``
rows and grouping keeps at most ``MAX_GROUPS`` groups.

Profile statistics (types, nulls, min/max/mean/stddev, distinct counts) cover
*all* rows; ``filter`` selects the rows used for the preview and aggregates.
"""

from __future__ import annotations

import csv
import functools
import io
import math
import re
import time
from datetime import datetime
from typing import Any, BinaryIO, Literal

from pydantic import Field, field_validator, model_validator

from .base import Tool, ToolArgs, ToolContext, ToolError, ToolResult
from .files import (
    _rel,
    _resolve,
    _workspace_root,
    check_workspace_path,
    looks_binary,
    open_regular_file,
)
from .recovery_class import RecoveryClass
from .registry import register

CSV_FIELD_LIMIT = 1_048_576  # bytes/characters per field (csv.field_size_limit)
CSV_LINE_LIMIT = 8 << 20  # characters per physical line
SNIFF_BYTES = 64 * 1024
DISTINCT_CAP = 1000
MAX_GROUPS = 1000
MAX_RAGGED_ABORT = 1000
RAGGED_TOLERANCE_FRACTION = 0.01
RAGGED_TOLERANCE_MIN = 5
PREVIEW_CELL_CHARS = 200
GROUP_KEY_CHARS = 200
TEXT_GROUPS_SHOWN = 200
TIME_BUDGET_SECONDS = 300.0

TRUE_TOKENS = frozenset({"true", "yes", "y", "t"})
FALSE_TOKENS = frozenset({"false", "no", "n", "f"})
BOOL_TOKENS = TRUE_TOKENS | FALSE_TOKENS


def _spellings(words: set[str]) -> frozenset[str]:
    return frozenset(v for w in words for v in (w, w.upper(), w.capitalize()))


# Exact-match sets (lower, UPPER, Capitalised) so the hot loop needs no .lower() call.
NULL_VALUES = _spellings({"", "na", "n/a", "null", "none", "nan", "#n/a"}) | {"NaN", "N/a"}
TRUE_VALUES = _spellings(set(TRUE_TOKENS))
BOOL_VALUES = _spellings(set(BOOL_TOKENS))
_DATE_RE = re.compile(
    r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d{1,6})?)?(?:Z|[+-]\d{2}:?\d{2})?)?"
)


class CsvFilter(ToolArgs):
    column: str = Field(..., min_length=1)
    op: Literal["eq", "ne", "gt", "lt", "ge", "le", "contains"]
    value: bool | int | float | str = Field(
        ..., description="Compared numerically when both sides are numbers, else as text."
    )


class CsvAggregate(ToolArgs):
    column: str | None = Field(None, description="Numeric column; optional for func=count.")
    func: Literal["count", "sum", "mean", "min", "max"]

    @model_validator(mode="after")
    def _column_needed(self) -> CsvAggregate:
        if self.func != "count" and not self.column:
            raise ValueError(f"aggregate.column is required for func={self.func!r}")
        return self


class AnalyzeCsvArgs(ToolArgs):
    path: str = Field(..., min_length=1, description="CSV file relative to the workspace root.")
    delimiter: str | None = Field(
        None, description="One character, or 'tab'/'\\t'. Detected from the file when omitted."
    )
    columns: list[str] | None = Field(
        None, max_length=500, description="Only profile and preview these columns."
    )
    filter: CsvFilter | None = Field(None, description="Keep only rows matching this condition.")
    group_by: str | None = Field(None, description="Group matching rows by this column.")
    aggregate: CsvAggregate | None = Field(
        None, description="Aggregate over matching rows (per group when group_by is set)."
    )
    preview_rows: int = Field(20, ge=0, le=200, description="Matching rows to show.")

    @field_validator("delimiter")
    @classmethod
    def _check_delimiter(cls, v: str | None) -> str | None:
        if v is None:
            return None
        if v in ("\\t", "tab", "TAB"):
            return "\t"
        if len(v) != 1:
            raise ValueError("delimiter must be a single character (or 'tab')")
        if v in '"\r\n' or v.isalnum():
            raise ValueError("delimiter cannot be a quote, newline, letter or digit")
        return v


def _fmt(x: Any) -> str:
    if isinstance(x, float):
        return format(x, ".10g")
    return str(x)


class _Column:
    __slots__ = (
        "distinct",
        "distinct_over",
        "has_time",
        "kind",
        "m2",
        "max",
        "max_len",
        "mean",
        "min",
        "n",
        "name",
        "nulls",
        "samples",
        "text_since_row",
        "text_value",
        "total",
        "true_count",
        "values",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.nulls = 0
        self.values = 0
        self.kind: str | None = None  # None until the first non-null value
        self.n = 0
        self.mean = 0.0
        self.m2 = 0.0
        self.total: int | float = 0
        self.min: Any = None
        self.max: Any = None
        self.true_count = 0
        self.has_time = False
        self.distinct: set[str | int] | None = set()  # a value, or the hash of a long one
        self.distinct_over = False
        self.samples: list[str] = []
        self.max_len = 0
        self.text_since_row: int | None = None
        self.text_value: str | None = None

    def _num(self, x: int | float) -> None:
        self.n += 1
        d = x - self.mean
        self.mean += d / self.n
        self.m2 += d * (x - self.mean)
        self.total += x
        if self.min is None or x < self.min:
            self.min = x
        if self.max is None or x > self.max:
            self.max = x

    def _to_text(self, value: str, row: int) -> None:
        self.kind = "text"
        self.max_len = max(self.max_len, len(value))
        self.min = self.max = None
        self.text_since_row = row
        self.text_value = value[:60]

    def add(self, raw: str, row: int) -> None:
        s = raw.strip()
        if s in NULL_VALUES:
            self.nulls += 1
            return
        self.values += 1
        distinct = self.distinct
        if distinct is not None:
            self._count_distinct(distinct, s)
        kind = self.kind
        if kind == "text":
            if len(s) > self.max_len:
                self.max_len = len(s)
        elif kind is None:
            self._first(s, row)
        else:
            self._add_typed(kind, s, row)

    def _count_distinct(self, distinct: set[str | int], s: str) -> None:
        """Track the value among the distinct ones (a long one by its hash) until the cap."""
        key = s if len(s) <= 128 else hash(s)
        if key not in distinct:
            distinct.add(key)
            if len(self.samples) < 5:
                self.samples.append(s[:60])
            if len(distinct) > DISTINCT_CAP:
                self.distinct = None
                self.distinct_over = True

    def _first(self, s: str, row: int) -> None:
        """The first value decides the starting kind."""
        try:
            first = int(s)
        except ValueError:
            pass
        else:
            self.kind = "int"
            self._num(first)
            return
        x = _parse_float(s)
        if x is not None:
            self.kind = "float"
            self._num(x)
        elif s in BOOL_VALUES:
            self.kind = "bool"
            self.true_count += s in TRUE_VALUES
        elif _is_date(s):
            self.kind = "date"
            self._date(s)
        else:
            self._to_text(s, row)

    def _add_typed(self, kind: str, s: str, row: int) -> None:
        """A value for a column of that kind; one that does not fit widens an int column to
        float, any other to text."""
        if kind == "int":
            try:
                self._num(int(s))
                return
            except ValueError:
                pass
            x = _parse_float(s)
            if x is None:
                self._to_text(s, row)
            else:
                self.kind = "float"
                self._num(x)
        elif kind == "float":
            x = _parse_float(s)
            if x is None:
                self._to_text(s, row)
            else:
                self._num(x)
        elif kind == "bool":
            if s in BOOL_VALUES:
                self.true_count += s in TRUE_VALUES
            else:
                self._to_text(s, row)
        elif kind == "date":
            if _is_date(s):
                self._date(s)
            else:
                self._to_text(s, row)

    def _date(self, s: str) -> None:
        if len(s) > 10:
            self.has_time = True
        if self.min is None or s < self.min:
            self.min = s
        if self.max is None or s > self.max:
            self.max = s

    def summary(self) -> dict[str, Any]:
        kind = self.kind or "empty"
        if kind == "date" and self.has_time:
            kind = "datetime"
        out: dict[str, Any] = {
            "name": self.name,
            "type": kind,
            "non_null": self.values,
            "nulls": self.nulls,
            "distinct": DISTINCT_CAP if self.distinct_over else len(self.distinct or ()),
            "distinct_capped": self.distinct_over,
            "sample_values": self.samples,
        }
        if kind in ("int", "float"):
            out.update(
                count=self.n,
                min=self.min,
                max=self.max,
                sum=self.total,
                mean=self.mean,
                stddev=math.sqrt(self.m2 / (self.n - 1)) if self.n > 1 else None,
            )
        elif kind == "bool":
            out.update(true=self.true_count, false=self.values - self.true_count)
        elif kind in ("date", "datetime"):
            out.update(min=self.min, max=self.max)
        elif kind == "text":
            out["max_length"] = self.max_len
            if self.text_since_row is not None and self.text_since_row > 1:
                out["text_from_row"] = self.text_since_row
                out["first_text_value"] = self.text_value
        return out


def _parse_float(s: str) -> float | None:
    try:
        x = float(s)
    except ValueError:
        return None
    if not math.isfinite(x):
        return None
    return x


@functools.lru_cache(maxsize=4096)
def _is_date(s: str) -> bool:
    if not _DATE_RE.fullmatch(s):
        return False
    try:
        datetime.fromisoformat(s)
    except ValueError:
        return False
    return True


def _as_number(v: Any) -> float | None:
    if isinstance(v, bool):
        return None
    if isinstance(v, (int, float)):
        return float(v) if math.isfinite(v) else None
    if isinstance(v, str):
        return _parse_float(v.strip())
    return None  # pragma: no cover


class _RowFilter:
    def __init__(self, spec: CsvFilter, index: int) -> None:
        self.index = index
        self.op = spec.op
        value = spec.value
        self.num = _as_number(value)
        self.boolean: bool | None = value if isinstance(value, bool) else None
        self.text = str(value).strip() if not isinstance(value, bool) else str(value).lower()
        self.text_fold = self.text.casefold()

    def __call__(self, row: list[str]) -> bool:
        cell = row[self.index].strip() if self.index < len(row) else ""
        op = self.op
        if op == "contains":
            return self.text_fold in cell.casefold()
        if self.boolean is not None:
            low = cell.lower()
            if low not in BOOL_TOKENS:
                return op == "ne"
            same = (low in TRUE_TOKENS) == self.boolean
            return same if op == "eq" else (not same if op == "ne" else False)
        if self.num is not None:
            x = _parse_float(cell) if cell else None
            if x is not None:
                return _compare(x, self.num, op)
            if op in ("eq", "ne"):
                return _compare(cell, self.text, op)
            return False
        return _compare(cell, self.text, op)


def _compare[T: (str, float)](a: T, b: T, op: str) -> bool:
    if op == "eq":
        return a == b
    if op == "ne":
        return a != b
    if op == "gt":
        return a > b
    if op == "lt":
        return a < b
    if op == "ge":
        return a >= b
    return a <= b  # le


class _Agg:
    __slots__ = ("max", "min", "n", "non_null", "rows", "skipped", "total")

    def __init__(self) -> None:
        self.rows = 0
        self.non_null = 0
        self.n = 0
        self.total = 0.0
        self.min: float | None = None
        self.max: float | None = None
        self.skipped = 0

    def add(self, cell: str | None) -> None:
        self.rows += 1
        if cell is None:
            return
        cell = cell.strip()
        if cell in NULL_VALUES:
            return
        self.non_null += 1
        x = _parse_float(cell)
        if x is None:
            self.skipped += 1
            return
        self.n += 1
        self.total += x
        if self.min is None or x < self.min:
            self.min = x
        if self.max is None or x > self.max:
            self.max = x

    def value(self, func: str, has_column: bool) -> float | int | None:
        if func == "count":
            return self.non_null if has_column else self.rows
        if func == "sum":
            return self.total
        if func == "mean":
            return self.total / self.n if self.n else None
        if func == "min":
            return self.min
        return self.max


class _GuardedRaw(io.RawIOBase):
    """Raw byte stream over the CSV file that refuses NUL bytes and over-long lines.

    Checks run per block at C speed, so the text layer and ``csv.reader`` stay fast
    and a file without line breaks can never be pulled into memory as one line.
    """

    def __init__(self, f: BinaryIO, line_limit: int) -> None:
        super().__init__()
        self._f = f
        self._limit = line_limit
        self._run = 0  # bytes since the last line break
        self.lines = 0  # line breaks seen so far

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self._f.read(len(buffer))
        n = len(data)
        if not n:
            return 0
        if b"\x00" in data:
            line = self.lines + data.count(b"\n", 0, data.index(b"\x00")) + 1
            raise ToolError(
                "csv_malformed",
                f"NUL byte at line {line}; this does not look like a text CSV file.",
            )
        last_break = max(data.rfind(b"\n"), data.rfind(b"\r"))
        if last_break < 0:
            self._run += n
        else:
            first_break = min(i for i in (data.find(b"\n"), data.find(b"\r")) if i >= 0)
            if self._run + first_break > self._limit:
                self._run += first_break
            else:
                self._run = n - last_break - 1
        if self._run > self._limit:
            raise ToolError(
                "csv_malformed",
                f"Line {self.lines + 1} is longer than {self._limit} bytes; refused.",
            )
        self.lines += data.count(b"\n")
        buffer[:n] = data
        return n


def _sniff_delimiter(head: bytes) -> str:
    sample = head.decode("utf-8", "replace").lstrip("\ufeff")
    cut = max(sample.rfind("\n"), 0)
    sample = sample[:cut] if cut else sample
    try:
        return csv.Sniffer().sniff(sample, delimiters=",;\t|").delimiter
    except csv.Error:
        return ","


def _unique_headers(raw: list[str]) -> list[str]:
    seen: dict[str, int] = {}
    out = []
    for i, h in enumerate(raw):
        name = h.strip() or f"column_{i + 1}"
        if name in seen:
            seen[name] += 1
            name = f"{name}_{seen[name]}"
        seen.setdefault(name, 1)
        out.append(name)
    return out


def _group_sort_key(item: tuple[str, _Agg]) -> tuple[int, float, str]:
    x = _parse_float(item[0])
    return (0, x, "") if x is not None else (1, 0.0, item[0])


def _header_row(reader: Any, rel: str) -> list[str]:
    """The first non-empty row."""
    for row in reader:
        if row:
            return list(row)
    raise ToolError("csv_malformed", f"{rel!r} is empty: no header row found.")


class _Query:
    """The arguments resolved against the header: the indexes of the columns to profile and
    of those to filter, group and aggregate by."""

    def __init__(self, args: AnalyzeCsvArgs, headers: list[str]) -> None:
        self._headers = headers
        self._index = {h: i for i, h in enumerate(headers)}
        self.selected = (
            [self._col(c, "columns") for c in args.columns]
            if args.columns
            else list(range(len(headers)))
        )
        self.row_filter = (
            _RowFilter(args.filter, self._col(args.filter.column, "filter"))
            if args.filter
            else None
        )
        self.group_idx = self._col(args.group_by, "group_by") if args.group_by else None
        self.agg = args.aggregate
        self.agg_idx = (
            self._col(self.agg.column, "aggregate") if self.agg and self.agg.column else None
        )
        self.do_agg = self.group_idx is not None or self.agg is not None

    def _col(self, name: str, what: str) -> int:
        if name not in self._index:
            headers = self._headers
            shown = ", ".join(headers[:50]) + (" …" if len(headers) > 50 else "")
            raise ToolError(
                "invalid_arguments",
                f"Unknown column {name!r} in {what}. Columns are: {shown}.",
            )
        return self._index[name]


class _Scan:
    """What one pass over the data rows has seen: the column profiles, the rows whose field
    count differs from the header's, the preview and the aggregates of the matching rows."""

    def __init__(self, args: AnalyzeCsvArgs, headers: list[str], delimiter: str) -> None:
        self.query = _Query(args, headers)
        self.headers = headers
        self.width = len(headers)
        self.delimiter = delimiter
        self.preview_rows = args.preview_rows
        self.profiles = [_Column(headers[i]) for i in self.query.selected]
        self._pairs = list(zip(self.query.selected, self.profiles, strict=True))
        self.preview: list[list[str]] = []
        self.groups: dict[str, _Agg] = {}
        self.overall = _Agg()
        self.groups_truncated = False
        self.rows_outside_groups = 0
        self.rows = 0
        self.matched = 0
        self.blank = 0
        self.ragged = 0
        self.ragged_lines: list[int] = []

    def add(self, row: list[str], line_num: int) -> None:
        """One non-empty data row, ending at line ``line_num``."""
        self.rows += 1
        if len(row) != self.width:
            row = self._even_out(row, line_num)
        for i, prof in self._pairs:
            prof.add(row[i], self.rows)
        query = self.query
        if query.row_filter is None or query.row_filter(row):
            self.matched += 1
            if len(self.preview) < self.preview_rows:
                self.preview.append([row[i][:PREVIEW_CELL_CHARS] for i in query.selected])
            if query.do_agg:
                self._aggregate(row)

    def _even_out(self, row: list[str], line_num: int) -> list[str]:
        """Count a row whose field count differs from the header's, refusing the file when
        there are too many; a short one is padded with empty values."""
        self.ragged += 1
        if len(self.ragged_lines) < 5:
            self.ragged_lines.append(line_num)
        if self.ragged > MAX_RAGGED_ABORT:
            raise ToolError("csv_malformed", f"Too many rows with {self._ragged_detail()}")
        if len(row) < self.width:
            row = row + [""] * (self.width - len(row))
        return row

    def _ragged_detail(self) -> str:
        return (
            f"a field count different from the header's {self.width} "
            f"(first at lines {', '.join(map(str, self.ragged_lines))}). "
            f"Is the delimiter {self.delimiter!r} right?"
        )

    def _aggregate(self, row: list[str]) -> None:
        """Add a matching row to its group (while there is room for one more group), or to
        the overall aggregate when there is no grouping."""
        query = self.query
        cell = row[query.agg_idx] if query.agg_idx is not None else None
        if query.group_idx is None:
            self.overall.add(cell)
            return
        key = row[query.group_idx].strip()[:GROUP_KEY_CHARS] or "(empty)"
        acc = self.groups.get(key)
        if acc is None:
            if len(self.groups) >= MAX_GROUPS:
                self.groups_truncated = True
                self.rows_outside_groups += 1
                return
            acc = self.groups[key] = _Agg()
        acc.add(cell)

    def check_ragged(self) -> None:
        """Refuse the file when more rows than the tolerance have the wrong field count."""
        tolerance = max(RAGGED_TOLERANCE_MIN, int(self.rows * RAGGED_TOLERANCE_FRACTION))
        if self.ragged > tolerance:
            raise ToolError(
                "csv_malformed",
                f"{self.ragged} of {self.rows} rows have {self._ragged_detail()}",
            )

    def report(self, args: AnalyzeCsvArgs, rel: str, size: int) -> dict[str, Any]:
        """The tool's data."""
        headers = self.headers
        data: dict[str, Any] = {
            "path": rel,
            "size": size,
            "delimiter": self.delimiter,
            "rows": self.rows,
            "columns": [p.summary() for p in self.profiles],
            "column_names": headers,
            "blank_lines": self.blank,
            "ragged_rows": self.ragged,
            "ragged_lines": self.ragged_lines,
            "preview_columns": [headers[i] for i in self.query.selected],
            "preview": self.preview,
        }
        if args.filter is not None:
            data["filter"] = args.filter.model_dump(mode="json")
            data["matched_rows"] = self.matched
        data.update(self._aggregates(args))
        return data

    def _aggregates(self, args: AnalyzeCsvArgs) -> dict[str, Any]:
        """The groups or the overall aggregate, as the tool's data shows them."""
        query = self.query
        agg = query.agg
        func = agg.func if agg else "count"
        has_column = query.agg_idx is not None
        if query.group_idx is not None:
            ordered = sorted(self.groups.items(), key=_group_sort_key)
            return {
                "group_by": args.group_by,
                "aggregate": {"column": agg.column if agg else None, "func": func},
                "groups": [
                    {
                        "key": k,
                        "rows": a.rows,
                        "value": a.value(func, has_column),
                        "non_numeric": a.skipped,
                    }
                    for k, a in ordered
                ],
                "groups_truncated": self.groups_truncated,
                "rows_outside_groups": self.rows_outside_groups,
            }
        if agg is not None:
            return {
                "aggregate": {
                    "column": agg.column,
                    "func": func,
                    "value": self.overall.value(func, has_column),
                    "rows": self.overall.rows,
                    "non_numeric": self.overall.skipped,
                }
            }
        return {}


def _column_text(c: dict[str, Any]) -> str:
    """One column's profile as a line of the tool's text."""
    distinct = f"{c['distinct']}+" if c["distinct_capped"] else str(c["distinct"])
    parts = [f"{c['type']}", f"{c['non_null']} values", f"{c['nulls']} empty/null"]
    if c["type"] in ("int", "float"):
        sd = "n/a" if c["stddev"] is None else _fmt(c["stddev"])
        parts.append(
            f"min {_fmt(c['min'])}, max {_fmt(c['max'])}, mean {_fmt(c['mean'])}, "
            f"stddev {sd}, sum {_fmt(c['sum'])}"
        )
    elif c["type"] == "bool":
        parts.append(f"true {c['true']}, false {c['false']}")
    elif c["type"] in ("date", "datetime"):
        parts.append(f"min {c['min']}, max {c['max']}")
    elif c["type"] == "text" and "text_from_row" in c:
        parts.append(f"text from row {c['text_from_row']} (value {c['first_text_value']!r})")
    parts.append(f"distinct {distinct}")
    if c["sample_values"] and c["type"] in ("text", "date", "datetime"):
        parts.append("e.g. " + ", ".join(repr(s) for s in c["sample_values"][:3]))
    return f"- {c['name']}: " + "; ".join(parts)


def _aggregate_text(data: dict[str, Any]) -> list[str]:
    """The groups (the first ``TEXT_GROUPS_SHOWN``) or the overall aggregate, as text lines."""
    lines: list[str] = []
    if "groups" in data:
        agg = data["aggregate"]
        what = agg["func"] + (f" of {agg['column']}" if agg["column"] else "")
        lines.append(f"Groups by {data['group_by']} ({what}): {len(data['groups'])} groups")
        if data["groups_truncated"]:
            lines.append(
                f"  (more than {MAX_GROUPS} groups; {data['rows_outside_groups']} rows in "
                "further groups were not counted)"
            )
        for g in data["groups"][:TEXT_GROUPS_SHOWN]:
            value = "n/a" if g["value"] is None else _fmt(g["value"])
            lines.append(f"  {g['key']}: {value} ({g['rows']} rows)")
        if len(data["groups"]) > TEXT_GROUPS_SHOWN:
            lines.append(f"  … {len(data['groups']) - TEXT_GROUPS_SHOWN} more groups")
    elif "aggregate" in data:
        agg = data["aggregate"]
        value = "n/a" if agg["value"] is None else _fmt(agg["value"])
        what = agg["func"] + (f" of {agg['column']}" if agg["column"] else "")
        lines.append(f"Aggregate {what}: {value} over {agg['rows']} rows")
    return lines


@register
class AnalyzeCsv(Tool[AnalyzeCsvArgs]):
    name = "analyze_csv"
    reads_files = True
    description = (
        "Analyse a CSV file from the task workspace in one streaming pass: row count, "
        "columns with inferred types (int/float/bool/date/text), null counts, distinct "
        "counts, numeric min/max/mean/stddev; optionally filter rows, preview matching "
        "rows, and group/aggregate (count/sum/mean/min/max). Works on very large files."
    )
    effect = "Reads and analyses workspace CSV file {target}"
    recovery_class = RecoveryClass.READ_ONLY
    Args = AnalyzeCsvArgs

    def preflight(self, args: AnalyzeCsvArgs, ctx: ToolContext) -> None:
        check_workspace_path(args.path)

    def run(self, args: AnalyzeCsvArgs, ctx: ToolContext) -> ToolResult:
        root = _workspace_root(ctx.workspace)
        real = _resolve(root, args.path)
        rel = _rel(root, str(real))
        csv.field_size_limit(CSV_FIELD_LIMIT)
        f, size = open_regular_file(real, args.path)
        with f:
            head = f.read(SNIFF_BYTES)
            if b"\x00" in head[:8192] or (head and looks_binary(head[:8192])):
                raise ToolError(
                    "csv_malformed",
                    f"{rel!r} looks like a binary file (NUL bytes or invalid UTF-8), not a CSV.",
                )
            delimiter = args.delimiter or _sniff_delimiter(head)
            f.seek(0)
            raw = _GuardedRaw(f, CSV_LINE_LIMIT)
            text = io.TextIOWrapper(
                io.BufferedReader(raw, buffer_size=256 * 1024),
                encoding="utf-8-sig",
                errors="strict",
                newline="",
            )
            reader = csv.reader(text, delimiter=delimiter, strict=False)
            try:
                return self._analyse(args, ctx, reader, rel, size, delimiter)
            except UnicodeDecodeError:
                raise ToolError(
                    "csv_malformed",
                    f"{rel!r} is not valid UTF-8 near line {reader.line_num + 1}.",
                ) from None
            except csv.Error as exc:
                raise ToolError(
                    "csv_malformed", f"{rel!r}: CSV error at line {reader.line_num}: {exc}."
                ) from None

    def _analyse(
        self,
        args: AnalyzeCsvArgs,
        ctx: ToolContext,
        reader: Any,
        rel: str,
        size: int,
        delimiter: str,
    ) -> ToolResult:
        headers = _unique_headers(_header_row(reader, rel))
        scan = _Scan(args, headers, delimiter)
        deadline = time.monotonic() + TIME_BUDGET_SECONDS
        for row in reader:
            if not row:
                scan.blank += 1
                continue
            scan.add(row, reader.line_num)
            if scan.rows % 10_000 == 0:
                ctx.check_cancelled()
                if time.monotonic() > deadline:
                    raise ToolError(
                        "file_too_large",
                        f"Analysis of {rel!r} stopped after {TIME_BUDGET_SECONDS:.0f} s "
                        f"({scan.rows} rows read).",
                    )
        scan.check_ragged()
        data = scan.report(args, rel, size)
        return ToolResult(text=self._text(data, args), data=data)

    @staticmethod
    def _text(data: dict[str, Any], args: AnalyzeCsvArgs) -> str:
        delim = "tab" if data["delimiter"] == "\t" else repr(data["delimiter"])
        lines = [
            f"{data['path']}: {data['rows']} rows, {len(data['column_names'])} columns "
            f"(delimiter {delim}, {data['size']} bytes)"
        ]
        if data["ragged_rows"]:
            lines.append(
                f"Warning: {data['ragged_rows']} row(s) have a different number of fields than "
                f"the header (lines {', '.join(map(str, data['ragged_lines']))}); short rows were "
                "padded with empty values, extra fields ignored."
            )
        lines.append("Columns:")
        lines.extend(_column_text(c) for c in data["columns"])
        if "matched_rows" in data:
            flt = data["filter"]
            lines.append(
                f"Filter {flt['column']} {flt['op']} {flt['value']!r}: "
                f"{data['matched_rows']} matching rows"
            )
        lines.extend(_aggregate_text(data))
        if args.preview_rows and data["preview"]:
            buf = io.StringIO()
            writer = csv.writer(buf, lineterminator="\n")
            writer.writerow(data["preview_columns"])
            writer.writerows(data["preview"])
            label = "matching rows" if "matched_rows" in data else "rows"
            lines.append(f"Preview (first {len(data['preview'])} {label}):")
            lines.append(buf.getvalue().rstrip("\n"))
        elif args.preview_rows:
            lines.append("Preview: no rows.")
        return "\n".join(lines)
