"""A class-data archive (JDK CDS) for the test runs' Spark JVMs, so that each of the few dozen
JVMs a run starts maps Spark's classes instead of loading, parsing and verifying them again.

Measured here (2 cores, JDK 17, Spark 4.3, ``TEST_JVM_OPTIONS``): a driver JVM that starts,
runs a batch query and a rowtime stream query to quiescence and stops took 11.7 to 12.5 s of
CPU without the archive and 5.5 to 6.6 s with it (wall 20-21 s -> 13-16 s). Nothing Spark
computes depends on it: the JVM checks that the archive was dumped from the same JDK and the
same class path, and loads classes the usual way when it was not.

``integration/conftest.py`` calls :func:`ensure_archive` in pytest's controller process before
any Spark starts (and before xdist's workers, which inherit ``ROWTIME_JVM_ARCHIVE``); the
archive is dumped once per JDK and Spark installation, by one JVM that runs a representative
workload (about 30 s), into ``~/.cache/pyspark-rowtime/jvm-archive`` (``ROWTIME_JVM_ARCHIVE_DIR``
overrides). ``ROWTIME_JVM_ARCHIVE=0`` turns it off. ``helpers.jvm_options`` adds it to
every JVM the tests start through ``helpers.spark_builder`` and ``helpers.connect_server``.

Run as a script (``python integration/jvm_archive.py --dump PATH``), it is that workload.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: The environment variable that carries the archive's path to the test processes (and that
#: turns it off when 0).
ENV = "ROWTIME_JVM_ARCHIVE"


def archive_dir() -> Path:
    default = Path.home() / ".cache" / "pyspark-rowtime" / "jvm-archive"
    return Path(os.environ.get("ROWTIME_JVM_ARCHIVE_DIR", default))


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else "java"


def archive_key() -> str:
    """What the archive depends on: the JDK (its version text and binary) and each jar of
    Spark's class path (name, size, time), as the JVM checks them."""
    from pyspark.find_spark_home import _find_spark_home

    h = hashlib.sha256()
    java = _java()
    version = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=60)
    h.update(version.stderr.encode())
    jars = Path(_find_spark_home()) / "jars"
    for jar in sorted(jars.iterdir()):
        st = jar.stat()
        h.update(f"{jar}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:20]


def ensure_archive(wait: bool = True) -> Path | None:
    """The archive for this JDK and Spark, dumped first when there is none, and its path set
    in ``ROWTIME_JVM_ARCHIVE`` for this process and the ones it starts; None when turned off.
    With ``wait=False`` the dump runs in the background and the path is set at once: a JVM
    started before the archive is whole goes without (``helpers.jvm_options`` checks)."""
    if os.environ.get(ENV) == "0":
        return None
    given = os.environ.get(ENV)
    if given and Path(given).is_file():
        return Path(given)
    import pyspark

    if tuple(int(p) for p in pyspark.__version__.split(".")[:2]) < (4, 1):
        return None  # format rowtime is refused there: nothing to archive
    try:
        from pyspark.find_spark_home import _find_spark_home

        # one archive per Spark installation (a clone's venv): the name says which, the key
        # whether it changed since
        home = hashlib.sha256(os.path.realpath(_find_spark_home()).encode()).hexdigest()[:8]
        name = f"spark-{pyspark.__version__}-{home}"
        path = archive_dir() / f"{name}-{archive_key()}.jsa"
    except (OSError, subprocess.SubprocessError) as e:
        print(f"jvm_archive: no archive ({e})", file=sys.stderr)
        return None
    os.environ[ENV] = str(path)
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    for stale in path.parent.glob(f"{name}-*"):
        stale.unlink(missing_ok=True)  # of this Spark as it was before (~170 MB), a log, a .tmp
    cmd = [sys.executable, __file__, "--dump", str(path)]
    if not wait:
        log = open(path.with_suffix(".log"), "w")
        subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        return path
    start = time.monotonic()
    with tempfile.TemporaryFile("w+") as log:  # not a pipe: Spark's children hold it
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, text=True, timeout=600)
        if proc.returncode != 0 or not path.is_file():
            log.seek(0)
            print(
                f"jvm_archive: dumping the archive failed (exit {proc.returncode}); the tests "
                f"run without it:\n{log.read()[-4000:]}",
                file=sys.stderr,
            )
            return None
    print(f"jvm_archive: {path} dumped in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return path


def _dump(out: str) -> None:
    """Start Spark with the archive dumped at its JVM's exit, and run what the tests run: a
    batch query, the rowtime reader into a windowed count through ``foreachBatch``, and the
    sink into a Parquet target. (A class the archive lacks loads the usual way.)"""
    sys.path.insert(0, str(Path(__file__).parent))
    from helpers import jvm_options, spark_builder
    from pyspark.sql import functions as F

    import pyspark_rowtime as pr

    # The JVM writes the archive under another name; this process renames it into place once
    # the JVM has exited, so the JVMs that look for it meanwhile find it whole or not at all.
    tmp = f"{out}.{os.getpid()}.tmp"
    options = f"{jvm_options(archive=False)} -XX:ArchiveClassesAtExit={tmp}"
    spark = spark_builder().config("spark.driver.extraJavaOptions", options).getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    spark.range(10_000).groupBy((F.col("id") % 7).alias("k")).count().collect()
    work = Path(tempfile.mkdtemp(prefix="rowtime-jvm-archive-"))
    src = str(work / "src")
    pr.create_stream(src, "id BIGINT, k STRING", partitions=2)
    with pr.open_writer(src) as w:
        for i in range(500):
            w.insert({"id": i, "k": f"k{i % 3}"}, rowtime=1_700_000_000_000 + i * 1_000)
        w.set_rowtime_bound(1_700_000_000_000 + 500 * 1_000)
    df = spark.readStream.format("rowtime").load(src)
    seen: list[int] = []
    counts = pr.with_watermark(df).groupBy(F.window("rowtime", "1 minute"), "k").count()
    q = (
        counts.writeStream.outputMode("append")
        .foreachBatch(lambda batch, _id: seen.append(batch.count()))
        .option("checkpointLocation", str(work / "ck-count"))
        .trigger(availableNow=True)
        .start()
    )
    q.awaitTermination()
    q = (
        df.writeStream.format("rowtime")
        .option("target", "parquet")
        .option("checkpointLocation", str(work / "ck-parquet"))
        .trigger(availableNow=True)
        .start(str(work / "out-parquet"))
    )
    q.awaitTermination()
    jvm = spark.sparkContext._gateway.proc  # spark-submit, exec'd into the JVM
    spark.stop()
    jvm.stdin.close()  # the JVM exits when its stdin closes, and writes the archive then
    if jvm.wait(timeout=300) != 0 or not os.path.isfile(tmp):
        sys.exit(f"the JVM exited with {jvm.returncode}, archive written: {os.path.isfile(tmp)}")
    os.replace(tmp, out)


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "--dump":
        sys.exit("usage: jvm_archive.py --dump PATH")
    _dump(sys.argv[2])
