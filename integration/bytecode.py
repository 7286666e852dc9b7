"""Where the Python processes Spark starts import PySpark and Py4J from, and the bytecode they
find: set up once per venv by ``./dev`` at install (``.venv`` and each ``./dev matrix`` venv).

Spark starts a Python process at every streaming query's start (the Python data source's
planner) beside its worker daemons, and the tests start a thousand queries and many child
drivers. Three things made each of those processes slower than it needs to be:

* Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` and Py4J's source zip
  (``py4j-*-src.zip``) ahead of site-packages on their path, so they import PySpark and Py4J
  from those zips: a zip holds sources only (``zipimport`` writes no bytecode), so each of them
  compiled PySpark and Py4J anew, and every Python task re-reads a zip's directory once for
  each package imported from it (PySpark's ``setup_spark_files`` calls
  ``importlib.invalidate_caches()``; Python 3.11's ``zipimport`` then reads the whole directory
  again, in Python, for each): 67 ms of CPU a task for PySpark 4.3's 1,486 entries.
  :func:`write_path_file` puts a ``.pth`` file into the venv's site-packages that takes the
  zips off ``sys.path`` as a process starts (:data:`PTH_LINE`), so both come from
  site-packages: the same files (pip installs Py4J, and PySpark's wheel is built from the same
  tree; :func:`zip_matches_site_packages` checks every source, and a zip that differs stays on
  the path), found by the ordinary path finder with their bytecode. Spark puts its spark-core
  jar on that path too (5,973 entries, no Python): :func:`spark_core_jars`, gone the same way.
  The line also drops the zip importers that imports before it cached for these paths
  (coverage's ``.pth`` runs first), which ``invalidate_caches()`` made re-read the jar's and
  the zips' directories in every task: ``integration/test_windows.py``, interleaved, 76.6 and
  74.3 CPU-s of the machine before, 72.0 and 66.1 with this and the stream backends found
  without the metadata (``streams/storage.py``, ``PACKAGED``).
* that bytecode: uv installs without compiling, and where ``PYTHONDONTWRITEBYTECODE`` is set
  (it is on this workplace's machines) no process writes any either, so every process compiled
  numpy, pyarrow, PySpark and the rest from source at each start. ``./dev`` lets Python write its
  bytecode cache (it unsets the variable for what it runs), so each module is compiled once,
  by the first process that imports it.
* the project's strict editable install links its files into ``build/``: :func:`compile_package`
  compiles them at install (timestamp-checked, as Python's own caches).

Measured (docs/benchmarks.md, "The test suite and CI"): PySpark's import in a planner took
0.88-0.95 s of CPU from the zip as shipped; with a ``.pyc`` added into the zip (this module's
earlier way) 0.31-0.40 s, but the zip's directory, twice as long, cost every task 86 ms instead
of 67. With the ``.pth``, the query planners of ``integration/test_reader.py`` used 21.5 and
22.0 s of CPU against 26.4 and 26.7 s with the bytecode in the zip (two interleaved runs each).
With the bytecode cache written, ``integration/test_windows.py`` took 63.5 and 66.7 CPU-s of the
whole machine against 86.8 and 80.7 without (interleaved). Nothing Spark runs changes: the same
sources. ``ROWTIME_BYTECODE=0`` removes the ``.pth`` file, compiles nothing, and leaves
``PYTHONDONTWRITEBYTECODE`` as it is.
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import sys
import sysconfig
import zipfile
from pathlib import Path

#: The file in site-packages; the name says whose it is.
PTH_NAME = "pyspark_rowtime_tests_pyspark_path.pth"
#: Its one line (a ``.pth`` line that starts with ``import`` is run by ``site`` at start-up):
#: every ``sys.path`` entry that is one of these archives, by its real path, goes, and so does
#: the importer that an earlier ``.pth`` file's imports cached for it (coverage's runs first):
#: ``importlib.invalidate_caches()``, which PySpark calls in every task, re-reads the directory
#: of each zip importer in ``sys.path_importer_cache``. (``site`` runs the line with ``exec``
#: inside a function: a name it binds is not seen inside a comprehension, so the paths are
#: written into it twice.)
PTH_LINE = (
    "import os, sys; sys.path[:] = [p for p in sys.path if os.path.realpath(p) not in {zips!r}]; "
    "[sys.path_importer_cache.pop(k) for k in list(sys.path_importer_cache) "
    "if any((os.path.realpath(k) + os.sep).startswith(z + os.sep) for z in {zips!r})]"
)


def spark_zips() -> list[Path]:
    """The zips the installed PySpark's Python processes import from (PySpark's and Py4J's
    sources), those that exist."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return []
    lib = Path(spec.origin).parent / "python" / "lib"
    return [p for p in [lib / "pyspark.zip", *sorted(lib.glob("py4j-*-src.zip"))] if p.is_file()]


