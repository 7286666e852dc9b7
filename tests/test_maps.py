"""The maps of the code stay true: what they name exists, and they name what there is (no Spark).

Three maps tell a newcomer where things are, and each went stale once as modules moved:

* docs/design/architecture.md, the folders and the modules in them;
* each subpackage's ``__init__`` docstring, the modules of that package (a code span each,
  as the docstrings render in Markdown: ``` ``planner`` ```, at the head of a list item when it
  says what the module is for);
* the ``rowtime`` command's own text (src/pyspark_rowtime/cli.py's module docstring) and
  docs/operators/cli.md, its commands.

A map that names a module or a test file that is not there, a subpackage whose docstring leaves
out one of its modules, a package folder that architecture.md does not name, or a command that
``rowtime --help`` lists and the command's text or its page leaves out (or one they name that
it does not list) fails here. The package's folders come from pyproject.toml's
``package-dir``, so a new folder is held to the same.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

from pyspark_rowtime import cli

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 installs tomli (pyproject.toml)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent
ARCHITECTURE = ROOT / "docs" / "design" / "architecture.md"
CLI_PAGE = ROOT / "docs" / "operators" / "cli.md"
#: A code span of a dotted name: ``x`` (a module of the package whose docstring it is in, or
#: any name) or ``pyspark_rowtime.x.y`` (absolute).
NAME_SPAN = re.compile(r"``([\w.]+)``")
#: A list item that opens with a name and a dash: the module it says what it is for.
ITEM_HEAD = re.compile(r"^\s*[*-] ``([\w.]+)`` --", re.M)
#: A test or benchmark file a map names as the proof of what it says.
PROOF_FILE = re.compile(r"\b((?:tests|integration|bench)/[\w/]+\.py)\b")


def packages() -> dict[str, Path]:
    """Each package of the distribution and its folder (pyproject.toml's ``package-dir``)."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {name: ROOT / d for name, d in pyproject["tool"]["setuptools"]["package-dir"].items()}


PACKAGES = packages()
SUBPACKAGES = sorted(name for name in PACKAGES if name != "pyspark_rowtime")


def is_module(dotted: str) -> bool:
    """Whether ``dotted`` (``pyspark_rowtime.a.b``) is a module or package of the distribution."""
    if dotted in PACKAGES:
        return True
    parent, _, last = dotted.rpartition(".")
    return parent in PACKAGES and (PACKAGES[parent] / f"{last}.py").is_file()


def resolve(ref: str, package: str) -> str:
    """``ref`` in ``package``'s docstring as an absolute dotted name: a bare name is in the
    package itself, a leading dot is the package too and each further dot one package up."""
    if ref.startswith("pyspark_rowtime"):
        return ref
    if not ref.startswith("."):
        ref = "." + ref
    dots = len(ref) - len(ref.lstrip("."))
    base = package.split(".")
    base = base[: len(base) - (dots - 1)]
    rest = ref[dots:]
    return ".".join(base + ([rest] if rest else []))


def named_module(ref: str, package: str) -> str | None:
    """The module ``ref`` in ``package``'s docstring names, or None if there is none."""
    dotted = resolve(ref, package)
    return dotted if is_module(dotted) else None


def absolute_not_there(ref: str) -> bool:
    """Whether an absolute ``pyspark_rowtime.a.b`` or ``pyspark_rowtime.a.b.Name`` names no
    module of the distribution (``Name`` may be a class or function of ``a.b``)."""
    parts = ref.split(".")
    return not (is_module(ref) or is_module(".".join(parts[:-1])))


def docstring(package: str) -> str:
    source = (PACKAGES[package] / "__init__.py").read_text()
    return ast.get_docstring(ast.parse(source)) or ""


def test_the_module_check_knows_modules_packages_and_what_is_not_there() -> None:
    assert is_module("pyspark_rowtime.streams.storage")
    assert is_module("pyspark_rowtime.streams.redis")
    assert not is_module("pyspark_rowtime.streams.nothing_here")
    assert resolve(".log", "pyspark_rowtime.streams.local") == "pyspark_rowtime.streams.local.log"
    assert (
        resolve("..storage", "pyspark_rowtime.streams.local") == "pyspark_rowtime.streams.storage"
    )
    assert named_module(".planner", "pyspark_rowtime.datasource")
    assert named_module("planner", "pyspark_rowtime.datasource")
    assert named_module(".nothing_here", "pyspark_rowtime.datasource") is None
    assert absolute_not_there("pyspark_rowtime.streams.moved_away.Thing")
    assert not absolute_not_there("pyspark_rowtime.source.RowtimeDataSource")
    text = "* ``planner`` -- the driver, with ``ordered``;\n* ``gone`` -- moved.\n* ``path``: x\n"
    assert ITEM_HEAD.findall(text) == ["planner", "gone"]


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_a_package_docstring_names_only_modules_that_exist(package: str) -> None:
    text = docstring(package)
    missing = [ref for ref in ITEM_HEAD.findall(text) if named_module(ref, package) is None]
    missing += [
        ref
        for ref in NAME_SPAN.findall(text)
        if ref.startswith("pyspark_rowtime.") and absolute_not_there(ref)
    ]
    missing += [path for path in PROOF_FILE.findall(text) if not (ROOT / path).is_file()]
    assert not missing, f"{package}'s docstring names what is not there: {missing}"


@pytest.mark.parametrize("package", SUBPACKAGES)
def test_a_package_docstring_names_every_module_of_its_package(package: str) -> None:
    text = docstring(package)
    named = {named_module(ref, package) for ref in NAME_SPAN.findall(text)}
    folder = PACKAGES[package]
    modules = {f"{package}.{p.stem}" for p in folder.glob("*.py") if p.stem != "__init__"}
    modules |= {sub for sub in PACKAGES if sub.rpartition(".")[0] == package}
    left_out = sorted(m.rpartition(".")[2] for m in modules - named)
    assert not left_out, f"{package}'s docstring leaves out its modules {left_out}"


def architecture_files(text: str) -> list[tuple[str, str]]:
    """``(as written, path from the root)`` of every ``.py`` file architecture.md names: a path
    with a folder as it stands, a bare name inside the layout block under the folder whose
    entry it is in, any other bare name as a module of some package folder."""
    named = []
    block = re.search(r"```text\n(.*?)```", text, re.S)
    assert block, "architecture.md should open with the layout of the folders"
    folder = ""
    for line in block.group(1).splitlines():
        head = re.match(r"([\w/]+/)\s", line)
        if head:
            folder = head.group(1)
        for name in re.findall(r"(?<![\w/*])([\w]+\.py)\b", line):
            named.append((name, folder + name))
    rest = text[: block.start()] + text[block.end() :]
    for path in re.findall(r"\b((?:[\w.]+/)+[\w*]+\.py)\b", text):
        named.append((path, path))
    for name in re.findall(r"(?<![\w/*])([a-z_]+\.py)\b", rest):
        named.append((name, name))
    return named


def files_not_there(text: str) -> list[str]:
    missing = []
    for written, path in architecture_files(text):
        if "/" in path:
            if not list(ROOT.glob(path)):
                missing.append(written)
        elif not any((folder / path).is_file() for folder in PACKAGES.values()):
            missing.append(written)
    return missing


def test_the_file_check_flags_a_file_that_moved_and_passes_those_that_did_not() -> None:
    text = (
        "```text\n"
        "sink/      .sink: the targets (stream_target.py, gone_target.py)\n"
        "           and demo*.py under src/pyspark_rowtime/demo*.py\n"
        "```\n"
        "The seam is `streams/storage.py`; the rest in `datasource/moved.py` and `nowhere.py`.\n"
    )
    assert files_not_there(text) == ["gone_target.py", "datasource/moved.py", "nowhere.py"]


def test_architecture_names_only_files_that_exist() -> None:
    missing = files_not_there(ARCHITECTURE.read_text())
    assert not missing, f"architecture.md names files that are not there: {missing}"


def test_architecture_names_every_folder_of_the_package() -> None:
    text = ARCHITECTURE.read_text()
    folders = {p.relative_to(ROOT).as_posix() + "/" for p in PACKAGES.values()}
    absent = sorted(f for f in folders if f not in text and f.rpartition("/")[0] + "/" not in text)
    # a backend's folder may be named as its package's part (``local/``, ``redis/``)
    absent = [f for f in absent if f"{f.rstrip('/').rpartition('/')[2]}/" not in text]
    assert not absent, f"architecture.md does not say what these folders hold: {absent}"


def help_commands() -> list[str]:
    """The commands ``rowtime --help`` lists, read from its text."""
    parser = cli.build_parser()
    listed = cli.commands(parser)
    help_text = parser.format_help()
    shown = [name for name in listed if re.search(rf"^ {{4}}{name}\b", help_text, re.M)]
    assert shown == list(listed), "rowtime --help should list every command it has"
    return shown


def test_the_command_text_names_every_command_and_no_other() -> None:
    text = cli.__doc__ or ""
    usage = set(re.findall(r"^ {4}rowtime ([a-z]+)\b", text, re.M))
    commands = help_commands()
    assert usage == set(commands), (
        f"cli.py's docstring lists {sorted(usage)}; rowtime --help lists {sorted(commands)}"
    )


def test_the_cli_page_names_every_command_and_no_other() -> None:
    text = CLI_PAGE.read_text()
    table = set(re.findall(r"^\| `rowtime ([a-z]+)\b", text, re.M))
    anywhere = set(re.findall(r"`rowtime ([a-z]+)\b", text))
    commands = set(help_commands())
    assert table == commands, f"the page's table has {sorted(table)}; --help: {sorted(commands)}"
    assert anywhere <= commands, f"the page names commands that are not: {anywhere - commands}"
