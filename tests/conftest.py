"""Hypothesis profiles: ``ci`` on CI (100 generated streams per property, Hypothesis's own
default; each run draws new ones, so the stops add up), ``thorough`` in ``./dev long`` (2,000:
the properties' whole suite takes about 8 minutes on 2 cores, 3 of them in the four
idle-planning properties), quick while developing (200, without the health check CI's loaded
machines trip). CI drew 500, then 200, until its minutes went over their budget (.ci/run says
what that cost). HYPOTHESIS_PROFILE=thorough|ci|quick overrides the choice."""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("quick", max_examples=200, deadline=None)
settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE", "ci" if os.environ.get("CI") else "quick")
)

# Object storage servers (moto's S3, Azurite) for the tests that take them.
from objstore_servers import az_server, object_server, s3_server  # noqa: E402, F401


def pytest_configure(config: pytest.Config) -> None:
    """Each xdist worker's minutes at the end of the run (tests/xdist_plan.py)."""
    from xdist_plan import register_worker_times

    register_worker_times(config)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """``./dev test``'s xdist scheduling (tests/xdist_plan.py)."""
    from xdist_plan import make_scheduler

    return make_scheduler(config, log)


def pytest_collection_modifyitems(config: object, items: list) -> None:  # type: ignore[type-arg]
    """The order and the worker groups of ``./dev test``'s xdist run (tests/xdist_plan.py)."""
    from xdist_plan import plan

    plan(items)


#: Line coverage (``./dev test``'s figure) traces the first this many examples of each property
#: and runs the rest untraced. Coverage.py's tracer costs the properties about 0.75x of their
#: time (``dev``: coverage_args), and a property's later examples run the lines its first ones
#: ran: the figure is the same, its price a fraction. Pausing can only lose a line (one that
#: only a later example reaches), never count one that did not run. 0 traces every example.
#: Measured in docs/benchmarks.md ("The test suite and CI").
TRACED_EXAMPLES = int(os.environ.get("ROWTIME_TRACED_EXAMPLES", "100"))


def _coverage() -> Any:
    """The Coverage that pytest-cov started in this process (coverage 5.0+), or None."""
    coverage = sys.modules.get("coverage")  # not imported: nothing measures this run
    return None if coverage is None else coverage.Coverage.current()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    """Pause line coverage after a property's first :data:`TRACED_EXAMPLES` examples, through
    Hypothesis's public hook for wrapping each example (``test.hypothesis.inner_test``)."""
    handle = getattr(getattr(item, "obj", None), "hypothesis", None)
    cov = _coverage() if handle is not None and TRACED_EXAMPLES > 0 else None
    if cov is None:
        return (yield)
    inner = handle.inner_test
    seen = 0
    paused = False

    @functools.wraps(inner)
    def first_traced(*args: Any, **kwargs: Any) -> Any:
        nonlocal seen, paused
        seen += 1
        if seen > TRACED_EXAMPLES and not paused:
            cov.stop()
            paused = True
        return inner(*args, **kwargs)

    handle.inner_test = first_traced
    try:
        return (yield)
    finally:
        handle.inner_test = inner
        if paused:
            cov.start()
