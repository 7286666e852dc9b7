"""The API reference's examples that use a ``spark`` session run, in the test session.

tests/test_api_examples.py runs the others and checks that every public name has examples;
this file runs the ones tests/api_examples.py finds using ``spark`` (each short: a stream
created in a temporary folder, at most one ``availableNow`` query). Classic Spark only: the
public functions under Spark Connect are integration/test_connect.py's.
"""

from __future__ import annotations

import importlib.util
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("api_examples", ROOT / "tests" / "api_examples.py")
assert _spec is not None and _spec.loader is not None
api_examples = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(api_examples)

SPARK_NAMES = sorted(n for n in api_examples.public_objects() if api_examples.needs_spark(n))


def test_some_examples_need_spark() -> None:
    # A guard against a pattern that silently finds nothing to run here.
    assert {"with_watermark", "time_interval_aggregate"} <= set(SPARK_NAMES), SPARK_NAMES


@pytest.mark.parametrize("name", SPARK_NAMES)
def test_the_examples_run_in_spark(
    spark: Any, workdir: Path, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(workdir))
    try:
        api_examples.run_examples(name, {"spark": spark})
    finally:
        for query in spark.streams.active:
            query.stop()
        if name == "use_catalog":  # its example registered a catalog for the whole session
            from pyspark_rowtime import RowtimeDataSource

            spark.dataSource.register(RowtimeDataSource)
