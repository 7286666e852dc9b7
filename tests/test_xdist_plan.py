"""The xdist units of ``./dev test`` (tests/xdist_plan.py): the tests that start Spark processes
of their own share one worker, the other files are units of their own."""

from __future__ import annotations

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
