"""Option tables: how the reader and the sink read Spark's string options, in one place.

Spark hands a data source (and a sink) its options as strings in a case-insensitive map. Each
side lists every option it accepts in an ``OptionTable`` (lower-case name -> what it
accepts, in words); ``OptionTable.lower`` turns Spark's map into lower-case names and
refuses any unknown one, naming it and listing the known ones, so that a typo never silently
falls back to a default. Errors spell option names as users write them (``maxRowsPerBatch``).

Lives below both ``datasource/`` and ``sink/`` (neither imports the other).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ..bounds.errors import OptionError

__all__ = ["SPARK_OWN_OPTIONS", "OptionTable"]

#: Options Spark itself may add to the map; every side accepts and ignores them (unless it
#: lists one of them as its own, as the sink does with ``checkpointLocation``).
SPARK_OWN_OPTIONS = frozenset({"checkpointlocation", "queryname", "__path"})


@dataclass(frozen=True)
class OptionTable:
    """The options one side accepts.

    ``accepts``: lower-case name -> what it accepts; ``spelling``: lower-case name -> how users
    write it, where that differs; ``where``: the call the options are for, in errors (e.g.
    ``"writeStream.format('rowtime')"``); ``who``: the side, in errors (``"the sink"``).
    """

    accepts: Mapping[str, str]
    where: str
    who: str
    spelling: Mapping[str, str] = field(default_factory=dict)

    def spelled(self, name: str) -> str:
        """``name`` as users write it."""
        return self.spelling.get(name, name)

    def bad(self, name: str, value: Any) -> OptionError:
        """The error for a value ``name`` does not accept, saying what it accepts."""
        shown = self.spelled(name)
        return OptionError(
            f"option {shown}={value!r} is not valid for {self.where}: {shown} accepts "
            f"{self.accepts[name]}"
        )

    def lower(self, options: Mapping[str, Any]) -> dict[str, str]:
        """The options with lower-case names and string values; Spark's own options that this
        side does not list are dropped; unknown names are one error naming every one."""
        out: dict[str, str] = {}
        unknown = []
        for key, value in options.items():
            k = str(key).lower()
            if k in self.accepts:
                out[k] = str(value)
            elif k not in SPARK_OWN_OPTIONS:
                unknown.append(str(key))
        if unknown:
            known = ", ".join(self.spelled(n) for n in self.accepts)
            raise OptionError(
                f"unknown option{'s' if len(unknown) > 1 else ''} "
                f"{', '.join(map(repr, unknown))} for {self.where}; {self.who} accepts: {known}"
            )
        return out
