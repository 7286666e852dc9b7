"""``integration/bytecode.py``, which ``./dev`` runs at install: a ``.pth`` file takes Spark's
``pyspark.zip`` and Py4J's source zip off the path of the venv's Python processes, so that they
import the same PySpark and Py4J from site-packages, each only when every source in its zip is
the one in site-packages."""

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
    return _zip(site / "pkg" / "python" / "lib" / "pyspark.zip", zip_files), site


def _zip(zip_path: Path, files: dict[str, bytes]) -> Path:
    zip_path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(zip_path, "w") as z:
        for name, data in files.items():
            z.writestr(name, data)
    return zip_path


def _imported_from(zip_path: Path | list[Path], site: Path, module: str = "pkg.mod") -> str:
    """Where ``module`` comes from in a fresh process that has the zips first on its path (as
    Spark's Python processes do) and processes ``site``'s ``.pth`` files."""
    zips = zip_path if isinstance(zip_path, list) else [zip_path]
    code = f"import site; site.addsitedir({str(site)!r}); import {module} as m; print(m.WHERE)"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, zips))}
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

    assert bytecode.write_path_file([zip_path], site) == []
    assert _imported_from(zip_path, site) == str(site / "pkg" / "mod.py")
    assert bytecode.write_path_file([zip_path], site) == []  # again: the same file, unchanged
    assert len(list(site.glob("*.pth"))) == 1


def test_a_zip_whose_sources_differ_stays_in_use(tmp_path: Path) -> None:
    bytecode = _bytecode()
    zip_files = {"pkg/__init__.py": b"", "pkg/mod.py": b"WHERE = 'zip ' + __file__\n"}
    site_files = {"pkg/__init__.py": b"", "pkg/mod.py": b"WHERE = 'other'\n"}
    zip_path, site = _tree(tmp_path, zip_files, site_files)
    (site / bytecode.PTH_NAME).write_text("# from an earlier run\n")
    (why,) = bytecode.write_path_file([zip_path], site)
    assert "pkg/mod.py" in why and "stays in use" in why
    assert not (site / bytecode.PTH_NAME).exists()  # an earlier run's file goes too
    assert _imported_from(zip_path, site).startswith("zip ")


def test_of_two_zips_the_one_that_matches_goes_and_the_other_stays(tmp_path: Path) -> None:
    """Spark's two zips (PySpark's and Py4J's) are judged each on its own."""
    bytecode = _bytecode()
    same = {"pkg/__init__.py": b"", "pkg/mod.py": b"WHERE = __file__\n"}
    other = {"lib4j/__init__.py": b"", "lib4j/mod.py": b"WHERE = 'zip ' + __file__\n"}
    site_other = {"lib4j/__init__.py": b"", "lib4j/mod.py": b"WHERE = 'site'\n"}
    zip_path, site = _tree(tmp_path, same, {**same, **site_other})
    zip4j = _zip(zip_path.parent / "lib4j-src.zip", other)
    (why,) = bytecode.write_path_file([zip_path, zip4j], site)
    assert "lib4j/mod.py" in why and str(zip4j) in why
    assert _imported_from([zip_path, zip4j], site) == str(site / "pkg" / "mod.py")
    assert _imported_from([zip_path, zip4j], site, "lib4j.mod").startswith("zip ")


def test_a_jar_without_python_leaves_the_path_and_no_zip_importer_stays_cached(
    tmp_path: Path,
) -> None:
    """Spark's spark-core jar (no Python in it) is on its Python processes' path too; it goes,
    and so does every zip importer that imports before the ``.pth`` line cached (PySpark calls
    ``importlib.invalidate_caches()`` in every task: each cached zip importer re-reads its
    whole directory). A jar that holds Python stays."""
    bytecode = _bytecode()
    same = {"pkg/__init__.py": b"", "pkg/mod.py": b"WHERE = __file__\n"}
    zip_path, site = _tree(tmp_path, same, same)
    jar = _zip(tmp_path / "jars" / "spark-core_2.13-9.9.9.jar", {"org/A.class": b"\xca\xfe"})
    with_python = _zip(tmp_path / "jars" / "spark-other.jar", {"lib/m.py": b"X = 1\n"})
    # An earlier .pth file that imports (as coverage's does) fills sys.path_importer_cache.
    (site / "a0_imports.pth").write_text("import json.decoder\n")
    (why,) = bytecode.write_path_file([zip_path], site, [jar, with_python])
    assert str(with_python) in why and "holds Python" in why
    code = (
        f"import site, sys; site.addsitedir({str(site)!r}); "
        f"print([p for p in sys.path if p.startswith({str(tmp_path)!r}) and p[-4] == '.']); "
        "print(sorted(k for k, v in sys.path_importer_cache.items() "
        "if type(v).__name__ == 'zipimporter'))"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, [zip_path, jar, with_python]))}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=60
    )
    assert out.returncode == 0 and not out.stderr, out.stderr
    path, cached = out.stdout.splitlines()
    assert path == repr([str(with_python)]), path
    assert str(zip_path) not in cached and str(jar) not in cached, cached


def test_the_test_venv_has_it_and_pyspark_comes_from_site_packages() -> None:
    """What ``./dev`` set up for this run: Spark's Python processes get PySpark and Py4J from
    site-packages, with the zips on their path as Spark puts them."""
    bytecode = _bytecode()
    found = bytecode.spark_zips()
    pth = Path(sysconfig.get_paths()["purelib"]) / bytecode.PTH_NAME
    if not found or not pth.is_file():
        pytest.skip("this venv was not set up by ./dev (integration/bytecode.py), or has no zip")
    assert {p.name.split("-")[0] for p in found} == {"pyspark.zip", "py4j"}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(str, found))}
    out = subprocess.run(
        [sys.executable, "-c", "import pyspark, py4j; print(pyspark.__file__, py4j.__file__)"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    where = out.stdout.split()
    assert ".zip" not in out.stdout and where[0].endswith("pyspark/__init__.py"), where
    assert where[1].endswith("site-packages/py4j/__init__.py"), where
