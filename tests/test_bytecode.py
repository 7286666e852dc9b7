"""``integration/bytecode.py``, which ``./dev`` runs at install: a ``.pth`` file takes Spark's
``pyspark.zip`` off the path of the venv's Python processes, so that they import the same
PySpark from site-packages, and only when every source in the zip is the one in site-packages."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).parent.parent / "integration" / "bytecode.py"


def _bytecode():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("rowtime_dev_bytecode", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _tree(tmp_path: Path, zip_files: dict[str, bytes], site_files: dict[str, bytes]):  # type: ignore[no-untyped-def]
    """A zip and a site-packages folder, each holding the given files."""
    site = tmp_path / "site-packages"
    for name, data in site_files.items():
        (site / name).parent.mkdir(parents=True, exist_ok=True)
        (site / name).write_bytes(data)
    zip_path = site / "pkg" / "python" / "lib" / "pyspark.zip"
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(zip_path, "w") as z:
        for name, data in zip_files.items():
            z.writestr(name, data)
    return zip_path, site


def _imported_from(zip_path: Path, site: Path) -> str:
    """Where ``pkg.mod`` comes from in a fresh process that has the zip first on its path (as
    Spark's Python processes do) and processes ``site``'s ``.pth`` files."""
    code = f"import site; site.addsitedir({str(site)!r}); import pkg.mod as m; print(m.WHERE)"
    env = {**os.environ, "PYTHONPATH": str(zip_path)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0 and not out.stderr, out.stderr
    return out.stdout.strip()


def test_the_processes_import_from_site_packages_once_the_path_file_is_written(
    tmp_path: Path,
) -> None:
    bytecode = _bytecode()
    same = {"pkg/__init__.py": b"", "pkg/mod.py": b"WHERE = __file__\n"}
    zip_path, site = _tree(tmp_path, {**same, "pkg/tests/test_x.py": b"1\n"}, same)
    assert ".zip" in _imported_from(zip_path, site)  # Spark's order: the zip first

    assert bytecode.write_path_file(zip_path, site) is None
    assert _imported_from(zip_path, site) == str(site / "pkg" / "mod.py")
    assert bytecode.write_path_file(zip_path, site) is None  # again: the same file, unchanged
    assert len(list(site.glob("*.pth"))) == 1


def test_a_zip_whose_sources_differ_stays_in_use(tmp_path: Path) -> None:
    bytecode = _bytecode()
    zip_files = {"pkg/__init__.py": b"", "pkg/mod.py": b"WHERE = 'zip ' + __file__\n"}
    site_files = {"pkg/__init__.py": b"", "pkg/mod.py": b"WHERE = 'other'\n"}
    zip_path, site = _tree(tmp_path, zip_files, site_files)
    (site / bytecode.PTH_NAME).write_text("# from an earlier run\n")
    why = bytecode.write_path_file(zip_path, site)
    assert why is not None and "pkg/mod.py" in why and "stays in use" in why
    assert not (site / bytecode.PTH_NAME).exists()  # an earlier run's file goes too
    assert _imported_from(zip_path, site).startswith("zip ")


def test_the_test_venv_has_it_and_pyspark_comes_from_site_packages() -> None:
    """What ``./dev`` set up for this run: Spark's Python processes get PySpark from
    site-packages, with the zip on their path as Spark puts it."""
    bytecode = _bytecode()
    found = bytecode.pyspark_zip()
    pth = Path(sysconfig.get_paths()["purelib"]) / bytecode.PTH_NAME
    if found is None or not pth.is_file():
        pytest.skip("this venv was not set up by ./dev (integration/bytecode.py), or has no zip")
    env = {**os.environ, "PYTHONPATH": str(found)}
    out = subprocess.run(
        [sys.executable, "-c", "import pyspark; print(pyspark.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    assert ".zip" not in out.stdout and out.stdout.strip().endswith("pyspark/__init__.py")
