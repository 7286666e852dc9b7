"""The xdist units of ``./dev test`` (tests/xdist_plan.py): the tests that start Spark processes
of their own share one worker, the other files are units of their own."""

from __future__ import annotations

import os
import time
from pathlib import Path

from xdist_plan import OWN_PROCESSES, OWN_PROCESSES_UNIT, case_has_part, unit_of

ROOT = Path(__file__).resolve().parent.parent


def test_every_own_processes_file_exists_and_starts_processes() -> None:
    for path in OWN_PROCESSES:
        text = (ROOT / path).read_text()
        starts = ("subprocess", "run_in_local_cluster", "start_child_spark")
        assert any(name in text for name in starts), path


def test_the_own_processes_files_are_one_unit_and_the_others_their_file() -> None:
    units = {unit_of(f"{path}::test_x[p]") for path in OWN_PROCESSES}
    assert units == {OWN_PROCESSES_UNIT}
    assert unit_of("integration/test_sink.py::test_y[stream]") == "integration/test_sink.py"
    assert unit_of("tests/test_log.py::TestA::test_b") == "tests/test_log.py"


def test_a_long_case_is_a_run_of_the_parts_of_the_case_id() -> None:
    assert case_has_part("redis", "redis") and case_has_part("redis-sec-1", "redis")
    assert case_has_part("delta-s3", "s3") and case_has_part("delta-az", "delta-az")
    assert not case_has_part("s3x", "s3") and not case_has_part("iceberg-az", "delta-az")
    assert not case_has_part("az", "delta-az") and not case_has_part("log-sec-1", "sec-0")


def test_a_tests_cpu_counts_the_processes_it_started_alive_and_reaped() -> None:
    """tree_cpu_s charges a test with what its children spent: a child still running, and one
    that ended and was waited for (its seconds move into this process's children's times)."""
    import subprocess
    import sys

    from xdist_plan import tree_cpu_s

    spin = "import time\nt = time.process_time()\nwhile time.process_time() - t < 0.4: pass\n"
    before = tree_cpu_s(os.getpid())
    assert before is not None
    alive = subprocess.Popen([sys.executable, "-c", spin + "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)  # fmt: skip
    try:
        deadline = time.monotonic() + 30
        while (tree_cpu_s(os.getpid()) or 0) - before < 0.35:  # the child's spin, seen live
            assert time.monotonic() < deadline, "the running child's CPU was never counted"
            time.sleep(0.05)
    finally:
        alive.communicate(b"")
    middle = tree_cpu_s(os.getpid())
    subprocess.run([sys.executable, "-c", spin], check=True)
    after = tree_cpu_s(os.getpid())
    assert middle is not None and after is not None
    assert after - middle >= 0.35  # the reaped child's spin
    assert tree_cpu_s(2**22 + 1) is None  # no such process: nothing to charge


def test_ci_collects_no_long_case_and_dev_long_collects_them_all() -> None:
    """The ``long_cases`` mark as pytest applies it (integration/conftest.py): CI's collection
    leaves out a test marked without ids and the marked cases of one marked with ids, and keeps
    the other cases; ``ROWTIME_LONG=1`` (``./dev long``) collects every one."""
    import subprocess
    import sys

    root = Path(__file__).parent.parent
    files = ["integration/test_sink.py", "integration/test_reader.py"]

    def collected(long: bool) -> set[str]:
        env = {
            k: v for k, v in os.environ.items() if k not in ("ROWTIME_LONG", "ROWTIME_SPARK_MODE")
        }
        if long:
            env["ROWTIME_LONG"] = "1"
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
             *files],
            cwd=root, env=env, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        return {line for line in done.stdout.splitlines() if "::" in line}

    ci, long = collected(False), collected(True)
    whole = (
        "integration/test_sink.py::"
        "test_in_local_cluster_executors_stage_segments_and_the_driver_links_them"
    )
    skewed = (
        "integration/test_reader.py::"
        "test_every_micro_batch_keeps_the_spec_7_invariants_with_skewed_partitions"
    )
    assert whole in long and whole not in ci
    assert {f"{skewed}[{b}]" for b in ("log", "redis", "s3")} <= long
    assert f"{skewed}[log]" in ci
    assert not {f"{skewed}[redis]", f"{skewed}[s3]"} & ci
    assert ci < long
