r"""String forms of event times: one regex per form, for one value and for a whole column.

Each form (ISO-8601, SDP's ``yyyy/MM/dd HH:mm:ss:fffffffff``, or a Spark/Java datetime pattern
given as ``fmt``) is one regex with named groups (``year``, ``month``, ``frac``, ``offsign``, ...),
run by Python's ``re`` for one value and by Arrow's RE2 (``pyarrow.compute.extract_regex``) for
a column. Both engines accept the subset used here: ``[0-9]`` rather than ``\d`` (Python's ``\d``
matches every Unicode digit), named groups, ``(?i:...)``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from .errors import OptionError, shown

_OFFSET_RE = r"(?:(?P<offz>[Zz])|(?P<offsign>[+-])(?P<offh>[0-9]{2})(?::?(?P<offm>[0-9]{2}))?)"
_ISO_RE = (
    r"(?P<year>[0-9]{4})-(?P<month>[0-9]{2})-(?P<day>[0-9]{2})"
    r"(?:[Tt ](?P<hour>[0-9]{2}):(?P<minute>[0-9]{2})"
    r"(?::(?P<second>[0-9]{2})(?:[.,](?P<frac>[0-9]{1,9}))?)?)?"
    r" ?" + _OFFSET_RE + "?"
)
_SDP_RE = (
    r"(?P<year>[0-9]{4})/(?P<month>[0-9]{2})/(?P<day>[0-9]{2}) "
    r"(?P<hour>[0-9]{2}):(?P<minute>[0-9]{2}):(?P<second>[0-9]{2})"
    r"(?:[:.](?P<frac>[0-9]{1,9}))?"
)
MONTHS = ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec")
_MONTH_NAMES = (
    "january|february|march|april|may|june|july|august|september|october|november|december"
)
_DAY_ABBR = "mon|tue|wed|thu|fri|sat|sun"
_DAY_NAMES = "monday|tuesday|wednesday|thursday|friday|saturday|sunday"
_SPACE = "[ \t]*"


@dataclass(frozen=True)
class Form:
    name: str
    body: str

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(re.compile(self.body).groupindex)

    @property
    def python(self) -> re.Pattern[str]:
        return _compiled(_SPACE + self.body + _SPACE)

    @property
    def re2(self) -> str:
        return "^" + _SPACE + self.body + _SPACE + "$"


@lru_cache(maxsize=64)
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.ASCII)


ISO = Form("ISO-8601", _ISO_RE)
SDP = Form("SDP", _SDP_RE)


def _escape(ch: str) -> str:
    """A literal character for both re and RE2."""
    return "\\" + ch if ch in r".^$*+?()[]{}|\-/#&~" else ch


def _pattern_error(fmt: str, why: str) -> OptionError:
    return OptionError(
        f"fmt={fmt!r}: {why}. Supported Spark/Java pattern letters: yyyy or uuuu (year), yy, "
        "M/MM/MMM/MMMM (month), d/dd, H/HH, h/hh with a (AM/PM), m/mm, s/ss, S to SSSSSSSSS "
        "(fraction, 1 to that many digits), X/XX/XXX, x/xx/xxx, Z/ZZ/ZZZ/ZZZZZ (offsets), VV "
        "(zone id), E/EEE/EEEE (day name, ignored); 'text' in single quotes; [optional]"
    )


@lru_cache(maxsize=64)
def pattern_form(fmt: str) -> Form:
    """Translate a Spark/Java datetime pattern into a regex with the named groups we read."""
    if not isinstance(fmt, str) or not fmt:
        raise OptionError(f"fmt={shown(fmt)} is not a datetime pattern: give e.g. 'yyyy-MM-dd'")
    out: list[str] = []
    seen: set[str] = set()
    depth = 0
    i = 0

    def group(field: str, regex: str) -> str:
        if field in seen:
            raise _pattern_error(fmt, f"the {field} appears twice")
        seen.add(field)
        return f"(?P<{field}>{regex})"

    while i < len(fmt):
        ch = fmt[i]
        if ch == "'":
            end = fmt.find("'", i + 1)
            if end == i + 1:  # '' is a literal quote
                out.append("'")
                i += 2
                continue
            if end < 0:
                raise _pattern_error(fmt, f"unclosed quote at position {i}")
            out.extend(_escape(c) for c in fmt[i + 1 : end])
            i = end + 1
            continue
        if ch == "[":
            out.append("(?:")
            depth += 1
            i += 1
            continue
        if ch == "]":
            if depth == 0:
                raise _pattern_error(fmt, f"']' without '[' at position {i}")
            out.append(")?")
            depth -= 1
            i += 1
            continue
        if not ("a" <= ch <= "z" or "A" <= ch <= "Z"):
            out.append(_escape(ch))
            i += 1
            continue
        n = 1
        while i + n < len(fmt) and fmt[i + n] == ch:
            n += 1
        i += n
        if ch in "yu":
            out.append(group("year2", "[0-9]{2}") if n == 2 else group("year", f"[0-9]{{{n},4}}"))
        elif ch in "ML":
            if n == 1:
                out.append(group("month", "[0-9]{1,2}"))
            elif n == 2:
                out.append(group("month", "[0-9]{2}"))
            elif n == 3:
                out.append(group("monname", "(?i:" + "|".join(MONTHS) + ")"))
            elif n == 4:
                out.append(group("monname", "(?i:" + _MONTH_NAMES + ")"))
            else:
                raise _pattern_error(fmt, f"{ch * n} is not a month field")
        elif ch in "dHhms":
            field = {"d": "day", "H": "hour", "h": "hour12", "m": "minute", "s": "second"}[ch]
            if n > 2:
                raise _pattern_error(fmt, f"{ch * n} has too many letters (at most 2)")
            out.append(group(field, "[0-9]{1,2}" if n == 1 else "[0-9]{2}"))
        elif ch == "S":
            if n > 9:
                raise _pattern_error(fmt, "a fraction has at most 9 digits (SSSSSSSSS)")
            out.append(group("frac", f"[0-9]{{1,{n}}}"))
        elif ch == "a":
            out.append(group("ampm", "(?i:am|pm)"))
        elif ch == "E":
            out.append("(?i:" + (_DAY_NAMES if n >= 4 else _DAY_ABBR) + ")")
        elif ch in "XxZ":
            if "offset" in seen:
                raise _pattern_error(fmt, "the offset appears twice")
            seen.add("offset")
            allow_z = ch == "X" or (ch == "Z" and n == 5)
            body = r"(?P<offsign>[+-])(?P<offh>[0-9]{2})(?::?(?P<offm>[0-9]{2}))?"
            out.append(f"(?:(?P<offz>[Zz])|{body})" if allow_z else f"(?:{body})")
        elif ch == "V" and n == 2:
            out.append(group("zone", r"[A-Za-z][A-Za-z0-9_+\-]*(?:\/[A-Za-z0-9_+\-]+)*"))
        else:
            raise _pattern_error(fmt, f"pattern letter {ch!r} ({ch * n}) is not supported")
    if depth:
        raise _pattern_error(fmt, "'[' without ']'")
    if "year" not in seen and "year2" not in seen:
        raise _pattern_error(fmt, "it has no year (yyyy)")
    if "month" not in seen and "monname" not in seen:
        raise _pattern_error(fmt, "it has no month (MM)")
    if "day" not in seen:
        raise _pattern_error(fmt, "it has no day of month (dd)")
    if ("hour12" in seen) != ("ampm" in seen):
        raise _pattern_error(fmt, "h (hour 1-12) needs a (AM/PM) and a needs h; use HH for 0-23")
    if "hour" in seen and "hour12" in seen:
        raise _pattern_error(fmt, "it has both H and h")
    form = Form(f"pattern {fmt!r}", "".join(out))
    try:  # both engines must accept it; fail here rather than on the first value
        _compiled(form.body)
    except re.error as exc:  # pragma: no cover - the translation only emits valid regexes
        raise _pattern_error(fmt, f"it does not translate to a regex ({exc})") from exc
    return form


def forms(fmt: str | None) -> tuple[Form, ...]:
    return (pattern_form(fmt),) if fmt is not None else (ISO, SDP)
