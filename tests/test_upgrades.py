"""Stored formats across versions (SPEC 12): what 0.1.0 wrote reads, and a format newer than
this code reads is refused with an error naming the version found, the highest this code reads
and the installed pyspark-rowtime (``bounds.versions``), one test per stored format. The
restart of real queries from 0.1.0's checkpoints is ``integration/test_upgrade_v0_1_0.py``.
"""

from __future__ import annotations

import json
import pickle
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import tomllib
from redis_server import RedisServer, redis_server
from sink_helpers import T0, make, records, run

import pyspark_rowtime as pr
from pyspark_rowtime.bounds.errors import CorruptLogError, OffsetError, RowtimeError
from pyspark_rowtime.bounds.intervals import INFINITY_US
from pyspark_rowtime.bounds.plan import StreamPosition
from pyspark_rowtime.sink.layout import FolderSinkState
from pyspark_rowtime.streams.local.log import open_stream
from pyspark_rowtime.streams.meta import meta_from_json
from pyspark_rowtime.streams.redis.sink import RedisSinkState
from pyspark_rowtime.streams.segments import SegmentStats
from pyspark_rowtime.windows import join as join_module
from pyspark_rowtime.windows.step import load_state

ROOT = Path(__file__).parent.parent
FIXTURE = ROOT / "integration" / "fixtures" / "v0_1_0"


def refused(error: BaseException, found: object, highest: int) -> None:
    """The refusal names the version found, the highest read, and the installed release."""
    message = str(error)
    assert isinstance(error, RowtimeError)
    assert f"format version {found}" in message, message
    assert f"up to {highest}" in message, message
    assert f"pyspark-rowtime {pr.__version__}" in message, message
    assert "upgrade pyspark-rowtime" in message, message


def test_the_version_is_stated_once_for_users_and_packaging() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["version"] == pr.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", pr.__version__)


# -- streams ---------------------------------------------------------------------------------------


def test_stream_metadata_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    pr.create_stream(str(tmp_path / "s"), "a INT")
    path = tmp_path / "s" / "_stream.json"
    doc = json.loads(path.read_text())
    assert doc["format_version"] == 1
    path.write_text(json.dumps({**doc, "format_version": 7}))
    with pytest.raises(CorruptLogError) as info:
        open_stream(str(tmp_path / "s"))
    refused(info.value, 7, 1)
    assert "_stream.json" in str(info.value)


def test_0_1_0_stream_metadata_reads_on_both_backends() -> None:
    # Redis keeps the same document in its meta hash (field "meta"): one reader for both.
    text = (FIXTURE / "src" / "_stream.json").read_text()
    meta = meta_from_json(text, "src")
    assert (meta.partitions, meta.defaults) == (2, {"order": "drop"})
    import base64

    dump = json.loads((FIXTURE / "redis.json").read_text())
    (meta_key,) = [k for k in dump["keys"] if base64.b64decode(k["key"]).endswith(b":meta")]
    fields = {base64.b64decode(k): base64.b64decode(v) for k, v in meta_key["fields"].items()}
    assert meta_from_json(fields[b"meta"].decode(), "fx").partitions == 2


def test_a_segment_footer_of_a_newer_format_is_refused() -> None:
    with pytest.raises(CorruptLogError) as info:
        SegmentStats.from_metadata({b"rowtime.format_version": b"3"}, "p-0/x.arrow")
    refused(info.value, 3, 1)


# -- offsets ---------------------------------------------------------------------------------------


def test_an_offset_of_0_1_0_still_parses() -> None:
    lines = (FIXTURE / "ck-copy" / "offsets" / "1").read_text().splitlines()
    offset = json.loads(lines[-1])  # Spark's version line, its metadata, then the source's
    position = StreamPosition.from_dict(offset)
    assert len(position.partitions) == 2 and position.clock_us == offset["clock"]
    assert position.to_dict()["partitions"] == offset["partitions"]


def test_an_offset_of_a_newer_format_is_refused() -> None:
    with pytest.raises(OffsetError) as info:
        StreamPosition.from_dict({"v": 2, "clock": None, "partitions": {}})
    refused(info.value, 2, 1)


# -- sink state ------------------------------------------------------------------------------------


