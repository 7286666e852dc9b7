"""Stored formats across releases (SPEC 12; docs/operations/upgrades.md).

Everything this project stores says which version of its format wrote it: a stream's metadata
(``format_version``), each segment's footer (``rowtime.format_version``), a reader's offset
(``v``), a sink target's description (``format_version``) and each stream target's manifest
entry (``format``), and the state of ``time_interval_aggregate``, ``overlap_join`` and
``interval_aggregate`` in Spark's state store (a bare list is version 1; ``{"v": n, "state":
...}`` wraps the others: ``interval_aggregate``, whose state is a dict, always, reading its
first, bare dict as well).
A release reads every version an earlier release of the same major version wrote; a version
above what it reads is refused by ``newer_format``'s error, which names the version found,
the highest this code reads and the installed pyspark-rowtime, so that whoever sees it knows
that the fix is an upgrade, not a repair. Nothing is changed when a format is refused.
"""

from __future__ import annotations

from importlib import metadata
from typing import TypeVar

from .errors import RowtimeError

E = TypeVar("E", bound=RowtimeError)


def installed_version() -> str:
    """The version of the installed pyspark-rowtime, from its package metadata (the same as
    ``pyspark_rowtime.__version__``, which this layer may not import)."""
    try:
        return metadata.version("pyspark-rowtime")
    except metadata.PackageNotFoundError:  # run from a source tree that was never installed
        return "(not installed)"


def newer_format(what: str, found: object, highest: int, error: type[E]) -> E:
    """The error for ``what`` (a file, a key, an offset...) stored in format version ``found``,
    above ``highest``, the last version this code reads."""
    return error(
        f"{what} is in format version {found}, written by a newer pyspark-rowtime: "
        f"pyspark-rowtime {installed_version()} reads format versions up to {highest}: "
        "upgrade pyspark-rowtime on every machine that reads or writes it (nothing was changed)"
    )
