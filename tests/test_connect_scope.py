"""Why the Spark Connect pass runs only what the mode can change (issue 32), kept true.

``./dev test`` runs the integration tests twice: in a classic session, and in a Spark Connect
session for ``CONNECT_FILES`` and the tests marked ``connect`` (integration/conftest.py). The
rest is the same in both modes by construction, as long as:

1. the data source (the reader, the sink and the storage under them) imports from pyspark only
   the data source API and types: it never sees a session, a DataFrame or the JVM, so it runs
   alike in the Python processes Spark's driver and executors start, whichever client started
   the query;
2. the data source does not import the client side (the windows, the watermark's checks, the
   metrics listener), which is what the Connect pass exercises;
3. only the listed client modules reach for the JVM (Py4J), each with a branch for Connect that
   ``integration/test_connect.py`` runs.

A change that breaks one of these fails here, saying which module and import, and the module
either goes back to the rule or its tests join the Connect pass.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

#: The data source: what Spark's Python processes run (pickled DataSource, reader, writer).
DATA_SOURCE = ["datasource", "sink", "streams", "bounds", "src/pyspark_rowtime/source.py"]
#: What the data source may import from pyspark: the data source API and types.
ALLOWED_PYSPARK = {
    "pyspark",  # the version, TaskContext
    "pyspark.sql.datasource",
    "pyspark.sql.streaming.datasource",
    "pyspark.sql.types",
    "pyspark.sql.pandas.types",
    "pyspark.errors",
}
#: From ``pyspark`` itself, only these names.
ALLOWED_FROM_PYSPARK = {"TaskContext", "__version__"}
#: The client side, which the Connect pass exercises.
CLIENT = ("pyspark_rowtime.windows", "pyspark_rowtime.watermark", "pyspark_rowtime.metrics")
#: The client modules that reach for the JVM, and what runs instead under Connect.
JVM_USERS = {
    "src/pyspark_rowtime/watermark.py": "plans are read from the Connect client's explain text",
    "windows/aggregate.py": "aggregates are split from the Connect client's expression protos",
    "src/pyspark_rowtime/demo.py": "the demo starts its own classic session",
}
JVM = re.compile(r"\._jvm\b|\._jdf\b|\._jsc\b|\.sparkContext\b|\bSparkContext\b|\bpy4j\b")


def _files(parts: list[str]) -> list[Path]:
    out: list[Path] = []
    for part in parts:
        path = ROOT / part
        out += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return out


def _imports(path: Path) -> list[tuple[int, str, list[str]]]:
    """(line, module, names) of every import in ``path``, inside functions too."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module, [a.name for a in node.names]))
    return found


def test_the_data_source_is_found_where_the_rule_looks() -> None:
    files = _files(DATA_SOURCE)
    assert len(files) > 40, "the data source's folders moved: update DATA_SOURCE"
    assert any(f.name == "source.py" for f in files)


@pytest.mark.parametrize("path", _files(DATA_SOURCE), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_data_source_imports_only_the_data_source_api_from_pyspark(path: Path) -> None:
    for line, module, names in _imports(path):
        where = f"{path.relative_to(ROOT)}:{line}"
        if module == "pyspark" or module.startswith("pyspark."):
            assert module in ALLOWED_PYSPARK, (
                f"{where} imports {module}: the data source must run alike whatever client "
                "started the query; move this to the client side, or run its tests under "
                "Spark Connect too (integration/conftest.py CONNECT_FILES)"
            )
            if module == "pyspark":
                assert set(names) <= ALLOWED_FROM_PYSPARK, f"{where} imports {names} from pyspark"
        assert not module.startswith(CLIENT), f"{where} imports the client side ({module})"


def test_only_the_listed_modules_reach_for_the_jvm() -> None:
    users = {
        str(path.relative_to(ROOT))
        for path in _files([*DATA_SOURCE, "windows", "connectors", "src/pyspark_rowtime"])
        if JVM.search(path.read_text())
    }
    assert users == set(JVM_USERS), (
        f"modules that reach for the JVM: {sorted(users)}; each needs a Connect branch that "
        "integration/test_connect.py runs, and a line in JVM_USERS"
    )


def test_the_rule_catches_a_session_import(tmp_path: Path) -> None:
    """The check above can fail: a module importing the session API is named."""
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from pyspark.sql import SparkSession\n")
    assert [(2, "pyspark.sql", ["SparkSession"])] == _imports(bad)
    assert "pyspark.sql" not in ALLOWED_PYSPARK
