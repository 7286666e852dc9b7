"""The README stays an entrance, and the benchmarks pages stay honest (no Spark needed).

The README says what the project is, the two commands, install, one example and where the docs
are: at most 250 lines, and no measurements (those go on docs/benchmarks.md with their date,
machine and load, where they can be judged). The benchmarks page opens with one table of
today's figures, each with its date, machine, load and JSON (a file in bench/results whose own
date and load are the row's, or "none kept"), and stays under 400 lines; the history of runs
is docs/benchmarks-history.md, each of its sections dated with its load. Every result file
either page names is in bench/results. The docs site itself is checked by ``./dev docs``
(mkdocs build --strict: links, anchors, pages missing from the nav) and its code blocks by
integration/test_readme_blocks.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
HISTORY = ROOT / "docs" / "benchmarks-history.md"
RESULTS = ROOT / "bench" / "results"
#: The machines the benchmarks page names (its "Today's figures" says which is which).
MACHINES = {"VM-A", "VM-B", "VM-C", "VM-D", "VM-E"}


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


def test_every_result_file_the_benchmarks_pages_name_exists() -> None:
    for page in (BENCHMARKS, HISTORY):
        text = page.read_text()
        named = set(re.findall(r"\bissue\d+[\w.-]*?\.(?:json|png)", text))
        assert named, f"{page.name} should name the result files its figures come from"
        # ``issue35-reader-{10m,20m}-final.json`` and ``...-late-2.json`` name several files
        missing = sorted(n for n in named if not (RESULTS / n).exists() and "{" not in n)
        assert not missing, (page.name, missing)


def test_the_benchmarks_page_stays_under_400_lines_and_the_history_is_in_the_nav() -> None:
    assert len(BENCHMARKS.read_text().splitlines()) < 400
    nav = (ROOT / "mkdocs.yml").read_text()
    assert "benchmarks.md" in nav and "benchmarks-history.md" in nav


def todays_figures() -> list[dict[str, str]]:
    """The rows of the table the benchmarks page opens with, by column."""
    text = BENCHMARKS.read_text()
    first_section = re.split(r"^## ", text, flags=re.M)[1]
    assert first_section.startswith("Today's figures"), "the page opens with today's figures"
    lines = [line for line in first_section.splitlines() if line.startswith("|")]
    assert lines, "today's figures are one table"
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = [[c.strip() for c in line.strip("|").split(" | ")] for line in lines[2:]]
    assert all(len(r) == len(head) for r in rows), "each row has every column"
    return [dict(zip(head, r, strict=True)) for r in rows]


def json_when_and_loads(path: Path) -> tuple[str, list[float]]:
    """A result file's date (``meta.when``, or ``when`` at the top) and every load it recorded
    (``load_min``, ``load_max``, or a ``load`` per case), wherever in the file they are."""
    data = json.loads(path.read_text())
    when = (data.get("meta") or {}).get("when") or data.get("when")
    loads: list[float] = []

    def walk(node: object) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                if key in ("load", "load_min", "load_max") and isinstance(value, (int, float)):
                    loads.append(float(value))
                else:
                    walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(data)
    assert when, f"{path.name} records no date"
    return str(when), loads


def test_each_of_todays_figures_has_its_date_machine_load_and_json() -> None:
    rows = todays_figures()
    assert len(rows) >= 10
    assert {"table reader", "rowtime serve"} <= {row["what"] for row in rows}
    for row in rows:
        what = row["what"]
        assert row["figure"], what
        assert re.fullmatch(r"20\d\d-\d\d(-\d\d( \d\d:\d\d(-\d\d:\d\d)?)?)?", row["date (UTC)"]), (
            what
        )
        assert row["machine"] in MACHINES, what
        load = row["load"]
        assert load == "not recorded" or re.fullmatch(r"\d+(\.\d+)?(-\d+(\.\d+)?)?", load), what
        files = re.findall(r"`([^`]+\.json)`", row["JSON"])
        assert files or row["JSON"] == "none kept", f"{what}: a JSON file or 'none kept'"
        if not files:
            continue
        stem = files[0].rsplit(".json", 1)[0]
        paths = [RESULTS / (f if not f.startswith("-") else stem + f) for f in files]
        assert all(p.exists() for p in paths), f"{what}: {files}"
        recorded = [json_when_and_loads(p) for p in paths]
        assert row["date (UTC)"][:10] in {when[:10] for when, _ in recorded}, (
            f"{what}: the row's date is not its JSON's ({[w for w, _ in recorded]})"
        )
        loads = [x for _, xs in recorded for x in xs]
        if loads and load != "not recorded":
            low, _, high = load.partition("-")
            low_f, high_f = float(low), float(high or low)
            assert abs(low_f - min(loads)) <= 0.15 and abs(high_f - max(loads)) <= 0.15, (
                f"{what}: load {load} where its JSON recorded {min(loads):.2f}-{max(loads):.2f}"
            )


def sections(page: Path) -> list[str]:
    return re.split(r"^## ", page.read_text(), flags=re.M)[1:]


def test_every_section_of_the_benchmarks_pages_says_date_and_load() -> None:
    undated = {"Today's figures", "How to read a figure", "The commands"}
    for page in (BENCHMARKS, HISTORY):
        for section in sections(page):
            title = section.splitlines()[0]
            if title in undated:
                continue
            assert re.search(r"\b2\d{3}-\d{2}\b", section), f"{page.name}, {title}: no date"
            assert "load" in section, f"{page.name}, {title}: no load"


def test_the_history_keeps_every_section_the_page_has() -> None:
    history = {s.splitlines()[0] for s in sections(HISTORY)}
    page = {s.splitlines()[0] for s in sections(BENCHMARKS)}
    page -= {"Today's figures", "How to read a figure", "The commands"}
    assert page <= history, f"sections with no history: {sorted(page - history)}"
