"""Hypothesis profiles: ``ci`` on CI (500 generated streams per property; each run draws new
ones), ``thorough`` in ``./dev long`` (2,000: the properties' whole suite takes about 8 minutes
on 2 cores, 3 of them in the four idle-planning properties), quick while developing.
HYPOTHESIS_PROFILE=thorough|ci|quick overrides the choice."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "thorough", max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "ci", max_examples=500, deadline=None, suppress_health_check=[HealthCheck.too_slow]
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
