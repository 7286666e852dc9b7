"""Safety: what is read from disk is data, never code; nothing escapes its folder; secrets stay
secret; files are no more readable than the folder that holds them.

* No module of the project unpickles, evaluates or executes what it reads (checked on the
  source's syntax tree); the one pickle it keeps (a window pane's state in Spark's state store)
  is read by an unpickler that admits value types only.
* Paths read from a sink's manifest stay inside the target; symbolic links planted in a stream
  folder are refused, never followed.
* Passwords in locations never appear in errors.
* Files and folders a stream or a sink target creates have no permission bit its folder lacks.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import os
import pickle
from decimal import Decimal
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pyspark_rowtime.api import create_stream, open_writer
from pyspark_rowtime.bounds.errors import CorruptLogError, OptionError
from pyspark_rowtime.sink.manifest import ParquetEntry, StreamEntry
from pyspark_rowtime.sink.options import parse_sink_options
from pyspark_rowtime.streams.local.log import open_stream
from pyspark_rowtime.windows.step import load_state

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ["bounds", "streams", "datasource", "sink", "windows", "connectors", "src"]


def _sources() -> list[Path]:
    return [p for d in PACKAGES for p in sorted((ROOT / d).rglob("*.py"))]


#: Calls that turn bytes or text into code or objects of any class.
_DANGEROUS = {
    ("pickle", "loads"), ("pickle", "load"), ("pickle", "Unpickler"),
    ("cloudpickle", "loads"), ("marshal", "loads"), ("marshal", "load"),
    ("yaml", "load"), ("yaml", "unsafe_load"), ("shelve", "open"), ("dill", "loads"),
}  # fmt: skip
_BUILTINS = {"eval", "exec", "compile", "__import__"}
#: The one reviewed exception: windows.step's restricted unpickler (test below).
_ALLOWED = {("windows/step.py", "pickle.Unpickler")}


def test_no_module_unpickles_evaluates_or_executes_what_it_reads():
    found = []
    for path in _sources():
        rel = str(path.relative_to(ROOT))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            target = node.func if isinstance(node, ast.Call) else None
            if isinstance(node, ast.ClassDef):  # subclassing counts as using it
                for base in node.bases:
                    if isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name):
                        name = (base.value.id, base.attr)
                        if name in _DANGEROUS and (rel, ".".join(name)) not in _ALLOWED:
                            found.append(f"{rel}:{node.lineno} {'.'.join(name)}")
            if isinstance(target, ast.Name) and target.id in _BUILTINS:
                found.append(f"{rel}:{node.lineno} {target.id}()")
            if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name):
                name = (target.value.id, target.attr)
                if name in _DANGEROUS and (rel, ".".join(name)) not in _ALLOWED:
                    found.append(f"{rel}:{node.lineno} {'.'.join(name)}()")
    assert not found, found
    assert len(_sources()) > 50  # the scan saw the project


class _Exploit:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # type: ignore[no-untyped-def]
        return (os.mkdir, (str(self.marker),))


def test_a_pane_state_that_names_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    blob = pickle.dumps([(0, 10, False, None, [_Exploit(marker)])])
    with pytest.raises(pickle.UnpicklingError, match=r"(posix|os)\.mkdir"):
        load_state(blob)
    assert not marker.exists()


def test_a_pane_state_of_value_types_loads():
    partials = [
        3, 2.5, None, "x", b"y", Decimal("1.25"), dt.datetime(2024, 1, 1, tzinfo=dt.timezone.utc),
        dt.date(2024, 1, 2), dt.timedelta(seconds=3), np.int64(7), np.float64(1.5),
        pd.Timestamp("2024-01-01T00:00:00Z"), (1, "a"), [1, 2],
    ]  # fmt: skip
    state = load_state(pickle.dumps([(0, 10, True, 5, partials)]))
    assert state[0].partials == partials


# -- paths ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", ["../outside.parquet", "/etc/passwd", "a/../../b", ""])
def test_manifest_entries_naming_files_outside_the_target_are_refused(bad):
    parquet = {"batch": 1, "files": [["_rowtime_sink/staging/1/x.parquet", bad, 0, 1]]}
    with pytest.raises(CorruptLogError, match="not a path inside the target"):
        ParquetEntry.from_dict(parquet)
    stream = {
        "batch": 1,
        "parts": [
            {"partition": 0, "start": 0, "rows": 1, "bound_us": None, "mode": "link",
             "files": [[bad, 1]]}
        ],
    }  # fmt: skip
    with pytest.raises(CorruptLogError, match="not a path inside the target"):
        StreamEntry.from_dict(stream)


def test_a_tampered_parquet_manifest_moves_no_file_out_of_the_target(tmp_path):
    """End to end: a committed entry edited to publish a staged file outside the target."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from sink_helpers import T0, make, records, run

    target = make(tmp_path, "parquet")
    run(target, 0, [[records([(1, T0)], bound=T0 + 1)]])
    entry_file = Path(target.state.entry_path(0))
    doc = json.loads(entry_file.read_text())
    staged = tmp_path / "target" / "_rowtime_sink" / "staging" / "planted.parquet"
    staged.write_bytes(b"not really parquet")
    doc["batch"] = 0
    doc["files"] = [[str(staged.relative_to(tmp_path / "target")), "../escaped.parquet", 0, 1]]
    entry_file.write_text(json.dumps(doc))
    (tmp_path / "target" / "_rowtime_sink" / "clock.json").unlink()  # make it roll forward
    with pytest.raises(CorruptLogError, match="not a path inside the target"):
        run(target, 1, [[records([(2, T0 + 5)], bound=T0 + 6)]])  # the commit rolls forward
    assert not (tmp_path / "escaped.parquet").exists() and staged.exists()


