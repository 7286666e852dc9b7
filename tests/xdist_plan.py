"""How ``./dev test`` spreads the tests over pytest-xdist workers (``ROWTIME_WORKERS=N``).

A scheduler of our own (``pytest_xdist_make_scheduler``, a public xdist hook; both conftests
return it): xdist's ``--dist loadgroup`` reads ``xdist_group`` marks by rewriting a private
attribute that pytest 9 no longer has, so its groups silently did nothing here. Ours groups by
the node id alone, which the controller has:

* the integration files whose tests start processes of their own (a child Spark driver killed
  again and again, a ``local-cluster``, the soaks, venvs: ``OWN_PROCESSES``) are one unit, run
  on one worker one after the other, so that at most one child Spark runs beside the other
  worker's session; they are handed out first, being the longest unit;
* every other file is a unit of its own (module-scoped fixtures are built once, as in one
  process), the Spark ones before the pure Python ones (``tests/``), so that the tail of the
  run is made of short tests that even out the workers.

Without xdist (``ROWTIME_WORKERS=0``) only the order changes.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

#: The integration files whose tests start Spark processes (or venvs) of their own.
OWN_PROCESSES = {
    "integration/test_sink_kill.py",
    "integration/test_soak.py",
    "integration/test_executor_lost.py",
    "integration/test_reader_processes.py",
    "integration/test_install.py",
    "integration/test_driver_memory.py",
    "integration/test_faults_spark.py",
    "integration/test_lost_replies_spark.py",
    "integration/test_table_kill_spark.py",
}
OWN_PROCESSES_UNIT = "own-processes"


def _file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def unit_of(nodeid: str) -> str:
    """The scheduling unit of a test: its file, or one unit for every OWN_PROCESSES file."""
    path = _file_of(nodeid)
    return OWN_PROCESSES_UNIT if path in OWN_PROCESSES else path


#: The OWN_PROCESSES file run first: it builds venvs and starts the Spark of a fresh install,
#: which the test JVMs' class-data archive (integration/jvm_archive.py, dumped in the
#: background as the run starts) cannot serve anyway; the child Sparks after it find the
#: archive ready.
OWN_PROCESSES_FIRST = "integration/test_install.py"


def case_has_part(case: str, wanted: str) -> bool:
    """Whether a parametrized case's id (``redis-sec-1``) has ``wanted`` (``redis``, or
    ``delta-az``) as a run of its ``-``-separated parts: ``s3`` is in ``s3-sec-1`` and
    ``delta-s3``, not in ``s3x``; ``integration/conftest.py``'s ``long_cases`` mark uses it."""
    parts, want = case.split("-"), wanted.split("-")
    return any(parts[i : i + len(want)] == want for i in range(len(parts) - len(want) + 1))


def _rank(item: pytest.Item) -> int:
    path = _file_of(item.nodeid)
    if path == OWN_PROCESSES_FIRST:
        return -1
    if path in OWN_PROCESSES:
        return 0
    return 1 if path.startswith("integration/") else 2


def plan(items: list[pytest.Item]) -> None:
    """The order: a stable sort keeps each file's own order (and its parameters')."""
    items.sort(key=_rank)


