"""The storage seam: one function says what sits at a location, and the embedded log is a
backend like any other would be (registered for plain paths and file:// URLs)."""

from __future__ import annotations

import importlib
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from pyspark_rowtime.api import create_stream, get_rowtime_bound
from pyspark_rowtime.bounds.errors import OptionError, StreamNotFoundError
from pyspark_rowtime.sink.layout import FolderSinkState
from pyspark_rowtime.streams import storage
from pyspark_rowtime.streams.storage import (
    LocationKind,
    PartitionAppender,
    StreamStorage,
    backend_for,
    open_stream,
    register_backend,
    what_is_at,
)


def test_what_is_at_tells_the_four_kinds_of_location_apart(tmp_path):
    create_stream(tmp_path / "stream", "a INT")
    FolderSinkState(str(tmp_path / "pending")).define_target({"kind": "stream"})
    FolderSinkState(str(tmp_path / "parquet")).define_target({"kind": "parquet"})
    kinds = {
        name: what_is_at(tmp_path / name).kind
        for name in ("stream", "pending", "parquet", "nothing")
    }
    assert kinds == {
        "stream": LocationKind.STREAM,
        "pending": LocationKind.PENDING_STREAM_TARGET,
        "parquet": LocationKind.PARQUET_TARGET,
        "nothing": LocationKind.NOTHING,
    }
    # get_rowtime_bound asks the same function: no clock yet for either target, and a
    # location with nothing says how to create a stream.
    assert get_rowtime_bound(tmp_path / "pending") is None
    assert get_rowtime_bound(tmp_path / "parquet") is None
    with pytest.raises(StreamNotFoundError, match="create_stream"):
        get_rowtime_bound(tmp_path / "nothing")


def test_a_stream_target_that_exists_is_a_stream(tmp_path):
    create_stream(tmp_path / "s", "a INT")
    FolderSinkState(str(tmp_path / "s")).define_target({"kind": "stream"})
    assert what_is_at(f"file://{tmp_path / 's'}").kind is LocationKind.STREAM


def test_the_embedded_log_implements_the_storage_interface(tmp_path):
    stream = create_stream(tmp_path / "s", "a INT", partitions=2)
    assert isinstance(stream, StreamStorage)
    assert isinstance(open_stream(tmp_path / "s"), StreamStorage)
    appender = stream.lock_partition(1, "partition 1 of s")
    try:
        assert isinstance(appender, PartitionAppender)
        tail = appender.tail()
        assert (tail.end, tail.clock_us, tail.last_arrival_us) == (0, None, None)
    finally:
        appender.release()


def test_a_scheme_no_backend_serves_is_refused_naming_it():
    # redis:// is served by the Redis backend (streams.redis): take a scheme nobody serves.
    with pytest.raises(OptionError, match=r"\(not kafka://\)"):
        backend_for("kafka://localhost:9092/orders")


BUILTIN_PACKAGES = (
    "pyspark_rowtime.streams.local",
    "pyspark_rowtime.streams.redis",
    "pyspark_rowtime.streams.objstore",
)


def test_the_installed_entry_points_name_each_backend_for_the_schemes_it_serves():
    # What pyproject.toml declares and what each package says it serves agree: a backend is
    # found by its entry point where the metadata is installed, by its package where it is not.
    points = {ep.name: ep for ep in entry_points(group=storage.ENTRY_POINT_GROUP)}
    for name in BUILTIN_PACKAGES:
        package = importlib.import_module(name)
        for scheme in package.SCHEMES:
            ep = points[scheme or storage.PATH_SCHEME]
            assert ep.load() is package.BACKEND, (name, scheme)


def test_the_packaged_schemes_are_the_entry_points_and_need_no_metadata(monkeypatch):
    # storage.PACKAGED and pyproject.toml's entry points name the same backends: a process that
    # opens a stream of this package's schemes reads no distribution's metadata (0.1 s of CPU
    # in each Spark Python process, whose path holds Spark's 5,973-entry spark-core jar).
    points = {ep.name: ep.value for ep in entry_points(group=storage.ENTRY_POINT_GROUP)}
    packaged = {
        scheme or storage.PATH_SCHEME: f"pyspark_rowtime.streams.{module}:BACKEND"
        for scheme, module in storage.PACKAGED.items()
    }
    assert packaged == points

    def no_metadata() -> dict[str, object]:
        raise AssertionError("the metadata was read for a packaged scheme")

    monkeypatch.setattr(storage, "_entry_points", no_metadata)
    monkeypatch.setattr(storage, "_BACKENDS", {})
    for scheme, module in storage.PACKAGED.items():
        location = "relative/path" if scheme == "" else f"{scheme}://host/x/y"
        backend = backend_for(location)
        assert backend is importlib.import_module(f"pyspark_rowtime.streams.{module}").BACKEND


