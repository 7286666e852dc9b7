"""Names and sizes stay inside their bounds (issue 55, item 5): a stream's or a connector's name
cannot reach outside its folder, ``rowtime create`` caps partitions as the catalog does, and a
record holds at most ``MAX_RECORD_BYTES`` of string and binary values, refused at insert."""

from __future__ import annotations

import os
from pathlib import Path

import pyarrow as pa
import pytest

from pyspark_rowtime.api import create_stream, open_writer, read_stream
from pyspark_rowtime.bounds.errors import OptionError, SchemaError
from pyspark_rowtime.cli import main
from pyspark_rowtime.connectors.feed import state_dir
from pyspark_rowtime.sink.options import parse_sink_options
from pyspark_rowtime.streams.catalog import CatalogError, load_catalog
from pyspark_rowtime.streams.row_checks import MAX_RECORD_BYTES
from pyspark_rowtime.streams.storage import MAX_PARTITIONS

CATALOG = """
[streams.{stream}]
location = "data/orders"
schema = "a INT"
partitions = {partitions}

[connectors.{connector}]
kind = "generator"
stream = {stream}
"""


def catalog(tmp_path: Path, stream: str = "orders", connector: str = "gen", partitions=1) -> str:
    def key(name: str) -> str:  # a TOML basic string
        return (
            '"'
            + "".join(c if c >= " " and c not in '"\\' else f"\\u{ord(c):04x}" for c in name)
            + '"'
        )

    text = CATALOG.format(stream=key(stream), connector=key(connector), partitions=partitions)
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return str(path)


BAD_NAMES = ["..", "../../etc", "a/b", "/abs/path", ".hidden", "a\\b", "x y", "", "C:evil", "a\0b"]


@pytest.mark.parametrize("name", BAD_NAMES)
@pytest.mark.parametrize("which", ["stream", "connector"])
def test_a_name_that_could_reach_outside_its_folder_is_refused(tmp_path, name, which):
    kwargs = {which: name}
    path = catalog(tmp_path, **kwargs)
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    message = str(info.value)
    assert message.startswith(f"{path}:") and "may hold only letters, digits" in message
    assert f"{which}s." in message  # the table that holds the name
    assert not (tmp_path / "data").exists()  # nothing created


def test_a_plain_name_is_accepted_and_its_progress_stays_inside_the_stream_folder(tmp_path):
    cat = load_catalog(catalog(tmp_path, "orders.eu-1", "gen_2.x"))
    entry = cat.stream("orders.eu-1")
    folder = state_dir(entry, "gen_2.x", None)
    inside = os.path.join(entry.location, "_rowtime_connect") + os.sep
    assert os.path.realpath(folder).startswith(os.path.realpath(inside))


def test_the_cli_caps_partitions_as_the_catalog_does(tmp_path, capsys):
    where = tmp_path / "s"
    assert main(["create", str(where), "--schema", "a INT", "--partitions", "10001"]) == 2
    _, err = capsys.readouterr()
    assert err.count("\n") == 1 and f"more than {MAX_PARTITIONS}" in err
    assert not where.exists()  # refused before anything was written
    with pytest.raises(CatalogError, match=f"from 1 to {MAX_PARTITIONS}"):
        load_catalog(catalog(tmp_path, partitions=MAX_PARTITIONS + 1))
    with pytest.raises(OptionError, match="partitions"):
        parse_sink_options({"path": str(tmp_path / "t"), "partitions": "10001"}, _sink_schema())
    with pytest.raises(OptionError, match=f"more than {MAX_PARTITIONS}"):
        create_stream(str(where), "a INT", MAX_PARTITIONS + 1)
    assert main(["create", str(where), "--schema", "a INT", "--partitions", "3"]) == 0


def _sink_schema() -> pa.Schema:
    return pa.schema([("rowtime", pa.timestamp("us", tz="UTC")), ("is_bound", pa.bool_())])


# -- the record size limit -----------------------------------------------------------------------


@pytest.fixture
def wide(tmp_path):
    location = str(tmp_path / "wide")
    create_stream(location, "id INT, s STRING, b BINARY")
    return location


def test_a_record_at_the_limit_is_stored_and_one_byte_more_is_refused_naming_it(wide):
    with open_writer(wide, 0) as w:
        w.insert({"id": 1, "b": b"x" * MAX_RECORD_BYTES})
        with pytest.raises(SchemaError) as info:
            w.insert({"id": 2, "b": b"x" * (MAX_RECORD_BYTES + 1)})
        message = str(info.value)
        assert f"{MAX_RECORD_BYTES + 1} bytes" in message and "64 MiB" in message
        assert "Nothing was written" in message and "s, b" in message
        assert w.pending == 1  # the refused row was not buffered
    table = read_stream(wide)
    assert table.column("id").to_pylist() == [1]
    assert len(table.column("b")[0].as_py()) == MAX_RECORD_BYTES


def test_the_limit_counts_utf8_bytes_and_every_string_and_binary_column_together(wide):
    with open_writer(wide, 0) as w:
        two_byte = "é" * (MAX_RECORD_BYTES // 2) + "x"  # fewer characters than the limit
        with pytest.raises(SchemaError, match=f"{MAX_RECORD_BYTES + 1} bytes"):
            w.insert({"id": 1, "s": two_byte})
        half = MAX_RECORD_BYTES // 2
        with pytest.raises(SchemaError, match="64 MiB"):
            w.insert({"id": 2, "s": "s" * half, "b": b"b" * (half + 1)})
        w.insert({"id": 3, "s": "s" * half, "b": b"b" * half})
        assert w.pending == 1


def test_insert_arrow_refuses_a_table_with_one_row_over_the_limit_and_buffers_none_of_it(wide):
    big = b"x" * (MAX_RECORD_BYTES + 1)
    table = pa.table(
        {"id": pa.array([1, 2, 3], pa.int32()), "b": pa.array([b"a", big, b"c"], pa.binary())}
    )
    with open_writer(wide, 0) as w:
        with pytest.raises(SchemaError, match="row 1 of the inserted table"):
            w.insert_arrow(table)
        assert w.pending == 0
        w.insert_arrow(table.slice(0, 1))
    assert read_stream(wide).column("id").to_pylist() == [1]


def test_a_record_at_the_limit_round_trips_through_redis(tmp_path_factory):
    from redis_server import redis_server

    with redis_server(tmp_path_factory.mktemp("redis-big")) as srv:
        url = srv.url("big")
        create_stream(url, "id INT, b BINARY")
        with open_writer(url, 0) as w:
            w.insert({"id": 1, "b": b"y" * MAX_RECORD_BYTES})
            with pytest.raises(SchemaError, match="64 MiB"):
                w.insert({"id": 2, "b": b"y" * (MAX_RECORD_BYTES + 1)})
        table = read_stream(url)
        assert table.column("id").to_pylist() == [1]
        assert table.column("b")[0].as_py() == b"y" * MAX_RECORD_BYTES
