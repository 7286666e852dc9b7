"""The packages import one another in one direction only, checked by parsing every import.

    bounds  <-  streams  <-  datasource
                         <-  sink
                         <-  connectors
    (all of them)        <-  the face (pyspark_rowtime's own modules: api, cli, ...)
    bounds, the face     <-  windows (Spark DataFrame operators over with_watermark)

``datasource``, ``sink`` and ``connectors`` never import one another: what they share (column
names, option tables, the storage seam, the catalog) lives in ``streams``. A second storage
backend is added in ``streams`` alone. Imports inside functions count too: a lazy import is
still a dependency.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from collections.abc import Iterator

import pytest

PACKAGE = "pyspark_rowtime"
#: What each layer may import from the project, besides itself.
ALLOWED = {
    "bounds": set(),
    "streams": {"bounds"},
    "datasource": {"bounds", "streams"},
    "sink": {"bounds", "streams"},
    # Windows on Spark build on with_watermark, the face's DataFrame helper; they need no log.
    "windows": {"bounds", "face"},
    "connectors": {"bounds", "streams"},
}


def _folder(subpackage: str) -> str:
    spec = importlib.util.find_spec(f"{PACKAGE}.{subpackage}")
    assert spec is not None and spec.submodule_search_locations, subpackage
    return next(iter(spec.submodule_search_locations))


def _imports(path: str, package: str) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the file at ``path``."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, node.module] if node.module else base)
            else:
                name = node.module or ""
            yield node.lineno, name
            if not node.module:  # from . import x: x may be a module
                for alias in node.names:
                    yield node.lineno, f"{name}.{alias.name}"


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    if len(parts) > 1 and parts[1] in ALLOWED:
        return parts[1]
    return "face"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_layer_imports_only_the_layers_below_it(layer):
    folder = _folder(layer)
    wrong = []
    files = sorted(n for n in os.listdir(folder) if n.endswith(".py"))
    assert files, f"no modules found in {folder}"
    for name in files:
        package = f"{PACKAGE}.{layer}"
        for line, module in _imports(os.path.join(folder, name), package):
            target = _layer_of(module)
            if target is None or target == layer:
                continue
            if target not in ALLOWED[layer]:
                wrong.append(f"{layer}/{name}:{line} imports {module} ({target})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_check_sees_relative_imports_of_other_layers(tmp_path):
    # The parser itself: a sink module's `from ..datasource import x` is seen as datasource.
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from ..datasource.spark import RowtimeDataSource\n")
    found = [_layer_of(m) for _, m in _imports(str(path), f"{PACKAGE}.sink")]
    assert found == ["datasource"]
