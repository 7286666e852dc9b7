"""The README's install, for real: a fresh virtual environment, a normal (non-editable)
``pip install`` of this repository, whose files are real ones where Spark's Python workers look
for data sources. Then the same from the root of a fresh clone, where ``python``, ``python -m
pytest`` and the ``pyspark`` shell put the current folder first on ``sys.path``: they must
import the install, not the checkout's folders, and the shell's Spark must find
``format("rowtime")`` by name, with no ``spark.dataSource.register``.

Spark finds a Python data source by itself only when a top-level ``pyspark_*`` module exposing
``DefaultSource`` is visible to ``pkgutil.iter_modules()`` in its Python workers; a
default-mode editable install hides it behind an import hook, so the development ``.venv`` proves
nothing about what users get. This test builds what users get.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import tomllib

REPO = Path(__file__).resolve().parent.parent
#: What the distribution is built from (pyproject.toml maps the folders into pyspark_rowtime).
SOURCES = [
    "pyproject.toml",
    "README.md",
    "src",
    "bounds",
    "streams",
    "datasource",
    "sink",
    "windows",
    "connectors",
]


def _pip(python: Path, *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=cwd,
    )


def _uv() -> str | None:
    """uv, when this test run has it (the dev extra installs it beside the interpreter)."""
    here = Path(sys.executable).parent / "uv"
    return str(here) if here.is_file() else shutil.which("uv")


def _dependencies(python: Path, *requirements: str) -> subprocess.CompletedProcess[str]:
    """Installs the distributions the project needs (not the project) into the venv.

    With uv where the test run has it, else pip. What this file checks is the project's own
    install, which is always pip's (:func:`_pip`); the dependencies are the same distributions
    either way. uv takes them from its cache, which ``./dev`` filled when it built ``.venv``
    with the same requirements (and the pyspark wheel ``./dev`` built, in its wheels folder):
    measured here, 1.4 s and 0.3 CPU-s where pip took 20.7 s and 18.9 CPU-s (pip unpacks
    pyspark's 400 MB again and compiles the bytecode of everything it installs).
    """
    uv = _uv()
    if uv is not None:
        cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
        wheels = cache / "pyspark-rowtime" / "wheels"
        got = subprocess.run(
            [uv, "pip", "install", "-q", "--python", str(python), "--find-links", str(wheels),
             *requirements],
            capture_output=True, text=True, timeout=900,
        )  # fmt: skip
        if got.returncode == 0:
            return got
    return _pip(python, *requirements)


def _env(python: Path) -> dict[str, str]:
    """The environment of a user's shell with the venv active: none of the test run's
    PYTHON* settings (PYTHONSAFEPATH would hide what this checks), Spark on the venv's python."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK"))}
    env.update(
        PATH=f"{python.parent}{os.pathsep}{env.get('PATH', '')}",
        PYSPARK_PYTHON=str(python),
        PYSPARK_DRIVER_PYTHON=str(python),
    )
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with pyspark-rowtime installed from this repository, the normal way; its
    python."""
    root = tmp_path_factory.mktemp("install")
    # Build from a copy of the working tree: an in-place build writes build/ and *.egg-info into
    # the checkout that others share while they work.
    src = root / "src"
    src.mkdir()
    for name in SOURCES:
        path = REPO / name
        if path.is_dir():
            shutil.copytree(path, src / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(path, src / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    python = venv / "bin" / "python"

    # The dependencies (and the build backend) come from uv's or pip's cache or the network.
    # If neither can get them here, there is nothing this test can check: skip, saying why.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    deps = pyproject["project"]["dependencies"] + pyproject["build-system"]["requires"]
    got = _dependencies(python, *deps)
    if got.returncode != 0:
        pytest.skip(
            "pip cannot install the dependencies in a fresh venv here (no network, index or "
            f"cache?), so the README's install cannot be tried: {got.stderr.strip()[-800:]}"
        )
    # The project itself: a normal install, exactly the wheel users get. Any failure here is
    # ours (packaging), never the network's: it must fail the test.
    built = _pip(python, "--no-deps", "--no-build-isolation", str(src))
    assert built.returncode == 0, built.stderr[-4000:]
    return python


#: Runs in the fresh venv, in a folder that holds no source: argv = site-packages. What Spark's
#: Python workers need to find ``DefaultSource`` by name; the shell below then asks Spark for
#: ``format("rowtime")`` itself (one Spark start for the file: each costs some 30 s here).
CHECK = """
import os, pkgutil, sys

import pyspark_rowtime
import pyspark_rowtime.datasource.spark as spark_module

site = os.path.realpath(sys.argv[1])
for module in (pyspark_rowtime, spark_module):  # real files in site-packages, no hook, no link
    assert os.path.realpath(module.__file__).startswith(site), module.__file__
assert "pyspark_rowtime" in {m.name for m in pkgutil.iter_modules()}
assert hasattr(pyspark_rowtime, "DefaultSource")
print("CHECKED")
"""


def test_a_normal_install_puts_real_files_where_spark_looks_for_data_sources(
    installed: Path, tmp_path: Path
) -> None:
    site = subprocess.run(
        [str(installed), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    proc = subprocess.run(
        [str(installed), "-c", textwrap.dedent(CHECK), site],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=_env(installed),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    assert "CHECKED" in proc.stdout


# -- from the root of a fresh clone ----------------------------------------------------------

#: A tiny test for ``python -m pytest`` in the clone's root: collecting it imports the package.
TINY_TEST = """
import os

import pyspark_rowtime.bounds
from pyspark_rowtime.bounds.time import format_rowtime


def test_the_package_is_the_installed_one():
    here = os.path.realpath(os.getcwd())
    assert not os.path.realpath(pyspark_rowtime.bounds.__file__).startswith(here)
    assert format_rowtime(0) == "1970-01-01T00:00:00Z"
"""

#: Fed to the ``pyspark`` shell on stdin, one statement a line (it reads them as typed). No
#: ``spark.dataSource.register``: Spark finds ``format("rowtime")`` in the install by itself, for
#: a stream (two partitions, aligned: partition 1's rows after partition 0's clock wait) and for
#: a batch read, which gives the same records.
SHELL = """
import os, pyspark_rowtime as rt
print("SHELL FILE " + os.path.realpath(rt.__file__))
location = os.path.join(os.environ["ROWTIME_TEST_WORK"], "shell-stream")
rt.create_stream(location, "id INT", partitions=2)
w = rt.open_writer(location, 0); [w.insert({"id": 7 + s}, rowtime=1000 * s) for s in (0, 1)]
w.close()
w = rt.open_writer(location, 1); [w.insert({"id": 20 + s}, rowtime=1000 * s) for s in (0, 1, 2)]
w.close()
df = spark.readStream.format("rowtime").load(location)
q = df.writeStream.format("memory").queryName("shell_rows").trigger(availableNow=True).start()
q.awaitTermination()
cols = "id", "unix_millis(rowtime) AS ms", "is_bound"
order = "is_bound", "ms", "id"
records = lambda df: [tuple(r) for r in df.selectExpr(*cols).orderBy(*order).collect()]
streamed = records(spark.table("shell_rows"))
history = records(spark.read.format("rowtime").load(location))
print("SHELL ROWS " + repr(streamed))
print("SHELL SAME " + repr(history == streamed))
"""


@pytest.fixture(scope="module")
def clone(installed: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh clone of this repository (its committed tree), installed into the venv the
    README's way: ``pip install .`` in the clone's root."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout (or no git): there is nothing to clone")
    root = tmp_path_factory.mktemp("clone") / "pyspark-rowtime"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(root)], check=True, timeout=300)
    built = _pip(installed, "--no-deps", "--no-build-isolation", ".", cwd=root)
    assert built.returncode == 0, built.stderr[-4000:]
    got = _dependencies(installed, "pytest")
    if got.returncode != 0:
        pytest.skip(f"pip cannot install pytest in the fresh venv: {got.stderr.strip()[-800:]}")
    (root / "test_from_the_root.py").write_text(TINY_TEST)
    return root


def test_python_pytest_and_the_pyspark_shell_started_in_the_clones_root_import_the_install(
    installed: Path, clone: Path, tmp_path: Path
) -> None:
    env = _env(installed)
    site = subprocess.run(
        [str(installed), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()

    # python: the checkout's folders do not shadow the install
    check = "import pyspark_rowtime.bounds, pyspark_rowtime; print(pyspark_rowtime.__file__)"
    proc = subprocess.run(
        [str(installed), "-c", check], capture_output=True, text=True, cwd=clone, env=env
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert os.path.realpath(proc.stdout.strip()).startswith(os.path.realpath(site))

    # python -m pytest
    proc = subprocess.run(
        [str(installed), "-m", "pytest", "-q", "test_from_the_root.py"],
        capture_output=True,
        text=True,
        cwd=clone,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "1 passed" in proc.stdout

    # the pyspark shell, fed on stdin (-i: read it as typed lines, with `spark` made ready)
    proc = subprocess.run(
        [str(installed.parent / "pyspark"), "--conf", "spark.ui.enabled=false"],
        input=SHELL,
        capture_output=True,
        text=True,
        cwd=clone,
        env={**env, "PYSPARK_DRIVER_PYTHON_OPTS": "-i", "ROWTIME_TEST_WORK": str(tmp_path)},
        timeout=600,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-6000:]
    assert "Traceback" not in out, out[-6000:]
    shell_file = next(x for x in proc.stdout.splitlines() if "SHELL FILE " in x)
    assert shell_file.split("SHELL FILE ", 1)[1].startswith(os.path.realpath(site))
    # Aligned: the stream clock is partition 0's 1 s, so partition 1's row at 2 s waits; one
    # bound record carries that clock.
    rows = (
        "[(7, 0, False), (20, 0, False), (8, 1000, False), (21, 1000, False), (None, 1000, True)]"
    )
    assert f"SHELL ROWS {rows}" in proc.stdout, out[-6000:]
    assert "SHELL SAME True" in proc.stdout, out[-6000:]
