"""The package's face: what users import, and what Spark looks up."""

from __future__ import annotations

import os
import pkgutil
import sysconfig

import pyspark_rowtime
import pyspark_rowtime.bounds as core


def test_every_public_name_resolves():
    for name in pyspark_rowtime.__all__:
        assert getattr(pyspark_rowtime, name) is not None, name
    for name in core.__all__:
        assert getattr(core, name) is not None, name


def test_every_error_class_is_importable_from_the_package():
    import inspect

    import pyspark_rowtime.bounds.errors as errors

    classes = [
        c
        for _, c in inspect.getmembers(errors, inspect.isclass)
        if issubclass(c, errors.RowtimeError) and c.__module__ == errors.__name__
    ]
    assert len(classes) > 10
    for cls in classes:
        assert getattr(pyspark_rowtime, cls.__name__) is cls, cls.__name__


def test_spark_finds_default_source_the_way_its_lookup_does():
    # pyspark.sql.worker.lookup_data_sources: top-level pyspark_* modules with DefaultSource
    from pyspark.sql.datasource import DataSource

    found = {m.name for m in pkgutil.iter_modules() if m.name.startswith("pyspark_")}
    assert "pyspark_rowtime" in found
    assert issubclass(pyspark_rowtime.DefaultSource, DataSource)
    assert pyspark_rowtime.DefaultSource.name() == "rowtime"


def test_nothing_generic_is_installed_at_the_top_of_site_packages():
    # Where installs go, and where this one went (an editable install links into its own
    # folder); not sys.path as a whole, which starts with the checkout when run from its root.
    installed_in = os.path.dirname(os.path.dirname(os.path.abspath(pyspark_rowtime.__file__)))
    folders = [sysconfig.get_paths()["purelib"], installed_in]
    top = {m.name for m in pkgutil.iter_modules(folders)}
    assert "pyspark_rowtime" in top
    assert not top & {"bounds", "sink", "datasource", "streams"}


def test_unknown_attribute_is_an_attribute_error():
    try:
        pyspark_rowtime.no_such_name  # noqa: B018
    except AttributeError as e:
        assert "no_such_name" in str(e)
    else:
        raise AssertionError("expected AttributeError")


def test_no_test_file_name_stands_in_both_tests_and_integration() -> None:
    """pytest imports test files by their basename (the folders are not packages), so a name
    in both folders stops the whole run at collection ("import file mismatch")."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    fast = {p.name for p in (root / "tests").glob("test_*.py")}
    spark = {p.name for p in (root / "integration").glob("test_*.py")}
    assert not fast & spark, f"rename one of each: {sorted(fast & spark)}"
