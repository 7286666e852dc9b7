"""The README stays an entrance, and the benchmarks page stays honest (no Spark needed).

The README says what the project is, the two commands, install, one example and where the docs
are: at most 250 lines, and no measurements (those go on docs/benchmarks.md with their date,
machine and load, where they can be judged). Every result file the benchmarks page names is in
bench/results. The docs site itself is checked by ``./dev docs`` (mkdocs build --strict: links,
anchors, pages missing from the nav) and its code blocks by integration/test_readme_blocks.py.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"


def test_the_readme_is_at_most_250_lines() -> None:
    assert len(README.read_text().splitlines()) <= 250


def test_the_readme_holds_no_measurements() -> None:
    text = README.read_text()
    # The shapes measurements took in it: a load average, a rate, a duration of a run, a ratio.
    patterns = [
        r"\bload( average)? (of |about |near )?\d",
        r"\d[\d.,]* ?M? rows/s",
        r"\b\d+(\.\d+)? ?(s|ms|minutes) (on|at) ",
        r"\bmedian\b",
        r"bench/results",
    ]
    found = [m.group(0) for p in patterns for m in re.finditer(p, text)]
    assert not found, f"measurements belong on docs/benchmarks.md: {found}"


def test_every_result_file_the_benchmarks_page_names_exists() -> None:
    text = BENCHMARKS.read_text()
    named = set(re.findall(r"issue16[\w.-]*?\.(?:json|png)", text))
    assert named, "the benchmarks page should name the result files its figures come from"
    missing = sorted(n for n in named if not (ROOT / "bench" / "results" / n).exists())
    assert not missing, missing


def test_every_dated_section_of_the_benchmarks_page_says_date_and_load() -> None:
    sections = re.split(r"^## ", BENCHMARKS.read_text(), flags=re.M)[2:]  # after "The commands"
    for section in sections:
        title = section.splitlines()[0]
        assert re.search(r"\b2\d{3}-\d{2}\b", section), f"{title}: no date"
        assert "load" in section, f"{title}: no load"
