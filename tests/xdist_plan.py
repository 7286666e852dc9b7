"""How ``./dev test`` spreads the tests over pytest-xdist workers (``-n 2 --dist loadgroup``).

Both conftests call :func:`plan` from ``pytest_collection_modifyitems`` (it is idempotent), so a
new test file is picked up with no list to keep:

* a test whose fixtures include one of module or class scope (a child ``local-cluster`` run
  shared by several tests, a venv built once, a server per module) runs on the same worker as
  the other tests of its file, so that fixture is built once, as in one process;
* the integration tests that do not take the session's ``spark`` fixture start processes of
  their own (a child Spark driver killed again and again, a ``local-cluster``, the soaks, a
  venv): they run together on one worker, one after the other, so that at most one child Spark
  runs beside the other worker's session, and they are handed out first (they are the longest
  unit, about half of the integration tests' time);
* then the other tests that use Spark (``integration/``), and the pure Python ones (``tests/``)
  last: the long Spark tests start early, and the tail of the run is made of short tests that
  even out the two workers.

Without xdist (``-p no:xdist``, ``-n 0``) the group marks are inert and the order is the only
change.
"""

from __future__ import annotations

import pytest

_SHARED_SCOPES = {"module", "class", "package"}


def _shares_a_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(defs and defs[-1].scope in _SHARED_SCOPES for defs in info.name2fixturedefs.values())


def _file_of(item: pytest.Item) -> str:
    return item.nodeid.split("::", 1)[0]


#: The group of the integration tests that start processes of their own.
OWN_PROCESSES = "own-processes"


def _own_processes(item: pytest.Item) -> bool:
    return _file_of(item).startswith("integration/") and "spark" not in getattr(
        item, "fixturenames", ()
    )


def _rank(item: pytest.Item) -> int:
    if _own_processes(item):
        return 0
    return 1 if _file_of(item).startswith("integration/") else 2


def plan(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        if _own_processes(item):
            item.add_marker(pytest.mark.xdist_group(OWN_PROCESSES))
        elif _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(_file_of(item)))
    # A stable sort keeps each file's own order (and its parameters' order).
    items.sort(key=_rank)
