"""Every public name of ``pyspark_rowtime`` has an Examples section, and its examples run.

The examples are what the API reference shows (docs/reference.md). Those that need no Spark
run here; those with a ``spark`` session run in integration/test_api_examples_spark.py. Temporary
folders the examples make (``tempfile.mkdtemp()``) land in the test's own.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from api_examples import examples, needs_spark, public_objects, run_examples

NAMES = sorted(public_objects())


def test_every_public_name_has_an_examples_section() -> None:
    missing = [n for n in NAMES if "Examples:" not in (public_objects()[n].__doc__ or "")]
    assert not missing, f"no Examples: section in the docstring of {missing}"
    empty = [n for n in NAMES if not examples(n).examples]
    assert not empty, f"an Examples: section without a >>> example: {empty}"


def test_the_aliases_are_the_objects_they_name() -> None:
    import pyspark_rowtime as rt

    assert rt.DefaultSource is rt.RowtimeDataSource and rt.BadInput is rt.BadInputError
    assert "DefaultSource" not in NAMES and "BadInput" not in NAMES


@pytest.mark.parametrize("name", [n for n in NAMES if not needs_spark(n)])
def test_the_examples_run(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    run_examples(name, {})