def test_a_sink_target_of_a_newer_format_is_refused(tmp_path: Path) -> None:
    state = FolderSinkState(str(tmp_path / "t"))
    state.define_target({"kind": "stream"})
    doc = json.loads(Path(state.target_file).read_text())
    Path(state.target_file).write_text(json.dumps({**doc, "format_version": 2}))
    with pytest.raises(CorruptLogError) as info:
        state.read_target()
    refused(info.value, 2, 1)


@pytest.fixture(scope="module")
def redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    with redis_server(tmp_path_factory.mktemp("redis")) as server:
        yield server


def test_a_redis_sink_target_of_a_newer_format_is_refused(redis: RedisServer) -> None:
    state = RedisSinkState(redis.url("newer-target"))
    state.define_target({"kind": "stream"})
    key = state._key("target")
    doc = json.loads(redis.client().get(key))
    redis.client().set(key, json.dumps({**doc, "format_version": 2}))
    with pytest.raises(CorruptLogError) as info:
        state.read_target()
    refused(info.value, 2, 1)


def test_a_manifest_entry_of_a_newer_format_is_refused_at_replay(tmp_path: Path) -> None:
    target = make(tmp_path, "stream")
    batch = [[records([(1, T0 + 1), (2, T0 + 2)], bound=T0 + 3)]]
    run(target, 0, batch)
    (entry,) = (tmp_path / "target" / "_rowtime_sink" / "manifest").glob("*.json")
    doc = json.loads(entry.read_text())
    assert doc["format"] == 2
    entry.write_text(json.dumps({**doc, "format": 3}))
    with pytest.raises(CorruptLogError) as info:
        run(target, 0, batch)  # Spark replays batch 0
    refused(info.value, 3, 2)


def test_0_1_0_manifest_entries_and_descriptions_read() -> None:
    for name in ("copy", "win", "join"):
        state = FolderSinkState(str(FIXTURE / name))
        assert state.read_target() == {
            "format": "pyspark-rowtime-sink", "format_version": 1, "kind": "stream"
        }  # fmt: skip
        assert all(state.entry(b)["format"] == 2 for b in state.batches())  # type: ignore[index]


# -- operator state --------------------------------------------------------------------------------


def test_window_state_of_0_1_0_reads_and_a_newer_one_is_refused() -> None:
    # 0.1.0 stores a bare list of (start, end, triggered, pending_ms, partials) per key.
    old = pickle.dumps([(T0, T0 + 10, True, None, [3, 4.5])])
    assert load_state(old)[T0].end_us == T0 + 10
    wrapped = pickle.dumps({"v": 1, "state": [(T0, T0 + 10, True, None, [3, 4.5])]})
    assert load_state(wrapped)[T0].end_us == T0 + 10
    with pytest.raises(CorruptLogError) as info:
        load_state(pickle.dumps({"v": 2, "state": {"anything": "new"}}))
    refused(info.value, 2, 1)
    assert "time_interval_aggregate" in str(info.value)


def test_join_state_of_0_1_0_reads_and_a_newer_one_is_refused() -> None:
    old = pickle.dumps([([T0], [T0 + 5], [{"k": "x"}]), ([], [], [])])
    left, right = join_module._load(old)
    assert left.start.tolist() == [T0] and len(right.start) == 0
    with pytest.raises(CorruptLogError) as info:
        join_module._load(pickle.dumps({"v": 5, "state": []}))
    refused(info.value, 5, 1)
    assert "overlap_join" in str(info.value)


