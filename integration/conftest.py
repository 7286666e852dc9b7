"""Real Spark for the integration tests: one local SparkSession for the whole run.

``ROWTIME_SPARK_MODE=connect`` makes it a Spark Connect session instead: a client without a
JVM, talking to a Connect server the run starts (``helpers.connect_server``); ``./dev test``
runs the files listed in ``CONNECT_FILES`` a second time that way. A test that cannot run under
Spark Connect is marked ``@pytest.mark.classic_only("why")`` and skipped there, saying why.

Tests that need executors in separate processes (``local-cluster``) run their own Spark in a
subprocess (``helpers.run_in_local_cluster``), since a process can hold only one SparkContext.
Never sleep to wait for Spark: drive queries to quiescence with ``processAllAvailable()`` or
``trigger(availableNow=True)`` + ``awaitTermination()``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from helpers import CONNECT, LONG, connect_server, spark_builder

# Spark's Python workers must run this interpreter, which has the project installed.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "spark_subset: the Spark tests ./dev matrix runs on each older supported Spark (found "
        "by name, reader policies, bounds through a window, sink and clock, a restart, panes, "
        "intervals, query shapes, batch reads)",
    )
    config.addinivalue_line(
        "markers", "classic_only(reason): needs classic Spark (a JVM in this process)"
    )
    config.addinivalue_line(
        "markers",
        "connect(reason): runs in the Spark Connect pass too, outside CONNECT_FILES (the "
        "reason says what differs under Connect)",
    )
    config.addinivalue_line(
        "markers",
        "long_cases(*ids, why): the cases of a parametrized test whose id has one of ids as a "
        "part (split at '-') run only in ./dev long (ROWTIME_LONG=1), the whole test when no "
        "id is given; why says what covers them in CI",
    )
    from xdist_plan import register_worker_times  # each xdist worker's minutes, at the end

    register_worker_times(config)
    if not hasattr(config, "workerinput"):  # pytest's own process, before xdist's workers
        from jvm_archive import ensure_archive  # Spark's classes mapped, not loaded: see there

        ensure_archive(wait=False)


def _java_ok() -> bool:
    return shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))


#: The files ``./dev test`` runs again, whole, in a Spark Connect session
#: (ROWTIME_SPARK_MODE=connect): what the mode can change. Under Connect the client holds no
#: JVM and sends plans over gRPC, so what differs is the client side: every public function
#: (``test_connect.py``), the query checks and the watermark's way through one query shape of
#: each kind a client sends (``test_query_shapes.py``: ``CONNECT_SHAPES``), and the README's and
#: the docs' code blocks. Any other test runs
#: there too when marked ``@pytest.mark.connect("what differs")``: an error raised in the
#: server's Python that must reach the client whole, one pass of each sink target.
#:
#: The rest is the same in both modes by construction, and ``tests/test_connect_scope.py``
#: keeps it so: the data source (reader, sink, storage) imports from pyspark only the data
#: source API and types, never a session or a DataFrame, and runs in the Python processes that
#: Spark's driver and executors start, the same processes with the same pickled objects
#: whichever client started the query; a restart, a window's emission or a brute-force
#: comparison gives nothing more under Connect.
CONNECT_FILES = [
    "test_query_shapes.py",
    "test_readme_blocks.py",
    "test_connect.py",
]


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Under Spark Connect, only the listed files and those with a test marked ``connect``
    (the others test the reader, the log and processes, which the mode does not change, or run
    Spark of their own in child processes)."""
    if CONNECT and collection_path.suffix == ".py" and collection_path.name.startswith("test_"):
        if collection_path.name in CONNECT_FILES:
            return None
        return "pytest.mark.connect(" not in collection_path.read_text() or None
    return None


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``./dev test``'s xdist scheduling (tests/xdist_plan.py)."""
    from xdist_plan import make_scheduler

    return make_scheduler(config, log)


def remote_repeats(items: list[pytest.Item]) -> list[pytest.Item]:
    """The cases of a parametrized test on Redis or S3 (``stream_at``) after its first: CI's
    short form runs the first case on those backends and every case on the folder; ``./dev
    long`` (``ROWTIME_LONG=1``) runs all. The cases (SDP's table: a unit and a range) differ in
    what the reader computes, not in what it asks of the backend, which tests/'s contract suite
    holds to the folder's behaviour on all four backends."""
    seen: set[tuple[str, str, str]] = set()
    repeats = []
    for item in items:
        spec = getattr(item, "callspec", None)
        backend = spec.params.get("stream_at", "log") if spec is not None else "log"
        if backend == "log":
            continue
        key = (str(item.path), getattr(item, "originalname", item.name), backend)
        if key in seen:
            repeats.append(item)
        seen.add(key)
    return repeats


