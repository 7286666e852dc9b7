"""``rowtime insert`` over random input files: accepted whole with exactly the file's rows, or
refused with one line naming the first bad line and nothing stored (issue 55, items 4 and 6).

Files are random rows over a small schema, written by an independent writer (Python's
``csv.writer``, ``json.dumps``), then left whole or damaged at one record in one of the ways
strict reading refuses (each damage knows the line it puts the fault on). A further property
flips random bytes of a valid file, where nobody knows the outcome in advance: whatever the
command does must agree with pyarrow's own CSV and JSON readers, a second parser sharing no
code with ours, on every file both accept.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.csv as pa_csv
import pyarrow.json as pa_json
import pytest
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.cli import main
from pyspark_rowtime.streams.local.log import open_stream

SCHEMA = "id INT NOT NULL, name STRING, x DOUBLE"
COLUMNS = ("id", "name", "x", "ts")  # ts: the rowtime column (epoch ms), not a payload column
PROPS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

names = st.one_of(st.none(), st.text(min_size=1, max_size=12))
rows_st = st.lists(
    st.fixed_dictionaries(
        {
            "id": st.integers(-(2**31), 2**31 - 1),
            "name": names,
            "x": st.one_of(st.none(), st.floats(allow_nan=False, allow_infinity=False)),
            "ts": st.integers(0, 2**41),
        }
    ),
    max_size=8,
)


@dataclass
class Input:
    """A file's bytes, the rows a correct reader finds in it, and the first bad line (None:
    the file is good)."""

    data: bytes
    rows: list[dict[str, Any]]
    bad_line: int | None = None


def _csv_cells(cells: list[str]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\r\n").writerow(cells)  # RFC 4180: a lone CR is quoted too
    return out.getvalue()


def _cells(row: dict[str, Any]) -> list[str]:
    return ["" if row[c] is None else repr(row[c]) if c == "x" else str(row[c]) for c in COLUMNS]


def _as_csv(rows: list[dict[str, Any]]) -> tuple[list[str], list[int]]:
    """The records (header first) and the line each starts on."""
    records = [",".join(COLUMNS) + "\r\n", *(_csv_cells(_cells(r)) for r in rows)]
    starts, line = [], 1
    for rec in records:
        starts.append(line)
        line += rec.count("\n")
    return records, starts


CSV_DAMAGES = ("unclosed", "fewer", "more", "utf8", "nul", "not-int", "past-int", "dup-header")
JSON_DAMAGES = (
    "dup-key", "cut", "utf8", "nul", "surrogate", "deep", "id-text", "nan-id", "array",
    "unknown", "no-rowtime", "past-int",
)  # fmt: skip


@st.composite
def csv_inputs(draw: Any, damage: bool = True) -> Input:
    rows = draw(rows_st)
    # A cell of CSV text holds no NUL (strict reading refuses it): drop such names.
    rows = [{**r, "name": None if r["name"] and "\x00" in r["name"] else r["name"]} for r in rows]
    records, starts = _as_csv(rows)
    if draw(st.booleans()):
        records.append("\n")  # a blank line is no row
    if not rows or not damage or not draw(st.booleans()):
        return Input("".join(records).encode("utf-8"), rows)
    k = draw(st.integers(1, len(rows)))  # the damaged record (0 is the header)
    how = draw(st.sampled_from(CSV_DAMAGES))
    cells, line = _cells(rows[k - 1]), starts[k]
    data = [r.encode("utf-8") for r in records]
    if how == "unclosed":  # a quote opened before the id, not closed where it should be
        data[k] = b'"' + data[k]
    elif how == "fewer":
        data[k] = _csv_cells(cells[:-1]).encode("utf-8")
    elif how == "more":
        data[k] = _csv_cells([*cells, "1"]).encode("utf-8")
    elif how == "not-int":
        data[k] = _csv_cells(["1_000", *cells[1:]]).encode("utf-8")
    elif how == "past-int":
        data[k] = _csv_cells([str(2**31), *cells[1:]]).encode("utf-8")
    elif how == "utf8":
        data[k] = b"\xff" + data[k]
    elif how == "nul":
        data[k] = b"\x00" + data[k]
    else:  # dup-header
        data[0], line = b"id,name,x,ts,id\n", 1
    return Input(b"".join(data), rows, line)


def _json_with(row: dict[str, Any], key: str, raw: str) -> str:
    """``row`` as JSON with ``key``'s value written as ``raw`` (the row's own value gone)."""
    kept = json.dumps({k: v for k, v in row.items() if k != key})
    return kept[:-1] + f', "{key}": {raw}}}'


@st.composite
def json_inputs(draw: Any, damage: bool = True) -> Input:
    rows = draw(rows_st)
    lines = [json.dumps(r) + "\n" for r in rows]
    if lines and draw(st.booleans()):
        lines.insert(draw(st.integers(0, len(lines))), "  \n")  # a blank line is no row
    if not rows or not damage or not draw(st.booleans()):
        return Input("".join(lines).encode("utf-8"), rows)
    k = draw(st.integers(0, len(rows) - 1))
    row = rows[k]
    how = draw(st.sampled_from(JSON_DAMAGES))
    bad: str | bytes = {
        "dup-key": json.dumps(row)[:-1] + ', "id": 1}',
        "cut": json.dumps(row)[:-1],
        "surrogate": _json_with(row, "name", '"\\udc00"'),
        "deep": _json_with(row, "name", "[" * 70 + "]" * 70),
        "id-text": _json_with(row, "id", '"7"'),
        "nan-id": _json_with(row, "id", "NaN"),
        "past-int": _json_with(row, "id", str(2**31)),
        "array": "[1, 2]",
        "unknown": _json_with(row, "nope", "1"),
        "no-rowtime": json.dumps({c: v for c, v in row.items() if c != "ts"}),
        "utf8": b'{"id": 1, "ts": 5, "name": "\xc3"}',
        "nul": json.dumps(row).encode("utf-8") + b"\x00",
    }[how]
    data = [line.encode("utf-8") for line in lines]
    data = [d for d in data if d.strip()]  # the blank line moved no row: line k + 1 is row k
    data[k] = (bad if isinstance(bad, bytes) else bad.encode("utf-8")) + b"\n"
    return Input(b"".join(data), rows, k + 1)


def _stored(loc: str) -> list[dict[str, Any]]:
    stream = open_stream(loc)
    return [r for r in stream.read(0, 0, stream.end_offset(0)).to_pylist() if not r["__is_bound"]]


def _as_stored(rows: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Rows as the stream holds them: (id, name, x, rowtime in us)."""
    return [(r["id"], r["name"], r["x"], r["ts"] * 1000) for r in rows]


