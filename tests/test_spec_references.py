"""Every rule the code cites is in the repository (no Spark needed).

The code cites the project's rules as ``SPEC n`` (or ``SPEC section n``): section ``n`` of
docs/design/rules.md, whose headings carry the anchor ``{#spec-n}``. A citation of a section
that is not there, or a rules page that lost a section the code cites, fails here, so that a
reader of the code can always look the rule up. The repository also names no path outside
itself (the source documents and working notes stay outside, named by title only).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "design"
#: Folders that are not the project's own text.
SKIP = {".git", ".venv", "build", "site", ".typecheck", "node_modules", "bench-results"}
CITATION = re.compile(r"\bSPEC (?:section )?(\d+)\b")


def project_files(*suffixes: str) -> list[Path]:
    files = []
    for path in ROOT.rglob("*"):
        rel = path.relative_to(ROOT)
        if any(part in SKIP or part.startswith(".venv") for part in rel.parts):
            continue
        if path.is_file() and path.suffix in suffixes:
            files.append(path)
    return files


def cited_sections() -> dict[int, list[str]]:
    """Section number -> the places (file:line) that cite it, over the Python code."""
    cited: dict[int, list[str]] = {}
    for path in project_files(".py"):
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            for match in CITATION.finditer(line):
                where = f"{path.relative_to(ROOT)}:{number}"
                cited.setdefault(int(match.group(1)), []).append(where)
    return cited


def rule_anchors() -> set[int]:
    """The section numbers with a ``{#spec-n}`` heading in the design pages."""
    anchors = set()
    for page in DESIGN.glob("*.md"):
        for match in re.finditer(r"^#+ .*\{#spec-(\d+)\}\s*$", page.read_text(), flags=re.M):
            anchors.add(int(match.group(1)))
    return anchors


def test_the_code_cites_the_rules() -> None:
    # A guard against a scan that silently finds nothing (a moved folder, a changed pattern).
    assert len(cited_sections()) >= 8
    assert sum(len(v) for v in cited_sections().values()) >= 80


def test_every_cited_section_has_a_heading_in_the_design_pages() -> None:
    anchors = rule_anchors()
    missing = {n: places for n, places in cited_sections().items() if n not in anchors}
    assert not missing, (
        "the code cites rules that docs/design/ does not define (add a heading ending in "
        f"{{#spec-n}}): {missing}"
    )


def test_the_rules_are_numbered_without_gaps() -> None:
    anchors = rule_anchors()
    assert anchors == set(range(1, max(anchors) + 1)), sorted(anchors)


def test_no_path_outside_the_repository_is_named() -> None:
    # Spelled in pieces so that this file does not name them itself.
    outside = ["../" + "shared", "/work" + "/", "shared/" + "SPEC", "shared/" + "seeds"]
    outside.append("/opt" + "/")
    found = []
    for path in project_files(".py", ".md", ".toml", ".yml", ".yaml", ".cfg", ".txt", ".sh"):
        if path.parent.name == "fixtures" or "fixtures" in path.relative_to(ROOT).parts:
            continue
        text = path.read_text(errors="replace")
        for needle in outside:
            if needle in text:
                found.append(f"{path.relative_to(ROOT)}: {needle}")
    for name in ("dev",):
        text = (ROOT / name).read_text()
        found += [f"{name}: {n}" for n in outside if n in text]
    assert not found, found
