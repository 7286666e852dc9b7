"""The packages import one another in one direction only, checked by parsing every import.

    bounds  <-  streams  <-  datasource
                         <-  sink
                         <-  connectors
    (all of them)        <-  the face (pyspark_rowtime's own modules: api, cli, ...)
    bounds, the face     <-  windows (Spark DataFrame operators over with_watermark)

``datasource``, ``sink`` and ``connectors`` never import one another: what they share (column
names, option tables, the storage seam, the catalog) lives in ``streams``. Imports inside
functions count too: a lazy import is still a dependency.

Storage backends are packages in ``streams`` (``streams.local``, ``streams.redis``, ...), found
by the seam through entry points, and nothing else knows them: the seam (``streams.storage``)
imports none, the layers above ``streams`` import none, and no backend imports another. A new
backend is added as a package in ``streams`` and entry points in pyproject.toml alone.
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


#: Backend packages in ``streams`` (those found there are backends too), and the modules the
#: backends were before they became packages, by backend: none may come back into use
#: (``streams.redis_log`` stays as 0.1.0's import path of ``register_external``, part of Redis).
BACKENDS = {"local", "redis", "objstore"}
FORMER_BACKEND_MODULES = {
    "log": "local",
    "redis_log": "redis",
    "redis_sink": "redis",
    "redis_location": "redis",
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
            for alias in node.names:  # from .streams import local: local may be a module
                yield node.lineno, f"{name}.{alias.name}"


def _modules(layer: str) -> Iterator[tuple[str, str, str]]:
    """(file path, name shown, package) of every module of ``layer``, subpackages included."""
    folder = _folder(layer)
    found = False
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith((".", "__")))
        rel = os.path.relpath(dirpath, folder)
        package = ".".join([PACKAGE, layer, *([] if rel == "." else rel.split(os.sep))])
        for name in sorted(n for n in filenames if n.endswith(".py")):
            found = True
            shown = os.path.join(layer, "" if rel == "." else rel, name)
            yield os.path.join(dirpath, name), shown, package
    assert found, f"no modules found in {folder}"


def _face_modules() -> Iterator[tuple[str, str, str]]:
    """The face: pyspark_rowtime's own modules (api, cli, metrics, ...)."""
    spec = importlib.util.find_spec(PACKAGE)
    assert spec is not None and spec.submodule_search_locations
    folder = next(iter(spec.submodule_search_locations))
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        if name.endswith(".py") and os.path.isfile(path):
            yield path, f"face/{name}", PACKAGE


def _backends() -> set[str]:
    """The backend packages: the known ones and every package found in ``streams``."""
    folder = _folder("streams")
    found = {
        d for d in os.listdir(folder) if os.path.isfile(os.path.join(folder, d, "__init__.py"))
    }
    return BACKENDS | found


def _backend_of(module: str) -> str | None:
    """The backend ``module`` (an absolute name) belongs to, or None."""
    parts = module.split(".")
    if parts[:2] != [PACKAGE, "streams"] or len(parts) < 3:
        return None
    if parts[2] in _backends():
        return parts[2]
    return FORMER_BACKEND_MODULES.get(parts[2])


def _backend_imports(path: str, package: str) -> list[tuple[int, str, str]]:
    """(line, module, backend) of every import of a backend in the file at ``path``."""
    out: dict[tuple[int, str], str] = {}
    for line, module in _imports(path, package):
        backend = _backend_of(module)
        if backend is not None:
            out.setdefault((line, backend), module)  # one per statement and backend
    return [(line, module, backend) for (line, backend), module in out.items()]


def _layer_of(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != PACKAGE:
        return None
    if len(parts) > 1 and parts[1] in ALLOWED:
        return parts[1]
    return "face"


@pytest.mark.parametrize("layer", sorted(ALLOWED))
def test_a_layer_imports_only_the_layers_below_it(layer):
    wrong = []
    for path, shown, package in _modules(layer):
        for line, module in _imports(path, package):
            target = _layer_of(module)
            if target is None or target == layer:
                continue
            if target not in ALLOWED[layer]:
                wrong.append(f"{shown}:{line} imports {module} ({target})")
    assert not wrong, "imports against the layers:\n" + "\n".join(wrong)


def test_the_storage_seam_imports_no_backend():
    # streams.storage finds backends through entry points (or, without the metadata, by
    # looking into streams/ for packages that expose BACKEND): it names none of them.
    path = os.path.join(_folder("streams"), "storage.py")
    wrong = _backend_imports(path, f"{PACKAGE}.streams")
    assert not wrong, "streams/storage.py imports backends:\n" + "\n".join(
        f"storage.py:{line} imports {module} ({backend})" for line, module, backend in wrong
    )


@pytest.mark.parametrize("layer", ["datasource", "sink", "connectors", "windows", "face"])
def test_nothing_above_streams_imports_a_backend(layer):
    # The reader, the sink, the connectors and the face reach streams through the seam
    # (streams.storage and its capabilities): no backend is known to them by name.
    modules = _face_modules() if layer == "face" else _modules(layer)
    wrong = [
        f"{shown}:{line} imports {module} ({backend})"
        for path, shown, package in modules
        for line, module, backend in _backend_imports(path, package)
    ]
    assert not wrong, f"{layer} imports backends:\n" + "\n".join(wrong)


def test_no_backend_imports_another():
    # Each backend is a package of its own: what two share lives in streams/ (the segment
    # format, meta, retention, the seam), not in one of them.
    folder = _folder("streams")
    wrong = []
    for path, shown, package in _modules("streams"):
        rel = os.path.relpath(path, folder).split(os.sep)
        mine = rel[0] if len(rel) > 1 else FORMER_BACKEND_MODULES.get(rel[0][: -len(".py")])
        if mine is None:
            continue  # a module shared by the backends, not one of them
        for line, module, backend in _backend_imports(path, package):
            if backend != mine:
                wrong.append(f"{shown}:{line} ({mine}) imports {module} ({backend})")
    assert not wrong, "backends importing one another:\n" + "\n".join(wrong)


def test_the_backend_check_sees_relative_imports_of_a_backend(tmp_path):
    # The parser on the forms a backend import takes: from a layer above streams, from a
    # sibling backend package, and the former module names.
    above = tmp_path / "above.py"
    above.write_text(
        "from ..streams.redis.location import parse_location\n"
        "from ..streams import local\n"
        "from ..streams.redis_log import register_external\n"
        "from ..streams.storage import backend_for\n"
    )
    found = [b for _, _, b in _backend_imports(str(above), f"{PACKAGE}.sink")]
    assert found == ["redis", "local", "redis"]
    sibling = tmp_path / "sibling.py"
    sibling.write_text(
        "from ..redis.connection import connection\n"
        "from .. import local\n"
        "from ..segments import SegmentStats\n"
        "from .store import Store\n"
    )
    found = [b for _, _, b in _backend_imports(str(sibling), f"{PACKAGE}.streams.objstore")]
    assert found == ["redis", "local", "objstore"]