def _from_stream(recs: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["id"], r["name"], r["x"], r["__rowtime_us"]) for r in recs]


def _insert(data: bytes, suffix: str) -> tuple[int, str, list[dict[str, Any]], list[Any]]:
    """Insert ``data`` as a file into a stream holding one row already: the exit status,
    standard error, the records before and the records after."""
    with tempfile.TemporaryDirectory() as tmp:
        loc = os.path.join(tmp, "s")
        create_stream(loc, SCHEMA)
        path = os.path.join(tmp, f"in{suffix}")
        with open(path, "wb") as f:
            f.write(data)
        with open_writer(loc) as w:
            w.insert({"id": 0}, rowtime=1)  # the file goes after what the stream holds
        before = _stored(loc)
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            code = main(["insert", loc, path, "--rowtime-column", "ts"])
        return code, err.getvalue(), before, _stored(loc)


def _check(given: Input, suffix: str) -> None:
    code, err, before, after = _insert(given.data, suffix)
    message = err.strip().splitlines()[-1] if err.strip() else ""
    if given.bad_line is None:
        assert code == 0, err
        assert after[: len(before)] == before
        assert _from_stream(after[len(before) :]) == _as_stored(given.rows)
    else:
        assert code == 2, (err, given)
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert f": line {given.bad_line}: " in message, (message, given)
        assert "nothing of" in message and "was stored" in message, message
        assert after == before


