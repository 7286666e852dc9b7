"""The Examples sections of the public names of ``pyspark_rowtime``, as doctests.

Shared by tests/test_api_examples.py (the examples that need no Spark) and
integration/test_api_examples_spark.py (those that use a ``spark`` session, given to them). Each
docstring's examples run in a namespace of their own, as a reader would paste them; output is
compared with ``...`` for what varies (a temporary path, an error's text).
"""

from __future__ import annotations

import doctest
import inspect
import io
import re
from typing import Any

import pyspark_rowtime as rt

FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE | doctest.IGNORE_EXCEPTION_DETAIL


def public_objects() -> dict[str, Any]:
    """Each object of ``rt.__all__`` once, under its own name (an alias such as ``BadInput``
    or ``DefaultSource`` is the same object as the name it stands for)."""
    objects = {name: getattr(rt, name) for name in rt.__all__}
    return {n: o for n, o in objects.items() if getattr(o, "__name__", n) == n}


def examples(name: str) -> doctest.DocTest:
    obj = getattr(rt, name)
    doc = inspect.cleandoc(obj.__doc__ or "")
    return doctest.DocTestParser().get_doctest(doc, {}, f"pyspark_rowtime.{name}", None, 0)


def needs_spark(name: str) -> bool:
    """The examples use a ``spark`` session (they run in integration/)."""
    return any(re.search(r"\bspark\b", e.source) for e in examples(name).examples)


def run_examples(name: str, globs: dict[str, Any]) -> None:
    """Run the examples of ``name``; a failure shows the example, what it gave and expected."""
    test = examples(name)
    test.globs = dict(globs)
    out = io.StringIO()
    runner = doctest.DocTestRunner(optionflags=FLAGS)
    result = runner.run(test, out=out.write, clear_globs=True)
    assert result.attempted > 0, f"{name}: no examples"
    assert result.failed == 0, f"the examples of {name} failed:\n{out.getvalue()}"