def test_another_packages_scheme_is_found_by_its_entry_point_and_ours_stay_ours(monkeypatch):
    # A backend from another distribution: its entry point is loaded the first time a location
    # of its scheme is used. One that claims a scheme of this package's does not replace it
    # (register_backend does, on purpose).
    from importlib.metadata import EntryPoint

    local = importlib.import_module("pyspark_rowtime.streams.local")
    redis = importlib.import_module("pyspark_rowtime.streams.redis")
    group = storage.ENTRY_POINT_GROUP
    theirs = {
        "demo": EntryPoint("demo", "pyspark_rowtime.streams.local:BACKEND", group),
        "s3": EntryPoint("s3", "pyspark_rowtime.streams.redis:BACKEND", group),
        "broken": EntryPoint("broken", "no_such_module_rowtime:BACKEND", group),
    }
    monkeypatch.setattr(storage, "_entry_points", lambda: theirs)
    monkeypatch.setattr(storage, "_BACKENDS", {})
    assert backend_for("demo://anything/s") is local.BACKEND
    assert backend_for("s3://bucket/s") is not redis.BACKEND
    with pytest.raises(
        OptionError, match=r"broken:// locations \(no_such_module_rowtime:BACKEND\)"
    ):
        backend_for("broken://x/s")


def test_a_location_loads_its_own_backend_and_no_other(tmp_path):
    # A fresh interpreter: the package, then a local path, imports neither the Redis backend
    # nor the Redis client; a redis:// location imports the backend, still not the client
    # (that happens at the first connection).
    code = f"""
import sys
import pyspark_rowtime
from pyspark_rowtime.streams.storage import backend_for, what_is_at
loaded = lambda: sorted(m for m in sys.modules if m == "redis" or ".streams.redis" in m)
assert loaded() == [], loaded()
assert what_is_at({str(tmp_path)!r}).kind.value == "nothing"
assert loaded() == [], loaded()
backend_for("redis://127.0.0.1:1/0/s")
assert "pyspark_rowtime.streams.redis" in loaded() and "redis" not in loaded(), loaded()
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_without_the_metadata_the_packaged_backends_serve_their_schemes(monkeypatch, tmp_path):
    # The package shipped as a zip (--py-files) has no entry points: every location still
    # finds its backend, through storage.PACKAGED (the Iceberg module included, which the scan
    # of streams/' packages this replaced did not find).
    monkeypatch.setattr(storage, "_entry_points", dict)
    monkeypatch.setattr(storage, "_BACKENDS", {})
    local = importlib.import_module(BUILTIN_PACKAGES[0])
    redis = importlib.import_module(BUILTIN_PACKAGES[1])
    assert backend_for(tmp_path) is local.BACKEND
    assert backend_for(f"file://{tmp_path}") is local.BACKEND
    assert backend_for("rediss://h:6379/0/s") is redis.BACKEND
    objstore = importlib.import_module(BUILTIN_PACKAGES[2])
    assert backend_for("s3://bucket/s") is objstore.BACKEND
    assert backend_for("abfss://c@a.dfs.core.windows.net/s") is objstore.BACKEND
    create_stream(tmp_path / "s", "a INT")
    assert what_is_at(tmp_path / "s").kind is LocationKind.STREAM
    with pytest.raises(
        OptionError,
        match=r"file:// URLs, iceberg:// URLs, redis:// URLs, rediss:// URLs, s3:// URLs.*kafka",
    ):
        backend_for("kafka://localhost:9092/orders")


def test_a_registered_backend_serves_its_scheme_before_any_entry_point(monkeypatch, tmp_path):
    local = importlib.import_module(BUILTIN_PACKAGES[0])
    monkeypatch.setattr(storage, "_BACKENDS", {})
    register_backend(["mem"], local.BACKEND)
    assert backend_for("MEM://x") is local.BACKEND


def test_the_readme_of_0_1_0s_import_of_register_external_still_works():
    # 0.1.0's README told users to import register_external from streams.redis_log.
    from pyspark_rowtime.streams.redis import register_external
    from pyspark_rowtime.streams.redis_log import register_external as old

    assert old is register_external