def test_interval_aggregate_state_gets_the_envelope_and_reads_the_bare_one() -> None:
    from pyspark_rowtime.windows import validity
    from pyspark_rowtime.windows.step import load_operator_state

    columns = {"__t": [T0], "__e": [T0 + 10], "__in0": [3]}
    # The first interval_aggregate stored its bare dict, without a version.
    rows, from_us = validity._load(pickle.dumps({"from": T0 - 5, "columns": columns}))
    assert rows["__t"].tolist() == [T0] and rows["__e"].tolist() == [T0 + 10] and from_us == T0 - 5
    blob = validity._save(rows, from_us)
    # Now in the envelope the other operators' loader reads, in format version 3: numeric
    # columns as (dtype, codec, size, compressed bytes).
    assert pickle.loads(blob)["v"] == 3
    stored = load_operator_state(blob, "x")
    assert stored["from"] == T0 - 5 and set(stored["columns"]) == set(columns)
    assert all(isinstance(v, tuple) and len(v) == 4 for v in stored["columns"].values())
    again, again_from = validity._load(blob)
    assert again.equals(rows) and again_from == from_us
    # Version 1 in the envelope (lists), as the skeleton wrote it, still reads.
    v1, v1_from = validity._load(pickle.dumps({"v": 1, "state": {"from": T0, "columns": columns}}))
    assert v1.equals(rows) and v1_from == T0
    # Version 2, numeric columns as (dtype, raw bytes), as the release before wrote it.
    raw = {c: (np.asarray(v).dtype.str, np.asarray(v).tobytes()) for c, v in columns.items()}
    v2, v2_from = validity._load(pickle.dumps({"v": 2, "state": {"from": T0, "columns": raw}}))
    assert v2.equals(rows) and v2_from == T0
    with pytest.raises(CorruptLogError) as info:
        validity._load(pickle.dumps({"v": 4, "state": {"anything": "new"}}))
    refused(info.value, 4, 3)
    assert "interval_aggregate" in str(info.value)


def test_interval_aggregate_state_round_trips_exactly_compressed() -> None:
    """Version 3 gives back every value it was given, ends at infinity and around the int64
    limits included (``__e`` is stored as its distance from ``__t``, which wraps), and a
    damaged column is refused by name, never read as other numbers."""
    from pyspark_rowtime.windows import validity

    rng = np.random.default_rng(7)
    n = 5000
    t = np.sort(rng.integers(-(2**62), 2**62, n))
    e = np.where(rng.random(n) < 0.1, INFINITY_US, t + rng.integers(0, 10**9, n))
    e[:3] = [2**63 - 1, -(2**63), 0]  # distances that wrap around
    rows = pd.DataFrame(
        {"__t": t, "__e": e, "__in0": rng.random(n), "__nn0": rng.random(n) < 0.5,
         "__in1": rng.integers(-(2**63), 2**63 - 1, n), "__in2": ["a", None] * (n // 2)}
    )  # fmt: skip
    blob = validity._save(rows, 17)
    again, from_us = validity._load(blob)
    assert from_us == 17 and again.equals(rows)
    assert len(blob) < rows.memory_usage(index=False, deep=False).sum()
    plain = pickle.loads(blob)
    dtype, codec, size, packed = plain["state"]["columns"]["__in0"]
    plain["state"]["columns"]["__in0"] = (dtype, codec, size, packed[: len(packed) // 2])
    with pytest.raises(CorruptLogError, match=r"interval_aggregate.*__in0.*decompress"):
        validity._load(pickle.dumps(plain))


def test_interval_aggregate_state_of_strings_and_an_altered_dtype() -> None:
    """A column of strings stays a list; a numeric column whose stored dtype is not a number
    (an altered state store) is refused by name, never read as objects."""
    from pyspark_rowtime.windows import validity

    rows = pd.DataFrame({"__t": [T0, T0 + 1], "__e": [T0 + 10, T0 + 11], "__in0": ["a", None]})
    again, _ = validity._load(validity._save(rows, None))
    assert again["__in0"].tolist() == ["a", None] and again["__t"].dtype == np.int64
    plain = pickle.loads(validity._save(rows, None))
    plain["state"]["columns"]["__t"] = ("|O", b"\x00" * 16)
    with pytest.raises(CorruptLogError) as info:
        validity._load(pickle.dumps(plain))
    assert "interval_aggregate" in str(info.value)


def test_a_trim_state_of_a_newer_format_is_refused() -> None:
    from pyspark_rowtime.streams.retention import TrimState

    doc = TrimState(start=4).to_doc()
    assert TrimState.from_json(json.dumps(doc), "p-0").start == 4
    with pytest.raises(CorruptLogError) as info:
        TrimState.from_json(json.dumps({**doc, "v": 2}), "partition-0000")
    refused(info.value, 2, 1)
    assert "trim state of partition-0000" in str(info.value)
