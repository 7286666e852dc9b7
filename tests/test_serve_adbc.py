"""``rowtime serve``'s Flight SQL bulk ingest, driven by ADBC's Flight SQL driver.

The driver is Arrow's Go build (``adbc-driver-flightsql`` on PyPI ships
``libadbc_driver_flightsql.so``, from ``github.com/apache/arrow-adbc/go/driver/flightsql``),
loaded through ADBC's DB-API: a client nobody here wrote, in another language, as an adapter
in Go or Java meets the server.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from serve_fixtures import T0, root_fixture, server_fixture  # noqa: F401 (fixtures)

from pyspark_rowtime.api import read_stream
from pyspark_rowtime.flight_server import RowtimeFlightServer, Streams

dbapi = pytest.importorskip("adbc_driver_flightsql.dbapi")

HEADER = "adbc.flight.sql.rpc.call_header."


@pytest.fixture
def conn(server: RowtimeFlightServer) -> Iterator[Any]:
    with pytest.warns(Warning):  # "Cannot disable autocommit": Flight SQL has no transactions here
        c = dbapi.connect(server.url)
    try:
        yield c
    finally:
        c.close()


def table(first: int, n: int) -> pa.Table:
    return pa.table(
        {
            "id": pa.array(range(first, first + n), pa.int64()),
            "name": [f"n{i}" for i in range(first, first + n)],
            "rowtime": pa.array(
                [T0 + i for i in range(first, first + n)], pa.timestamp("us", "UTC")
            ),
        }
    )


def ingest(conn: Any, data: pa.Table, **headers: str) -> int:
    with conn.cursor() as cur:
        cur.adbc_statement.set_options(**{HEADER + f"x-rowtime-{k}": v for k, v in headers.items()})
        return int(cur.adbc_ingest("orders", data, mode="append"))


def bound(conn: Any, query: str, **headers: str) -> int:
    with conn.cursor() as cur:
        cur.adbc_statement.set_options(**{HEADER + f"x-rowtime-{k}": v for k, v in headers.items()})
        cur.adbc_statement.set_sql_query(query)
        return int(cur.adbc_statement.execute_update())


def stored(root: Path) -> list[tuple[int, Any]]:
    t = read_stream(str(root / "orders"))
    return list(zip(t.column("partition").to_pylist(), t.column("id").to_pylist(), strict=True))


def test_the_go_driver_ingests_a_table_once_per_writer_and_seq(conn: Any, root: Path) -> None:
    assert ingest(conn, table(0, 3), writer="go-1", seq="0") == 3
    assert ingest(conn, table(0, 3), writer="go-1", seq="0") == 3  # resent: a duplicate
    # a writer's seqs count per partition: its first message to partition 1 is seq 0
    assert ingest(conn, table(3, 2), writer="go-1", seq="0", partition="1") == 2
    assert ingest(conn, table(5, 1), writer="go-1", seq="1") == 1
    assert stored(root) == [(0, 0), (0, 1), (0, 2), (0, 5), (1, 3), (1, 4)]


def test_a_bound_alone_goes_by_execute_update(conn: Any, root: Path) -> None:
    assert ingest(conn, table(0, 1), writer="go-1", seq="0", bound=str(T0 + 100)) == 1
    assert (
        bound(conn, "SET ROWTIME BOUND '2023-11-14T23:00:00Z' FOR orders", writer="go-1", seq="1")
        == 1
    )
    assert (
        bound(conn, "set rowtime bound '1700003600000000' for \"orders\";", writer="go-1", seq="2")
        == 1
    )
    t = read_stream(str(root / "orders"))
    assert t.column("is_bound").to_pylist() == [False, True, True, True]
    assert t.column("rowtime").cast(pa.int64()).to_pylist() == [
        T0,
        T0 + 100,
        1_700_002_800_000_000,
        1_700_003_600_000_000,
    ]


def test_the_drivers_errors_carry_the_servers_refusals(conn: Any, root: Path) -> None:
    ingest(conn, table(0, 1), writer="go-1", seq="0")
    with pytest.raises(dbapi.Error, match="the next one expected is 1"):
        ingest(conn, table(1, 1), writer="go-1", seq="5")
    with pytest.raises(dbapi.Error, match="writer None must be a name"):
        ingest(conn, table(1, 1), seq="1")
    with pytest.raises(dbapi.Error, match="x-rowtime-seq None"):
        ingest(conn, table(1, 1), writer="go-1")
    with pytest.raises(dbapi.Error, match="below the clock"):
        ingest(conn, table(1, 1), writer="go-1", seq="1", bound=str(T0))
    with pytest.raises(dbapi.Error, match="the one statement served is SET ROWTIME BOUND"):
        bound(conn, "DELETE FROM orders", writer="go-1", seq="1")
    assert stored(root) == [(0, 0)]


def test_the_go_driver_sends_the_bearer_token(root: Path, tmp_path: Path) -> None:
    server = RowtimeFlightServer(Streams(str(root)), port=0, tokens=[b"tok-1"])
    try:
        with pytest.warns(Warning):
            good = dbapi.connect(
                server.url, db_kwargs={"adbc.flight.sql.authorization_header": "Bearer tok-1"}
            )
        with good:
            assert ingest(good, table(0, 1), writer="go-1", seq="0") == 1
        with pytest.warns(Warning):
            bad = dbapi.connect(server.url)
        with bad, pytest.raises(dbapi.Error, match=r"(?i)unauthenticated"):
            ingest(bad, table(1, 1), writer="go-1", seq="1")
    finally:
        server.stop(5)
    assert stored(root) == [(0, 0)]
    assert server.refusals_before_writer["auth"] >= 1


def test_a_prepared_bound_statement_is_served_and_needs_no_server_state(
    conn: Any, root: Path, server: RowtimeFlightServer
) -> None:
    """JDBC's executeUpdate and ADBC's prepare() prepare first: the handle is the statement's
    text, so a prepared statement outlives nothing on the server (a restart loses nothing)."""
    with conn.cursor() as cur:
        cur.adbc_statement.set_options(
            **{HEADER + "x-rowtime-writer": "jdbc-1", HEADER + "x-rowtime-seq": "0"}
        )
        cur.adbc_statement.set_sql_query("SET ROWTIME BOUND '2026-01-01T00:00:00Z' FOR orders")
        cur.adbc_statement.prepare()
        assert cur.adbc_statement.execute_update() == 1
        assert cur.adbc_statement.execute_update() == 1  # the same seq again: a duplicate
    with conn.cursor() as cur, pytest.raises(dbapi.Error, match="the one statement served"):
        cur.adbc_statement.set_sql_query("SELECT * FROM orders")
        cur.adbc_statement.prepare()
    t = read_stream(str(root / "orders"))
    assert t.column("is_bound").to_pylist() == [True]
    assert server.counts[("orders", 0, "jdbc-1")].duplicates == 1