@PROPS
@given(given=csv_inputs())
def test_a_random_csv_file_is_stored_whole_or_refused_naming_its_first_bad_line(given):
    _check(given, ".csv")


@PROPS
@given(given=json_inputs())
def test_a_random_json_lines_file_is_stored_whole_or_refused_naming_its_first_bad_line(given):
    _check(given, ".jsonl")


# -- random bytes, checked against a second parser -----------------------------------------------


def _pyarrow_rows(data: bytes, suffix: str) -> list[tuple[Any, ...]] | None:
    """The rows pyarrow reads from ``data`` (None: it refuses the file)."""
    types = {"id": pa.int32(), "name": pa.string(), "x": pa.float64(), "ts": pa.int64()}
    try:
        if suffix == ".csv":
            table = pa_csv.read_csv(
                io.BytesIO(data),
                parse_options=pa_csv.ParseOptions(newlines_in_values=True),
                convert_options=pa_csv.ConvertOptions(
                    column_types=types, strings_can_be_null=True, include_columns=list(COLUMNS)
                ),
            )
        else:
            table = pa_json.read_json(
                io.BytesIO(data),
                parse_options=pa_json.ParseOptions(
                    explicit_schema=pa.schema(types.items()), unexpected_field_behavior="error"
                ),
            )
    except (pa.ArrowException, ValueError):
        return None
    return _as_stored(table.to_pylist())


@st.composite
def flipped(draw: Any) -> tuple[bytes, str]:
    suffix = draw(st.sampled_from([".csv", ".jsonl"]))
    good = draw(csv_inputs(damage=False) if suffix == ".csv" else json_inputs(damage=False))
    assume(good.rows)
    data = bytearray(good.data)
    # Past the header (CSV), where a flip may still leave a file both parsers read.
    first = data.index(b"\n") + 1 if suffix == ".csv" else 0
    for _ in range(draw(st.integers(1, 2))):
        at = draw(st.integers(first, len(data) - 1))
        data[at] = draw(st.sampled_from([*b'",\n\r\\{}[]:.-+e05a\xff ', data[at] ^ 1]))
    return bytes(data), suffix


@PROPS
@given(case=flipped())
def test_a_file_with_flipped_bytes_is_stored_as_pyarrow_reads_it_or_refused_whole(case):
    data, suffix = case
    code, err, before, after = _insert(data, suffix)
    if code == 0:
        theirs = _pyarrow_rows(data, suffix)
        event(f"{suffix} taken, " + ("pyarrow agrees" if theirs is not None else "pyarrow refuses"))
        if theirs is not None:
            assert _from_stream(after[len(before) :]) == theirs, (data, err)
        assert after[: len(before)] == before
    else:
        event(f"{suffix} refused")
        assert code == 2 and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1 and ": line " in err, err
        assert after == before


# -- the console script itself -------------------------------------------------------------------


@pytest.mark.parametrize("damaged", [False, True])
def test_the_console_script_stores_a_file_whole_or_not_at_all(tmp_path, damaged):
    loc = str(tmp_path / "s")
    create_stream(loc, SCHEMA)
    rows = [{"id": i, "name": f"n{i}", "x": i / 2, "ts": 1000 * i} for i in range(50)]
    records, _ = _as_csv(rows)
    if damaged:
        records[40] = records[40].replace(",", ",,", 1)  # line 41: five cells for four columns
    (tmp_path / "in.csv").write_text("".join(records))
    done = subprocess.run(
        [sys.executable, "-m", "pyspark_rowtime.cli", "insert", loc, str(tmp_path / "in.csv"),
         "--rowtime-column", "ts"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if damaged:
        assert done.returncode == 2 and "line 41: 5 cell(s), more than" in done.stderr
        assert _stored(loc) == []
    else:
        assert done.returncode == 0, done.stderr
        assert _from_stream(_stored(loc)) == _as_stored(rows)
        assert open_stream(loc).meta.partitions == 1
