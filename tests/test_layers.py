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


# -- the house in order: no import cycles, no module over MAX_LINES, lazy imports only for
# -- what may be missing (or must not load yet) ---------------------------------------------

#: The most lines a module may have: past it a module holds more than one thing.
MAX_LINES = 900
#: Third-party packages a module may import inside a function: the optional dependencies (an
#: extra installs them; without it the module still imports and says what to install), and
#: pyspark, which modules the shell, the writers and the executors' log code use must import
#: without (Spark is slow to load and not there in a writer's process).
LAZY_ROOTS = {
    "redis": "extra [redis]",
    "obstore": "extra [cloud]",
    "prometheus_client": "extra [metrics]",
    "matplotlib": "extras [demo], [bench]",
    "deltalake": "extra [delta]",
    "pyiceberg": "extra [iceberg]",
    "adlfs": "pyiceberg's fsspec Azure filesystem, used when the user has it",
    "pyspark": "modules that must import without Spark",
}
#: Imports of the project's own modules that stay inside a function, each with why. (A project
#: module that itself imports one of LAZY_ROOTS at its top is lazy for the same reason, and
#: needs no line here.)
_ONE_TARGET = (
    "a sink query's write tasks and commits (a Python process of Spark's each) load the module of "
    "their target only: a stream target's skip pyarrow.parquet and the table targets, about 50 "
    "ms of CPU and 6 MiB a process (docs/benchmarks.md)"
)
LAZY_ALLOWED: dict[tuple[str, str], str] = {
    ("pyspark_rowtime.sink.spark", f"pyspark_rowtime.sink.{kind}_target"): _ONE_TARGET
    for kind in ("parquet", "delta", "iceberg")
}
LAZY_ALLOWED[("pyspark_rowtime.serve_cli", "pyspark_rowtime.flight_server")] = (
    "only `rowtime serve` loads Arrow Flight (gRPC's library): every other command starts "
    "without it"
)


def _all_modules() -> dict[str, tuple[str, str]]:
    """Every module of the package: absolute name -> (file path, its package)."""
    out = {}
    for layer in sorted(ALLOWED):
        for path, _, package in _modules(layer):
            name = os.path.basename(path)[: -len(".py")]
            out[package if name == "__init__" else f"{package}.{name}"] = (path, package)
    for path, _, package in _face_modules():
        name = os.path.basename(path)[: -len(".py")]
        out[package if name == "__init__" else f"{package}.{name}"] = (path, package)
    return out


