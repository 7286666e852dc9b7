"""What the benchmarks share: best-of timing and the Spark session they measure in.

``./dev bench NAME`` puts this folder on PYTHONPATH."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from typing import Any


def write_json(folder: str, name: str, doc: object) -> str:
    """Write ``doc`` as ``folder/name`` (the folder made if absent); returns the path."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, name)
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    return path


def best_of(fn: Callable[[], object], repeat: int = 3) -> float:
    """The fastest of ``repeat`` runs of ``fn``, in seconds."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def spark_session(
    app: str, master: str = "local[2]", jfr: str | None = None, java_options: str = ""
) -> Any:
    """local[2] (or ``master``) with the settings every benchmark uses (UTC, 2 shuffle
    partitions, no UI). ``jfr``: record the JVM with Java Flight Recorder's ``profile``
    settings into that file (written when the session stops; read it with
    ``bench/jfr_summary.py``). In local mode the driver's JVM runs the tasks too.
    ``java_options``: more options for that JVM (``-Dname=value ...``)."""
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    options = java_options
    if jfr is not None:
        options += f" -XX:StartFlightRecording=filename={jfr},settings=profile,dumponexit=true"
    if options.strip():
        builder = builder.config("spark.driver.extraJavaOptions", options.strip())
    spark = (
        builder.master(master)
        .appName(app)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "4g")
        # A Python worker has 15 s to connect back by default; with the machine's load above
        # 20 (other jobs) that failed queries mid-benchmark.
        .config("spark.python.authenticate.socketTimeout", "120s")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    return spark