def spark_core_jars() -> list[Path]:
    """The jar Spark also puts on its Python processes' path (the one that holds
    ``PythonUtils``, spark-core: for a YARN assembly that carried PySpark), those that exist.
    PySpark's wheel ships it with 5,973 entries and no Python in them, and ``zipimport`` reads
    its whole directory for every import searched past it, and again after every
    ``importlib.invalidate_caches()``; ``importlib.metadata`` lists it on each call too."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return []
    return sorted((Path(spec.origin).parent / "jars").glob("spark-core_*.jar"))


def has_python(archive: Path) -> bool:
    """Whether ``archive`` (a zip or jar) holds anything Python could import."""
    with zipfile.ZipFile(archive) as z:
        return any(n.endswith((".py", ".pyc", ".so", ".pyd")) for n in z.namelist())


#: Folders of the zip that the wheel may leave out: PySpark's own tests and benchmark scripts
#: (4.3's wheel has no ``pyspark/sql/streaming/benchmark``), which no Spark process imports.
SKIPPED = frozenset({"tests", "benchmark"})


def zip_matches_site_packages(zip_path: Path, site_packages: Path) -> str | None:
    """None when every ``.py`` in the zip has a byte-identical file at the same place under
    ``site_packages``; else the first that does not, named."""
    with zipfile.ZipFile(zip_path) as z:
        for info in z.infolist():
            if not info.filename.endswith(".py") or SKIPPED.intersection(info.filename.split("/")):
                continue
            there = site_packages / info.filename
            try:
                same = there.read_bytes() == z.read(info)
            except OSError:
                same = False
            if not same:
                return info.filename
    return None


def write_path_file(
    zip_paths: list[Path], site_packages: Path, jars: list[Path] | None = None
) -> list[str]:
    """Write :data:`PTH_NAME` into ``site_packages`` for those of the zips whose sources are
    all there and those of ``jars`` that hold no Python (none: no file); returns why each of
    the others stays in use."""
    why, gone = [], []
    for zip_path in zip_paths:
        differs = zip_matches_site_packages(zip_path, site_packages)
        if differs is None:
            gone.append(os.path.realpath(zip_path))
        else:
            why.append(f"{differs} in {zip_path} differs from site-packages: the zip stays in use")
    for jar in jars or []:
        if has_python(jar):
            why.append(f"{jar} holds Python: it stays in use")
        else:
            gone.append(os.path.realpath(jar))
    target = site_packages / PTH_NAME
    if not gone:
        target.unlink(missing_ok=True)
        return why
    line = PTH_LINE.format(zips=tuple(gone)) + "\n"
    if not target.is_file() or target.read_text() != line:
        tmp = target.with_suffix(".tmp")
        tmp.write_text(line)
        os.replace(tmp, target)
    return why


def compile_package(name: str = "pyspark_rowtime") -> bool:
    """Write the bytecode of every module of the installed package ``name`` (through the
    file links of an editable install) where the import looks for it; a pyc as new as its
    source is kept. False if a module failed to compile."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return True
    return all(compileall.compile_dir(top, quiet=1) for top in spec.submodule_search_locations)


def main() -> None:
    site_packages = Path(sysconfig.get_paths()["purelib"])
    if os.environ.get("ROWTIME_BYTECODE", "1") == "0":
        (site_packages / PTH_NAME).unlink(missing_ok=True)
        return
    for why in write_path_file(spark_zips(), site_packages, spark_core_jars()):
        print(f"bytecode: {why}", file=sys.stderr)
    compile_package()


if __name__ == "__main__":
    main()
