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
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import spark_builder

# Spark's Python workers must run this interpreter, which has the project installed.
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


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
