"""``integration/bytecode.py``, which ``./dev`` runs at install: PySpark's zip gets a checked
``.pyc`` beside each source, which ``zipimport`` then loads instead of compiling, and nothing
else in the zip changes."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import zipfile
from pathlib import Path

SCRIPT = Path(__file__).parent.parent / "integration" / "bytecode.py"


def _bytecode():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("rowtime_dev_bytecode", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _zip(path: Path, files: dict[str, bytes]) -> None:
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)


def _import_from(path: Path, module: str) -> str:
    """Where ``module`` came from and what it says, imported from the zip in a fresh process."""
    code = (
        f"import sys; sys.path.insert(0, {str(path)!r}); "
        f"import {module} as m; print(m.__file__, m.X)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    return out.stdout.strip()


def test_the_zip_gets_checked_bytecode_that_zipimport_loads(tmp_path: Path) -> None:
    bytecode = _bytecode()
    path = tmp_path / "pyspark.zip"
    files = {
        "pkg/__init__.py": b"",
        "pkg/mod.py": b"X = 'compiled before'\n",
        "pkg/tests/test_x.py": b"X = 1\n",
        "pkg/data.txt": b"not python",
        "pkg/broken.py": b"def (\n",
    }
    _zip(path, files)
    assert _import_from(path, "pkg.mod").endswith("pkg/mod.py compiled before")

    assert bytecode.add_bytecode(path) is True
    assert bytecode.add_bytecode(path) is False  # once: the marker says it is done
    with zipfile.ZipFile(path) as z:
        names = set(z.namelist())
        assert all(z.read(n) == data for n, data in files.items())  # every entry as it was
    assert {"pkg/__init__.pyc", "pkg/mod.pyc"} <= names
    assert "pkg/tests/test_x.pyc" not in names  # PySpark's own tests: no Spark process runs them
    assert "pkg/broken.pyc" not in names  # left to fail where it is imported, as before
    assert _import_from(path, "pkg.mod").endswith("pkg/mod.pyc compiled before")


def test_a_pyc_that_does_not_match_its_source_is_ignored(tmp_path: Path) -> None:
    """CHECKED_HASH: a source changed after the bytecode was added is what runs."""
    bytecode = _bytecode()
    path = tmp_path / "pyspark.zip"
    _zip(path, {"pkg/__init__.py": b"", "pkg/mod.py": b"X = 'old'\n"})
    bytecode.add_bytecode(path)
    with zipfile.ZipFile(path) as z:
        entries = {n: z.read(n) for n in z.namelist()}
    entries["pkg/mod.py"] = b"X = 'new'\n"
    _zip(path, entries)
    assert _import_from(path, "pkg.mod").endswith(" new")
