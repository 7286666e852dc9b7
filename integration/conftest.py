"""Real Spark for the integration tests: one local SparkSession for the whole run.

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
from helpers import spark_builder

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


def _java_ok() -> bool:
    return shutil.which("java") is not None or bool(os.environ.get("JAVA_HOME"))


@pytest.fixture(scope="session")
def spark():  # type: ignore[no-untyped-def]
    if not _java_ok():
        pytest.fail("Java is required for the integration tests: install openjdk-17-jre-headless")
    session = spark_builder().getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    yield session
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


@pytest.fixture(scope="session")
def redis_for_tests(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from redis_server import redis_server

    with redis_server(tmp_path_factory.mktemp("redis"), appendonly=True) as server:
        yield server


_stream_names = iter(range(1, 10**9))


@pytest.fixture(params=["log", "redis"])
def stream_at(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], str]:
    """``stream_at(name)``: a fresh stream location of the test's backend (a folder under the
    test's tmp_path, or ``redis://127.0.0.1:<port>/0/<unique name>``)."""
    if request.param == "log":
        return lambda name: str(tmp_path / name)
    server = request.getfixturevalue("redis_for_tests")
    return lambda name: server.url(f"{name}-{next(_stream_names)}")
