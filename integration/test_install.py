"""The README's install, for real: a fresh virtual environment, a normal (non-editable)
``pip install`` of this repository, and a new Python process in which Spark finds
``format("rowtime")`` by name, with no ``spark.dataSource.register``.

Spark finds a Python data source by itself only when a top-level ``pyspark_*`` module exposing
``DefaultSource`` is visible to ``pkgutil.iter_modules()`` in its Python workers; a
default-mode editable install hides it behind an import hook, so the development ``.venv`` proves
nothing about what users get. This test builds what users get.
"""

from __future__ import annotations

import json
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
    "pyspark_rowtime",
    "bounds",
    "streams",
    "datasource",
    "sink",
    "windows",
]


def _pip(python: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=900,
    )


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

    # The dependencies (and the build backend) come from the network or pip's cache. If pip
    # cannot get them here, there is nothing this test can check: skip, saying why.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    deps = pyproject["project"]["dependencies"] + pyproject["build-system"]["requires"]
    got = _pip(python, *deps)
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


#: Runs in the fresh venv, in a folder that holds no source: argv = site-packages, workdir.
CHECK = """
import json, os, pkgutil, sys

import pyspark_rowtime
import pyspark_rowtime.datasource.spark as spark_module

site, workdir = os.path.realpath(sys.argv[1]), sys.argv[2]
for module in (pyspark_rowtime, spark_module):  # real files in site-packages, no hook, no link
    assert os.path.realpath(module.__file__).startswith(site), module.__file__
assert "pyspark_rowtime" in {m.name for m in pkgutil.iter_modules()}

from datetime import datetime, timedelta, timezone
from pyspark.sql import SparkSession

location = os.path.join(workdir, "orders")
pyspark_rowtime.create_stream(location, "id INT, name STRING", partitions=2)
t0 = datetime(2024, 1, 1, tzinfo=timezone.utc)
for p, seconds in ((0, (1, 2, 3)), (1, (1, 2, 4, 5, 6))):  # partition 1 runs ahead
    with pyspark_rowtime.open_writer(location, p) as w:
        for s in seconds:
            w.insert({"id": 10 * p + s, "name": f"p{p}"}, rowtime=t0 + timedelta(seconds=s))

spark = (
    SparkSession.builder.master("local[2]")
    .config("spark.ui.enabled", "false")
    .config("spark.sql.shuffle.partitions", "2")
    .getOrCreate()
)
spark.sparkContext.setLogLevel("ERROR")


def records(df):
    return [
        [r.id, r.name, r.us, r.is_bound]
        for r in df.selectExpr("id", "name", "unix_micros(rowtime) AS us", "is_bound").collect()
    ]


streamed = []
q = (
    spark.readStream.format("rowtime").load(location)
    .writeStream.foreachBatch(lambda df, batch_id: streamed.extend(records(df)))
    .option("checkpointLocation", os.path.join(workdir, "checkpoint"))
    .trigger(availableNow=True)
    .start()
)
q.awaitTermination()
history = records(spark.read.format("rowtime").load(location))
print("RESULT " + json.dumps({"streamed": streamed, "history": history}))
spark.stop()
"""


def test_a_normal_install_lets_spark_find_format_rowtime_by_name(
    installed: Path, tmp_path: Path
) -> None:
    site = subprocess.run(
        [str(installed), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYSPARK"))}
    env.update(PYSPARK_PYTHON=str(installed), PYSPARK_DRIVER_PYTHON=str(installed))
    proc = subprocess.run(
        [str(installed), "-c", textwrap.dedent(CHECK), site, str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-6000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT ") :])

    t0 = 1_704_067_200_000_000
    # Aligned: the stream clock is partition 0's 3 s, so partition 1's rows after it wait.
    rows = sorted(r[:3] for r in result["streamed"] if not r[3])
    assert rows == [
        [1, "p0", t0 + 1_000_000],
        [2, "p0", t0 + 2_000_000],
        [3, "p0", t0 + 3_000_000],
        [11, "p1", t0 + 1_000_000],
        [12, "p1", t0 + 2_000_000],
    ]
    assert [r for r in result["streamed"] if r[3]] == [[None, None, t0 + 3_000_000, True]]
    # The batch read returns the history under the same rules: the same records.
    assert result["history"] == result["streamed"]
