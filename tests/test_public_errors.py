"""Every error a user can meet is exported from ``pyspark_rowtime`` under a name ending in Error.

The hierarchy is rooted in ``RowtimeError`` (bounds/errors.py); a few leaves live beside the code
that raises them (DataLossError in streams/retention.py, ...). The package's source is read as
text (ast), not imported, so the test stays fast and sees a new error class wherever it is added.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest

import pyspark_rowtime as rt

ROOT = Path(__file__).resolve().parent.parent


def package_files() -> list[Path]:
    """Every .py file installed as part of pyspark_rowtime (pyproject's package-dir)."""
    text = (ROOT / "pyproject.toml").read_text()
    dirs = re.findall(r'^"pyspark_rowtime[\w.]*" = "([^"]+)"$', text, flags=re.M)
    assert len(dirs) >= 9, dirs
    return sorted({f for d in dirs for f in (ROOT / d).glob("*.py")})


@functools.cache
def error_classes() -> dict[str, tuple[Path, str]]:
    """Public classes derived, directly or through others, from RowtimeError: name -> (file,
    base names). Aliases (``BadInput = BadInputError``) are assignments, not classes."""
    bases: dict[str, tuple[Path, list[str]]] = {}
    for path in package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = [b.id if isinstance(b, ast.Name) else ast.unparse(b) for b in node.bases]
                bases[node.name] = (path, [n.rsplit(".", 1)[-1] for n in names])
    errors: dict[str, tuple[Path, str]] = {}

    def derives(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name == "RowtimeError":
            return True
        if name not in bases or name in seen:
            return False
        return any(derives(b, seen | {name}) for b in bases[name][1])

    for name, (path, parents) in bases.items():
        if not name.startswith("_") and derives(name):
            errors[name] = (path, ", ".join(parents))
    return errors


def test_the_scan_finds_the_errors_of_every_folder() -> None:
    # A guard against a scan that silently finds nothing (a folder moved, a pattern broken).
    found = error_classes()
    assert {"RowtimeError", "OptionError", "DataLossError", "BadInputError"} <= set(found)
    assert "TableChangeError" in found and "RedisUnavailableError" in found


def test_every_error_is_exported_under_a_name_ending_in_error() -> None:
    found = error_classes()
    unnamed = sorted(n for n in found if not n.endswith("Error"))
    assert not unnamed, f"errors a user catches are named ...Error: {unnamed}"
    missing = sorted(n for n in found if n not in rt.__all__)
    assert not missing, f"export these from pyspark_rowtime (_EXPORTS): {missing}"


@pytest.mark.parametrize("name", sorted(error_classes()))
def test_each_exported_error_is_the_class_raised(name: str) -> None:
    error = getattr(rt, name)
    assert error.__name__ == name and issubclass(error, rt.RowtimeError)
    path, _ = error_classes()[name]
    assert path.stem == error.__module__.rsplit(".", 1)[-1]


def test_the_old_names_still_catch_the_renamed_errors() -> None:
    # 0.2 code caught BadInput (connectors) and BadLine (text input); both keep working.
    from pyspark_rowtime.connectors.sources import BadInput
    from pyspark_rowtime.streams.text_lines import BadLine, json_object

    assert rt.BadInput is BadInput is rt.BadInputError
    with pytest.raises(BadLine, match="line 3"):
        json_object("[1]", 3)
