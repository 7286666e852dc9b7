"""Bytecode for the Python processes Spark starts, made once at install by ``./dev``.

Spark starts a Python process at every streaming query's start (the Python data source's
planner) beside its worker daemons, and the tests start a thousand queries and many child
drivers. Two things made each of those processes compile sources anew:

* Spark puts ``$SPARK_HOME/python/lib/pyspark.zip`` ahead of site-packages on their path, so
  they import PySpark from that zip; a zip holds sources only and ``zipimport`` never writes
  bytecode. :func:`add_bytecode` adds a ``.pyc`` beside each ``.py`` (PySpark's own tests
  aside), compiled by this interpreter and checked against its source's hash
  (``CHECKED_HASH``: a pyc that does not match its source is ignored and the source compiled,
  as before); ``zipimport`` looks for the ``.pyc`` first.
* the project's strict editable install links its files into ``build/`` and nothing compiles
  them there, and where ``PYTHONDONTWRITEBYTECODE`` is set (it is on this workplace's
  machines) no process writes their bytecode either. :func:`compile_package` compiles them
  (timestamp-checked, as Python's own caches: an edited module is compiled again in memory
  until the next ``./dev`` run writes its new pyc).

Measured on ``integration/test_intervals.py`` with py-spy: 46% of the planners' samples were
compiling PySpark's sources from the zip; its import took 0.88-0.95 s of CPU from the zip as
shipped and 0.31-0.40 s with its bytecode. Nothing Spark runs changes: the same sources,
compiled before instead of in every process. ``ROWTIME_BYTECODE=0`` leaves both alone.
"""

from __future__ import annotations

import compileall
import importlib.util
import os
import sys
import tempfile
import warnings
import zipfile
from pathlib import Path

#: An entry whose presence says the zip has this interpreter's bytecode.
MARKER = f"pyspark/__bytecode_{sys.implementation.cache_tag}__"


def pyspark_zip() -> Path | None:
    """The zip the installed PySpark's Python processes import from, if there is one."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / "python" / "lib" / "pyspark.zip"
    return path if path.is_file() else None


def add_bytecode(path: Path) -> bool:
    """Rewrite ``path`` with a ``.pyc`` beside each ``.py`` (atomically: a process that has
    the old zip open keeps reading it). False if it had them already."""
    with zipfile.ZipFile(path) as old:
        names = set(old.namelist())
        if MARKER in names:
            return False
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".pyspark-", suffix=".zip")
        os.close(fd)
        try:
            with zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as new:
                for info in old.infolist():
                    data = old.read(info)
                    new.writestr(info, data)
                    if not info.filename.endswith(".py") or "/tests/" in info.filename:
                        continue  # PySpark's own tests: never imported by a Spark process
                    pyc = info.filename[:-3] + ".pyc"
                    if pyc in names:
                        continue
                    try:
                        with warnings.catch_warnings():
                            warnings.simplefilter("ignore")  # shown where it is imported
                            code = compile(data, f"{path}/{info.filename}", "exec")
                    except SyntaxError:
                        continue  # left to compile (and fail) where it is imported, as before
                    new.writestr(zipfile.ZipInfo(pyc, info.date_time), _pyc(code, data))
                new.writestr(MARKER, b"")
            os.chmod(tmp, path.stat().st_mode & 0o777)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    return True


def _pyc(code: object, source: bytes) -> bytes:
    from importlib._bootstrap_external import _code_to_hash_pyc  # type: ignore[attr-defined]

    return bytes(_code_to_hash_pyc(code, importlib.util.source_hash(source), checked=True))


def compile_package(name: str = "pyspark_rowtime") -> bool:
    """Write the bytecode of every module of the installed package ``name`` (through the
    file links of an editable install) where the import looks for it; a pyc as new as its
    source is kept. False if a module failed to compile."""
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return True
    return all(compileall.compile_dir(top, quiet=1) for top in spec.submodule_search_locations)


def main() -> None:
    if os.environ.get("ROWTIME_BYTECODE", "1") == "0":
        return
    found = pyspark_zip()
    if found is not None and add_bytecode(found):
        print(f"bytecode: added to {found}", file=sys.stderr)
    compile_package()


if __name__ == "__main__":
    main()