def make_scheduler(config: Any, log: Any) -> Any:
    """xdist's file scheduling (``loadscope``) with :func:`unit_of` as the scope, in collection
    order (no reordering by size: :func:`plan` put the longest unit first)."""
    from xdist.scheduler import LoadScopeScheduling

    class Scheduler(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return unit_of(nodeid)

    config.option.loadscopereorder = False
    return Scheduler(config, log)


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def tree_cpu_s(root: int) -> float | None:
    """The CPU seconds (user and system) of process ``root`` and every live process below it,
    each with its waited-for children's (a JVM's reaped Python workers, a finished subprocess):
    what a test run by ``root`` cost the machine, its Spark, workers, children and servers
    included. None where there is no ``/proc``."""
    parents: dict[int, int] = {}
    times: dict[int, int] = {}
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        pid = int(name)
        parents[pid] = int(fields[1])
        times[pid] = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime
    if root not in times:
        return None
    children: dict[int, list[int]] = {}
    for pid, ppid in parents.items():
        children.setdefault(ppid, []).append(pid)
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        total += times.get(pid, 0)
        todo.extend(children.get(pid, ()))
    return total / _TICKS


class TreeCpu:
    """On each xdist worker (:func:`register_worker_times`; without xdist nothing prints the
    figures): the CPU seconds each test cost, kept in its teardown report's ``user_properties``
    as ``("cpu_s", seconds)`` for :class:`WorkerTimes`. A server a session fixture started stays
    below the worker, so what it spends is charged to the tests that run while it serves. On a
    machine whose cores are all busy (CI's two, with two workers), a test's CPU seconds, not its
    wall seconds, are what it adds to the run: a test waiting on a timeout lets the other worker
    go faster. What it misses: a process whose
    parent died first (the JVM of a child driver the test SIGKILLed with its process group, the
    Python workers of a Spark that stopped) is no longer below the worker when it ends, so the
    tests that kill processes (``OWN_PROCESSES``) show less than they cost."""

    name = "rowtime-tree-cpu"

    def __init__(self) -> None:
        self.start: float | None = None

    @pytest.hookimpl(tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> None:
        self.start = tree_cpu_s(os.getpid())

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_teardown(self, item: pytest.Item, nextitem: Any) -> Iterator[None]:
        try:
            return (yield)
        finally:
            end = tree_cpu_s(os.getpid())
            if self.start is not None and end is not None:
                item.user_properties.append(("cpu_s", round(end - self.start, 2)))
            self.start = None


class WorkerTimes:
    """On xdist's controller: the seconds each worker spent in each unit (setup, call and
    teardown), printed at the end, so that CI's log shows whether the workers were even."""

    name = "rowtime-worker-times"

    def __init__(self) -> None:
        self.seconds: dict[str, dict[str, float]] = {}
        #: Seconds per file, whatever its unit: the own-processes unit's files one by one.
        self.files: dict[str, float] = {}
        #: CPU seconds per file and per test (:class:`TreeCpu`, measured on the workers).
        self.cpu: dict[str, float] = {}
        self.cpu_by_test: dict[str, float] = {}

    @pytest.hookimpl
    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        node = getattr(report, "node", None)
        worker = getattr(getattr(node, "gateway", None), "id", None)
        if worker is None:
            return
        units = self.seconds.setdefault(worker, {})
        unit = unit_of(report.nodeid)
        units[unit] = units.get(unit, 0.0) + report.duration
        path = _file_of(report.nodeid)
        self.files[path] = self.files.get(path, 0.0) + report.duration
        cpu = dict(report.user_properties).get("cpu_s") if report.when == "teardown" else None
        if isinstance(cpu, (int, float)):
            self.cpu[path] = self.cpu.get(path, 0.0) + cpu
            self.cpu_by_test[report.nodeid] = cpu

    @pytest.hookimpl
    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.seconds:
            return
        terminalreporter.section("minutes of test time per xdist worker (tests/xdist_plan.py)")
        for worker, units in sorted(self.seconds.items()):
            top = sorted(units.items(), key=lambda kv: -kv[1])[:4]
            parts = ", ".join(f"{unit} {s / 60:.1f}" for unit, s in top)
            terminalreporter.write_line(
                f"{worker}: {sum(units.values()) / 60:.1f} min in {len(units)} units ({parts}, ...)"
            )
        # Every file of a tenth of a minute or more, the slowest first: where CI's minutes go
        # when a pass is to be made shorter, without a run of its own to find out.
        heavy = sorted(((s, f) for f, s in self.files.items() if s >= 6), reverse=True)
        if heavy:
            own = {f for f in self.files if unit_of(f) == OWN_PROCESSES_UNIT}
            terminalreporter.write_line(
                "files, minutes (* own-processes): "
                + ", ".join(f"{f}{'*' if f in own else ''} {s / 60:.1f}" for s, f in heavy)
            )
        # What each file and the costliest tests cost the machine (TreeCpu): the figures to cut
        # when CI's cores are saturated, as they are with two workers on two cores.
        if self.cpu:
            total = sum(self.cpu.values())
            costly = sorted(((s, f) for f, s in self.cpu.items() if s >= 6), reverse=True)
            terminalreporter.write_line(
                f"CPU minutes of the tests' process trees: {total / 60:.1f}; files: "
                + ", ".join(f"{f} {s / 60:.1f}" for s, f in costly)
            )
            top = sorted(self.cpu_by_test.items(), key=lambda kv: -kv[1])[:25]
            terminalreporter.write_line(
                "tests, CPU seconds: " + ", ".join(f"{t} {s:.0f}" for t, s in top)
            )


def register_worker_times(config: pytest.Config) -> None:
    """Both conftests call this: :class:`WorkerTimes` once, on the controller; :class:`TreeCpu`
    on each xdist worker."""
    if hasattr(config, "workerinput"):
        if not config.pluginmanager.has_plugin(TreeCpu.name):
            config.pluginmanager.register(TreeCpu(), TreeCpu.name)
        return
    if not config.pluginmanager.has_plugin(WorkerTimes.name):
        config.pluginmanager.register(WorkerTimes(), WorkerTimes.name)