def _import_statements(path: str, package: str) -> Iterator[tuple[int, list[str], bool]]:
    """(line, modules, inside a function) of every import that runs (not those under ``if
    TYPE_CHECKING:``). ``from X import a, b`` names X.a and X.b where they are modules (the
    caller knows), else X: the modules are given as [X, X.a, X.b]."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)

    def walk(node: ast.AST, in_function: bool) -> Iterator[tuple[int, list[str], bool]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                yield from walk(ast.Module(body=child.orelse, type_ignores=[]), in_function)
                continue
            if isinstance(child, ast.Import):
                for alias in child.names:
                    yield child.lineno, [alias.name], in_function
            elif isinstance(child, ast.ImportFrom):
                if child.level:
                    base = package.split(".")
                    base = base[: len(base) - child.level + 1]
                    name = ".".join([*base, child.module] if child.module else base)
                else:
                    name = child.module or ""
                yield child.lineno, [name, *(f"{name}.{a.name}" for a in child.names)], in_function
            function = isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
            yield from walk(child, in_function or function)

    yield from walk(tree, False)


def _targets(names: list[str], modules: dict[str, tuple[str, str]]) -> list[str]:
    """The project modules one import statement loads: ``from X import a`` loads X.a when
    that is a module, else X."""
    if len(names) == 1:
        return [names[0]] if names[0] in modules else []
    base, rest = names[0], names[1:]
    subs = [n for n in rest if n in modules]
    out = subs if len(subs) == len(rest) else [*subs, base]
    return [n for n in out if n in modules]


def _graph(modules: dict[str, tuple[str, str]], *, in_functions: bool) -> dict[str, dict[str, int]]:
    """module -> {module it imports: line}; imports inside functions too when asked."""
    graph: dict[str, dict[str, int]] = {m: {} for m in modules}
    for m, (path, package) in modules.items():
        for line, names, in_function in _import_statements(path, package):
            if in_function and not in_functions:
                continue
            for target in _targets(names, modules):
                if target != m and not m.startswith(f"{target}."):  # a parent loads first
                    graph[m].setdefault(target, line)
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        m = stack.pop()
                        on_stack.discard(m)
                        component.append(m)
                        if m == node:
                            break
                    if len(component) > 1:
                        out.append(sorted(component))
    return out


def test_no_import_cycles_counting_imports_inside_functions():
    modules = _all_modules()
    graph = _graph(modules, in_functions=True)
    found = _cycles(graph)
    described = []
    for component in found:
        parts = []
        for m in component:
            lines = [f"{t}:{graph[m][t]}" for t in component if t in graph[m]]
            parts.append(f"{m} (imports {', '.join(lines)})")
        described.append(" <-> ".join(parts))
    assert not found, "modules importing one another:\n" + "\n".join(described)


def test_the_cycle_check_finds_a_cycle_through_a_function(tmp_path):
    (tmp_path / "a.py").write_text("from .b import x\n")
    (tmp_path / "b.py").write_text("def f():\n    from .a import y\n")
    (tmp_path / "c.py").write_text("if TYPE_CHECKING:\n    from .a import z\n")
    modules = {f"p.{n}": (str(tmp_path / f"{n}.py"), "p") for n in "abc"}
    assert _cycles(_graph(modules, in_functions=True)) == [["p.a", "p.b"]]
    assert _cycles(_graph(modules, in_functions=False)) == []


def test_no_module_is_over_the_line_limit():
    over = []
    for name, (path, _) in sorted(_all_modules().items()):
        with open(path, encoding="utf-8") as f:
            n = sum(1 for _ in f)
        if n > MAX_LINES:
            over.append(f"{name}: {n} lines")
    assert not over, f"modules over {MAX_LINES} lines (split them):\n" + "\n".join(over)


def _loads_lazily(modules: dict[str, tuple[str, str]]) -> set[str]:
    """Project modules that import one of LAZY_ROOTS at their top, themselves or through
    another project module: importing them loads an optional dependency or Spark."""
    top = _graph(modules, in_functions=False)
    heavy = set()
    for m, (path, package) in modules.items():
        for _, names, in_function in _import_statements(path, package):
            if not in_function and any(n.split(".")[0] in LAZY_ROOTS for n in names[:1]):
                heavy.add(m)
    grew = True
    while grew:
        grew = False
        for m, targets in top.items():
            if m not in heavy and heavy & set(targets):
                heavy.add(m)
                grew = True
    return heavy


def test_imports_inside_functions_are_only_for_optional_dependencies_and_spark():
    modules = _all_modules()
    heavy = _loads_lazily(modules)
    wrong = []
    for m, (path, package) in sorted(modules.items()):
        for line, names, in_function in _import_statements(path, package):
            if not in_function or names[0].split(".")[0] in LAZY_ROOTS:
                continue
            targets = _targets(names, modules)
            if targets and all(t in heavy or (m, t) in LAZY_ALLOWED for t in targets):
                continue
            wrong.append(f"{path}:{line} imports {names[0]} inside a function")
    assert not wrong, (
        "imports inside functions that belong at the top of the module (or, for a new "
        "optional dependency, in LAZY_ROOTS):\n" + "\n".join(wrong)
    )


# -- the storage contract is called, never probed ---------------------------------------------

#: The modules that declare the storage contract: its protocols (what every backend does, and
#: each capability some have) are found in them.
CONTRACT_MODULES = ("streams.storage", "streams.sink_state")
PROBES = ("getattr", "hasattr")


def _contract_members() -> dict[str, str]:
    """Every member of the contract's protocols, and every field of a stream's ``meta``, by
    name -> the protocol (or class) that declares it."""
    import dataclasses
    import importlib
    from typing import Protocol

    from pyspark_rowtime.streams.meta import StreamMeta

    members = {f.name: "StreamMeta" for f in dataclasses.fields(StreamMeta)}
    for module in CONTRACT_MODULES:
        for value in vars(importlib.import_module(f"{PACKAGE}.{module}")).values():
            if not isinstance(value, type) or Protocol not in value.__mro__ or value is Protocol:
                continue
            for cls in value.__mro__:
                if cls in (object, Protocol) or Protocol not in cls.__mro__:
                    continue
                names = [*vars(cls), *getattr(cls, "__annotations__", {})]
                for name in names:
                    if not name.startswith("_"):
                        members.setdefault(name, cls.__name__)
    return members


def _probes(path: str, members: dict[str, str]) -> Iterator[tuple[int, str, str]]:
    """(line, call, member) of every ``getattr``/``hasattr`` in the file at ``path`` that
    names a member of the contract by a string."""
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read(), path)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in PROBES
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and node.args[1].value in members
        ):
            yield node.lineno, node.func.id, node.args[1].value


def test_nothing_probes_the_storage_contract_by_name():
    # What every backend does is required and called directly; what some do is a capability,
    # a runtime-checkable protocol asked with isinstance (streams/storage.py's docstring). A
    # getattr or hasattr on a member of the contract says neither: it hides a method the
    # protocol should require, or a capability it should declare.
    members = _contract_members()
    wrong = [
        f"{path}:{line} {call}(..., {name!r}): {name} is a member of {members[name]}; call it "
        "(required) or check its capability with isinstance"
        for _, (path, _) in sorted(_all_modules().items())
        for line, call, name in _probes(path, members)
    ]
    assert not wrong, "the storage contract probed by name:\n" + "\n".join(wrong)


def test_the_probe_check_sees_getattr_and_hasattr_on_contract_members(tmp_path):
    members = _contract_members()
    # the required, the capabilities of a stream and of a backend, the sink's seams, meta
    for name in ("start_offset", "trim_partition", "verify", "writer_of", "stored_bytes"):
        assert name in members, name
    for name in ("entry_source", "sink_state", "target_files", "define_target", "created_us"):
        assert name in members, name
    probing = tmp_path / "probing.py"
    probing.write_text(
        'get = getattr(stream, "start_offset", None)\n'
        'if hasattr(stream, "verify"):\n'
        "    pass\n"
        'created = getattr(stream.meta, "created_us", None)\n'
        'ok = getattr(args, "command", None)\n'  # not the contract's: allowed
        "other = getattr(args, key)\n"
    )
    found = [(line, name) for line, _, name in _probes(str(probing), members)]
    assert found == [(1, "start_offset"), (2, "verify"), (4, "created_us")]