def long_only_cases(items: list[pytest.Item]) -> list[pytest.Item]:
    """The cases a ``long_cases`` mark keeps for ``./dev long``: a case whose parameter id has
    one of the mark's ids among its parts (``redis`` matches ``[redis]`` and ``[redis-sec-1]``,
    ``delta-az`` matches ``[delta-az]``); a mark without ids keeps the whole test. A mark
    without ``why`` is refused: a case left out of CI must say what proves its behaviour there."""
    from xdist_plan import case_has_part

    chosen = []
    for item in items:
        mark = item.get_closest_marker("long_cases")
        if mark is None:
            continue
        if not mark.kwargs.get("why"):
            raise pytest.UsageError(f"{item.nodeid}: long_cases needs why=")
        spec = getattr(item, "callspec", None)
        if not mark.args:
            chosen.append(item)
        elif spec is not None and any(case_has_part(spec.id, wanted) for wanted in mark.args):
            chosen.append(item)
    return chosen


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from xdist_plan import plan

    plan(items)
    repeats = [] if LONG else remote_repeats(items) + long_only_cases(items)
    repeats = list({id(item): item for item in repeats}.values())
    if repeats:
        config.hook.pytest_deselected(items=repeats)
        gone = {id(item) for item in repeats}
        items[:] = [item for item in items if id(item) not in gone]
    if not CONNECT:
        return
    # Outside CONNECT_FILES, only the tests marked connect run under Spark Connect.
    outside = [
        item
        for item in items
        if item.path.name not in CONNECT_FILES and item.get_closest_marker("connect") is None
    ]
    if outside:
        config.hook.pytest_deselected(items=outside)
        gone = {id(item) for item in outside}
        items[:] = [item for item in items if id(item) not in gone]
    for item in items:
        marker = item.get_closest_marker("classic_only")
        if marker is not None:
            why = marker.args[0] if marker.args else "needs classic Spark"
            item.add_marker(pytest.mark.skip(reason=f"classic Spark only: {why}"))


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    if not _java_ok():
        pytest.fail("Java is required for the integration tests: install openjdk-17-jre-headless")
    if not CONNECT:
        session = spark_builder().getOrCreate()
        session.sparkContext.setLogLevel("ERROR")
        yield session
        session.stop()
        return
    from pyspark.sql import SparkSession

    log = tmp_path_factory.mktemp("connect-server") / "server.log"
    with connect_server(log) as url:
        os.environ["ROWTIME_CONNECT_URL"] = url  # for code that builds its own session
        session = SparkSession.builder.remote(url).getOrCreate()
        yield session
        # with_watermark's listener keeps PySpark's handler of listener events inside a call
        # to the server; stop() closes the channel under it, and that thread warns it
        # "received exception ... Channel closed!" (PySpark's race, in whichever test's
        # teardown ends the worker; docs/limits.md). Take the listeners off first, as a
        # program that wants a quiet stop does.
        for listener in list(session.streams._sqlb._listener_bus):
            session.streams.removeListener(listener)
        session.stop()


@pytest.fixture
def workdir(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory for streams, checkpoints and targets of one test."""
    yield tmp_path


# -- storage backends ------------------------------------------------------------------------
# Tests that take ``stream_at`` run once per backend: the embedded log (a folder) and Redis
# Streams (a real server, tests/redis_server.py: testcontainers when Docker answers, else
# redis-server; skipped, saying why, only when neither can start).

sys.path.insert(0, str(Path(__file__).parent.parent / "tests"))

# Object storage (tests/objstore_servers.py): moto's S3 server and Azurite start when a test asks
# for them, on ports chosen now, and the standard variables pointing at them are set now: the
# JVM, and the Python workers it starts, keep the environment they started with.
from objstore_servers import (  # noqa: E402
    az_server,  # noqa: F401
    object_server,  # noqa: F401
    reserve_ports,
    s3_server,  # noqa: F401
)

reserve_ports()


@pytest.fixture(scope="session")
def redis_for_tests(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from redis_server import redis_server

    with redis_server(tmp_path_factory.mktemp("redis"), appendonly=True) as server:
        yield server


_stream_names = iter(range(1, 10**9))


# Under Spark Connect the embedded log only: the backend does not depend on the mode, and the
# classic pass runs both.
@pytest.fixture(params=["log"] if CONNECT else ["log", "redis", "s3"])
def stream_at(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """``stream_at(name)``: a fresh stream location of the test's backend (a folder under the
    test's tmp_path, ``redis://127.0.0.1:<port>/0/<unique name>``, or ``s3://`` on moto's
    server)."""
    if request.param == "log":
        return lambda name: str(tmp_path / name)
    if request.param == "s3":
        return request.getfixturevalue("s3_server").url  # type: ignore[no-any-return]
    server = request.getfixturevalue("redis_for_tests")
    return lambda name: server.url(f"{name}-{next(_stream_names)}")
