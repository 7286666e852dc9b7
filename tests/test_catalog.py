"""The catalog: names resolve to streams, streams are created on first use, errors point at
the file, line and key, and secrets never sit in (or come out of) a catalog."""

from __future__ import annotations

import pytest

from pyspark_rowtime.bounds.errors import OptionError
from pyspark_rowtime.cli import main
from pyspark_rowtime.streams.catalog import (
    CatalogError,
    ensure_stream,
    find_catalog,
    load_catalog,
    resolve_stream_option,
)
from pyspark_rowtime.streams.storage import open_stream

GOOD = """
[streams.orders]
location = "data/orders"
schema = "ticker STRING, qty INT, ts TIMESTAMP"
partitions = 2
reader = { order = "adjust", "adjust.unit" = "msec", "adjust.range" = 999 }

[connectors.orders-files]
kind = "directory"
stream = "orders"
path = "incoming"
format = "jsonl"
rowtime_field = "ts"
bounds = { strategy = "lateness", lateness = "5 seconds" }
"""


def write(tmp_path, text):
    path = tmp_path / "catalog.toml"
    path.write_text(text)
    return str(path)


def test_a_name_resolves_relative_to_the_catalog_and_the_stream_is_created_on_first_use(
    tmp_path,
):
    path = write(tmp_path, GOOD)
    opts, entry = resolve_stream_option({"stream": "orders", "catalog": path, "order": "drop"})
    assert opts == {"order": "drop", "path": str(tmp_path / "data" / "orders")}
    assert entry is not None and entry.reader == {
        "order": "adjust",
        "adjust_unit": "msec",
        "adjust_range": 999,
    }
    meta = open_stream(opts["path"]).meta
    assert meta.partitions == 2 and meta.payload_schema.names == ["ticker", "qty", "ts"]


def test_an_existing_stream_that_differs_shows_both(tmp_path):
    path = write(tmp_path, GOOD)
    ensure_stream(load_catalog(path).stream("orders"))
    changed = write(
        tmp_path, GOOD.replace("partitions = 2", "partitions = 3").replace("qty INT", "qty BIGINT")
    )
    with pytest.raises(CatalogError) as e:
        ensure_stream(load_catalog(changed).stream("orders"))
    msg = str(e.value)
    assert "the stream has 2, the catalog says 3" in msg
    assert "qty INT" in msg and "qty BIGINT" in msg


def test_an_unknown_name_lists_the_known_ones(tmp_path):
    path = write(tmp_path, GOOD)
    with pytest.raises(CatalogError, match=r"no stream 'order' .* its streams are: orders"):
        resolve_stream_option({"stream": "order", "catalog": path})


@pytest.mark.parametrize(
    ("change", "line", "key"),
    [
        (("partitions = 2", "partitions = 0"), 5, "streams.orders.partitions = 0"),
        (
            ('"adjust.range" = 999', '"adjust.range" = -1'),
            6,
            'streams.orders.reader."adjust.range"',
        ),
        (('kind = "directory"', 'kind = "ftp"'), 9, "connectors.orders-files.kind = 'ftp'"),
        (("schema =", "shema ="), 4, "streams.orders.shema"),
        (('stream = "orders"', 'stream = "nope"'), 10, "connectors.orders-files.stream"),
    ],
)
def test_a_semantic_error_names_file_line_and_key(tmp_path, change, line, key):
    path = write(tmp_path, GOOD.replace(*change))
    with pytest.raises(CatalogError) as e:
        load_catalog(path)
    assert str(e.value).startswith(f"{path}:{line}: {key}")


def test_a_syntax_error_keeps_tomllibs_line(tmp_path):
    path = write(tmp_path, GOOD.replace("partitions = 2", "partitions = = 2"))
    with pytest.raises(CatalogError, match=r"catalog.toml: not valid TOML: .*line 5"):
        load_catalog(path)


def test_secrets_are_never_inline_and_never_printed(tmp_path, monkeypatch):
    inline = GOOD.replace('"data/orders"', '"redis://app:hunter2@localhost:6379/0/orders"')
    with pytest.raises(CatalogError) as e:
        load_catalog(write(tmp_path, inline))
    assert "hunter2" not in str(e.value) and "password_env" in str(e.value)
    keyed = GOOD.replace("partitions = 2", 'partitions = 2\npassword = "hunter2"')
    with pytest.raises(CatalogError) as e:
        load_catalog(write(tmp_path, keyed))
    assert "hunter2" not in str(e.value) and ":6: streams.orders.password" in str(e.value)
    by_env = GOOD.replace('"data/orders"', '"redis://localhost:6379/0/orders"').replace(
        "partitions = 2", 'partitions = 2\npassword_env = "ORDERS_PW"'
    )
    entry = load_catalog(write(tmp_path, by_env)).stream("orders")
    assert entry.location == "redis://localhost:6379/0/orders?password_env=ORDERS_PW"


def test_the_catalog_is_found_from_option_then_conf_then_environment(tmp_path):
    env = {"ROWTIME_CATALOG": "/env.toml"}
    assert find_catalog("/opt.toml", "/conf.toml", env) == "/opt.toml"
    assert find_catalog(None, "/conf.toml", env) == "/conf.toml"
    assert find_catalog(None, None, env) == "/env.toml"
    with pytest.raises(CatalogError, match=r"spark\.rowtime\.catalog .* ROWTIME_CATALOG"):
        find_catalog(None, None, {})


def test_path_and_stream_together_are_refused(tmp_path):
    with pytest.raises(OptionError, match="give one"):
        resolve_stream_option({"stream": "orders", "path": "/x", "catalog": write(tmp_path, GOOD)})


def test_cli_check_streams_and_create(tmp_path, capsys):
    path = write(tmp_path, GOOD)
    (tmp_path / "incoming").mkdir()
    assert main(["catalog", "check", path]) == 0
    assert "ok, 1 stream(s), 1 connector(s)" in capsys.readouterr().out
    assert main(["streams", path]) == 0
    assert "not created" in capsys.readouterr().out
    assert main(["create", "--stream", "orders", "--catalog", path]) == 0
    assert "2 partition(s)" in capsys.readouterr().out
    assert main(["streams", path]) == 0
    out = capsys.readouterr().out
    assert "0 records" in out and "orders-files (directory: never run)" in out
    bad = write(tmp_path, GOOD.replace('format = "jsonl"', 'format = "jsonl"\nbatch = 5'))
    assert main(["catalog", "check", bad]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and ":13: connectors.orders-files.batch = 5: unknown key" in err[0]