def test_a_segment_planted_as_a_symbolic_link_is_refused_naming_it(tmp_path):
    loc, other = tmp_path / "s", tmp_path / "other"
    for where in (loc, other):
        create_stream(str(where), "a INT")
        with open_writer(str(where)) as w:
            w.insert({"a": 1 if where == loc else 2}, rowtime=1)
    theirs = next((other / "partition-0000").glob("*.arrow"))
    planted = loc / "partition-0000" / "00000000000000000001-0000000001.arrow"
    planted.symlink_to(theirs)
    stream = open_stream(str(loc))
    with pytest.raises(CorruptLogError, match="symbolic link") as e:
        stream.end_offset(0)
    assert str(planted) in str(e.value)


def test_a_lock_file_planted_as_a_symbolic_link_is_not_followed(tmp_path):
    loc = tmp_path / "s"
    create_stream(str(loc), "a INT")
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (loc / "partition-0000" / "_writer.lock").symlink_to(victim)
    with pytest.raises(CorruptLogError, match="symbolic link"):
        open_writer(str(loc))
    assert victim.read_text() == "precious\n"


# -- secrets -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "options",
    [
        {"path": "redis://user:hunter2@localhost:6379/0/out", "target": "parquet"},
        {"path": "rediss://:hunter2@localhost/0/out", "target": "parquet"},
        {"path": "/tmp/out", "checkpointLocation": "redis://u:hunter2@h/0/ck"},
    ],
)
def test_a_password_in_a_location_never_appears_in_an_error(options):
    import pyarrow as pa

    schema = pa.schema([("rowtime", pa.timestamp("us", tz="UTC")), ("is_bound", pa.bool_())])
    with pytest.raises(OptionError) as e:
        parse_sink_options(options, schema)
    assert "hunter2" not in str(e.value)
    assert "***" in str(e.value)  # the error names the location, without its password


def test_a_password_in_a_stream_location_never_appears_in_an_error():
    with pytest.raises(OptionError) as e:
        create_stream("ftp://user:hunter2@host/s", "a INT")
    assert "hunter2" not in str(e.value)


# -- permissions ---------------------------------------------------------------------------------


@pytest.mark.parametrize("folder_mode", [0o700, 0o750])
def test_files_of_a_stream_are_no_more_readable_than_its_folder(tmp_path, folder_mode):
    loc = tmp_path / "s"
    loc.mkdir(mode=folder_mode)
    os.chmod(loc, folder_mode)  # whatever the umask
    old = os.umask(0o022)
    try:
        create_stream(str(loc), "a INT", partitions=2)
        for p in (0, 1):
            with open_writer(str(loc), p) as w:
                w.insert({"a": 1}, rowtime=1)
    finally:
        os.umask(old)
    wider = []
    for root, dirs, files in os.walk(loc):
        for name in dirs + files:
            mode = os.stat(os.path.join(root, name)).st_mode & 0o777
            if mode & ~folder_mode:
                wider.append(f"{os.path.join(root, name)} {oct(mode)}")
    assert not wider, wider


@pytest.mark.parametrize("kind", ["stream", "parquet"])
@pytest.mark.parametrize("folder_mode", [0o700, 0o750])
def test_files_of_a_sink_target_are_no_more_readable_than_its_folder(tmp_path, kind, folder_mode):
    """Everything the sink creates (its state folder, manifest entries, the clock, staged and
    published data files, partition folders, ``_COMPLETE`` markers) under a target folder with
    ``folder_mode``, with a umask that would make all of it readable by anyone."""
    import sys

    sys.path.insert(0, str(Path(__file__).parent))
    from sink_helpers import HOUR, T0, make, records, run

    (tmp_path / "target").mkdir()
    os.chmod(tmp_path / "target", folder_mode)  # whatever the umask
    old = os.umask(0o022)
    try:
        target = make(tmp_path, kind)
        for batch in range(3):  # the Parquet target completes an hour, and stages one more
            t = T0 + batch * HOUR
            run(target, batch, [[records([(batch, t)], bound=t + 1)], [records([(9, t)])]])
    finally:
        os.umask(old)
    made, wider = [], []
    for root, dirs, files in os.walk(tmp_path / "target"):
        for name in dirs + files:
            path = os.path.join(root, name)
            made.append(os.path.relpath(path, tmp_path / "target"))
            mode = os.stat(path).st_mode & 0o777
            if mode & ~folder_mode:
                wider.append(f"{path} {oct(mode)}")
    assert not wider, wider
    # The walk saw the sink's state and the published data.
    assert any(m.startswith("_rowtime_sink/manifest/") for m in made), made
    data = ".parquet" if kind == "parquet" else ".arrow"
    assert sum(m.endswith(data) and "staging" not in m for m in made) >= 3, made
