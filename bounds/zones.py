"""Time zones: reading naive wall-clock times as UTC microseconds.

A zone ``tz`` is an IANA name such as ``"Europe/Berlin"`` (via ``zoneinfo``), ``"UTC"``, or a
fixed offset such as ``"+05:30"``. In a zone with daylight saving time a wall time that occurs
twice takes the earlier instant, and one that does not exist (skipped by a spring-forward) is read
with the offset in force before the change, so it lands that many hours later (Python's
``fold=0``, Java's ``ZonedDateTime``). The scalar and the array path share these rules exactly.
"""

from __future__ import annotations

import datetime as _dt
import re
from functools import lru_cache
from zoneinfo import ZoneInfo

import numpy as np
import numpy.typing as npt

from .bounds import END_OF_STREAM_US, MIN_ROWTIME_US
from .errors import OptionError, shown
from .units import US_PER_HOUR, US_PER_S

Int64Array = npt.NDArray[np.int64]

ONE_US = _dt.timedelta(microseconds=1)
EPOCH_NAIVE = _dt.datetime(1970, 1, 1)


_FIXED_OFFSET = re.compile(r"(?:UTC|GMT)?([+-])([0-9]{2}):?([0-9]{2})?", re.ASCII)
_UTC_NAMES = frozenset({"UTC", "Z", "GMT", "Etc/UTC", "Etc/GMT", "Etc/Zulu", "Zulu"})


@lru_cache(maxsize=256)
def check_zone(tz: str) -> int | ZoneInfo:
    """A fixed offset in microseconds, or a ZoneInfo for zones with rules."""
    if not isinstance(tz, str):
        raise OptionError(f"tz={shown(tz)} is not a time zone: give a string such as 'UTC'")
    if tz in _UTC_NAMES:
        return 0
    fixed = _FIXED_OFFSET.fullmatch(tz)
    if fixed:
        sign, hours, minutes = fixed.groups()
        if int(hours) > 18 or int(minutes or 0) > 59:
            raise OptionError(f"tz={tz!r} is not a valid offset: offsets run from -18:00 to +18:00")
        off = (int(hours) * 3600 + int(minutes or 0) * 60) * US_PER_S
        return -off if sign == "-" else off
    try:
        return ZoneInfo(tz)
    except (ValueError, OSError, KeyError) as exc:  # ZoneInfoNotFoundError is a KeyError
        raise OptionError(
            f"tz={tz!r} is not a known time zone: use an IANA name such as 'Europe/Berlin', "
            "'UTC', or a fixed offset such as '+05:30'"
        ) from exc


def _wall_offset_us(wall_us: int, zone: ZoneInfo) -> int:
    """The UTC offset (us) that ``zone`` gives a wall time, with ``fold=0``."""
    # Clamp to what datetime can hold; values outside fail the range check afterwards.
    wall_us = min(max(wall_us, MIN_ROWTIME_US), END_OF_STREAM_US)
    wall = EPOCH_NAIVE + _dt.timedelta(microseconds=wall_us)
    off = wall.replace(tzinfo=zone).utcoffset()
    return 0 if off is None else off // ONE_US


def wall_to_utc_scalar(wall_us: int, tz: str) -> int:
    zone = check_zone(tz)
    if isinstance(zone, int):
        return wall_us - zone
    return wall_us - _wall_offset_us(wall_us, zone)


def wall_to_utc_array(wall_us: Int64Array, tz: str) -> Int64Array:
    """Vectorised ``wall_to_utc_scalar``, with exactly the same (``fold=0``) semantics.

    The offset is looked up once per distinct wall-clock hour present, with zoneinfo itself, so
    the result cannot drift from the scalar path (Arrow's own time zone code stops applying
    daylight saving time after 2037 with slim tz databases). Inside an hour where the offset
    changes, the switching point is found by bisection. Assumes at most one change per hour.
    """
    zone = check_zone(tz)
    if isinstance(zone, int):
        return wall_us - zone
    if wall_us.size == 0:
        return wall_us.copy()
    hours = wall_us // US_PER_HOUR
    lo, hi = int(hours.min()), int(hours.max())
    if hi - lo <= 4 * hours.size + 1024:
        # Dense table over the span: O(n) instead of sorting.
        present = np.zeros(hi - lo + 1, dtype=bool)
        present[hours - lo] = True
        unique = np.flatnonzero(present) + lo
        slot = np.full(hi - lo + 1, -1, dtype=np.int64)
        slot[unique - lo] = np.arange(unique.size)
        inverse = slot[hours - lo]
    else:
        unique, inverse = np.unique(hours, return_inverse=True)
    first = np.empty(unique.size, dtype=np.int64)
    second = np.empty(unique.size, dtype=np.int64)
    switch = np.empty(unique.size, dtype=np.int64)
    for k, hour in enumerate(unique.tolist()):
        start = hour * US_PER_HOUR
        end = start + US_PER_HOUR - 1
        off_start = _wall_offset_us(start, zone)
        off_end = _wall_offset_us(end, zone)
        first[k] = off_start
        second[k] = off_end
        if off_start == off_end:
            switch[k] = end + 1
            continue
        # Smallest wall time in the hour that already has the later offset.
        low, high = start, end
        while low < high:
            mid = (low + high) // 2
            if _wall_offset_us(mid, zone) == off_start:
                low = mid + 1
            else:
                high = mid
        switch[k] = low
    offsets = np.where(wall_us < switch[inverse], first[inverse], second[inverse])
    return wall_us - offsets
