"""Where the Python processes Spark starts import PySpark from, and the project's bytecode: set
up once per venv by ``./dev`` at install (``.venv`` and each ``./dev matrix`` venv).

Spark starts a Python process at every streaming query's start (the Python data source's
planner) beside its worker daemons, and the tests start a thousand queries and many child
drivers. Two things made each of those processes slower than it needs to be:

* Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` ahead of site-packages on their path, so
  they import PySpark from that zip: a zip holds sources only (``zipimport`` writes no
  bytecode), so each of them compiled PySpark anew, and every Python task re-reads the zip's
  directory once for each PySpark package imported from it (PySpark's ``setup_spark_files``
  calls ``importlib.invalidate_caches()``; Python 3.11's ``zipimport`` then reads the whole
  directory again, in Python, for each): 67 ms of CPU a task for PySpark 4.3's 1,486 entries.
  :func:`write_path_file` puts a ``.pth`` file into the venv's site-packages that takes the zip
  off ``sys.path`` as a process starts (:data:`PTH_LINE`), so PySpark comes from site-packages:
  the same files, built into the wheel from the same tree (:func:`zip_matches_site_packages`
  checks every source, and no ``.pth`` is written if one differs), with the bytecode pip
  compiled at install, found by the ordinary path finder.
* the project's strict editable install links its files into ``build/`` and nothing compiles
  them there, and where ``PYTHONDONTWRITEBYTECODE`` is set (it is on this workplace's
  machines) no process writes their bytecode either. :func:`compile_package` compiles them
  (timestamp-checked, as Python's own caches: an edited module is compiled again in memory
  until the next ``./dev`` run writes its new pyc).

Measured (docs/benchmarks.md, "The test suite and CI"): PySpark's import in a planner took
0.88-0.95 s of CPU from the zip as shipped; with a ``.pyc`` added into the zip (this module's
earlier way) 0.31-0.40 s, but the zip's directory, twice as long, cost every task 86 ms instead
of 67. With the ``.pth``, the query planners of ``integration/test_reader.py`` used 21.5 and
22.0 s of CPU against 26.4 and 26.7 s with the bytecode in the zip (two interleaved runs each).
Nothing Spark runs changes: the same PySpark sources. ``ROWTIME_BYTECODE=0`` removes the
``.pth`` file and compiles nothing.
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
#: every ``sys.path`` entry that is this zip, by its real path, goes.
#: (``site`` runs it with ``exec`` inside a function: a name it binds is not seen inside the
#: comprehension, so the zip's path is written into it.)
PTH_LINE = (
    "import os, sys; "
    "sys.path[:] = [p for p in sys.path if os.path.realpath(p) != os.path.realpath({zip!r})]"
)


def pyspark_zip() -> Path | None:
    """The zip the installed PySpark's Python processes import from, if there is one."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "python" / "lib" / "pyspark.zip"
    return path if path.is_file() else None


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


def write_path_file(zip_path: Path, site_packages: Path) -> str | None:
    """Write :data:`PTH_NAME` into ``site_packages`` unless the zip differs from what lies
    there; returns why not, or None when it is in place."""
    differs = zip_matches_site_packages(zip_path, site_packages)
    target = site_packages / PTH_NAME
    if differs is not None:
        target.unlink(missing_ok=True)
        return f"{differs} in {zip_path} differs from site-packages: the zip stays in use"
    line = PTH_LINE.format(zip=str(zip_path)) + "\n"
    if not target.is_file() or target.read_text() != line:
        tmp = target.with_suffix(".tmp")
        tmp.write_text(line)
        os.replace(tmp, target)
    return None


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
    found = pyspark_zip()
    if found is not None:
        why = write_path_file(found, site_packages)
        if why is not None:
            print(f"bytecode: {why}", file=sys.stderr)
    compile_package()


if __name__ == "__main__":
    main()
