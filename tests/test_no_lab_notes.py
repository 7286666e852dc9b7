"""The package's docstrings and comments state contracts and reasons, not lab notes (no Spark).

A measurement goes stale (the machine, the load, the next change move it) and an issue number
sends the reader away from the code to a thread that does not say what holds now; both belong
on docs/benchmarks.md (with their date, machine, load and result file) or in the history of
runs. What a docstring may keep is the reason the figure supported ("fresh memory costs a page
fault a page, so the run's columns are kept") and a link to the page that has the figure.

The check reads every module of the installed package's folders (pyproject.toml's
``package-dir``) and looks only at comments and at string statements (docstrings, attribute
docstrings), never at the code's own strings (error messages may quote values). Its patterns are
the shapes the lab notes took; the tables below hold each to text it must flag and to the
package's own legitimate text it must leave alone (defaults, examples of durations, Spark's
plan text, end of stream, sizes that follow from a layout).
"""

from __future__ import annotations

import ast
import functools
import io
import re
import sys
import tokenize
from pathlib import Path

import pytest

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10 installs tomli (pyproject.toml)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parent.parent

#: The shapes of a lab note: (what it is, pattern).
LAB_NOTES: list[tuple[str, re.Pattern[str]]] = [
    ("an issue number", re.compile(r"\b[Ii]ssues? #?\d+|(?<![\w#])#\d{1,4}\b(?!\w)")),
    ("a session's stop", re.compile(r"\bstop \d+\b")),
    # a date alone; a timestamp (its T or a time after a space, as a datetime prints) is data
    ("a dated run", re.compile(r"\b20[2-9]\d-[01]\d-[0-3]\d\b(?![T\d]| \d\d:\d\d)")),
    ("CPU time", re.compile(r"\d ?CPU-s\b|\b\d+(\.\d+)? ?(s|ms|µs|us) of CPU\b")),
    ("a rate", re.compile(r"\d ?(M |k )?(rows|records)/s\b|\d ?[MGK]i?B/s\b")),
    ("a speed-up", re.compile(r"\b\d+(\.\d+)? ?x (faster|slower)\b|\b(twice|\w+ times) as fast\b")),
    ("a ratio to a reference", re.compile(r"\b[0-2]\.\d\d?\b (of the|of Spark|against) ")),
    ("ratios side by side", re.compile(r"\b[0-2]\.\d\d\b ?/ ?[0-2]\.\d\d\b")),
    ("a timing", re.compile(r"\b\d+(\.\d+)? ?(to|-) ?\d+(\.\d+)? ?(s|ms)\b (for|a|of|where)\b")),
    (
        "a measured size",
        re.compile(r"\b\d+(\.\d+)? ?(MB|MiB|GB|GiB)\b (measured|of (a )?\w+'s memory)"),
    ),
    (
        "a share of the time",
        re.compile(
            r"\b(a (quarter|third|fifth|tenth)|half|\d+(\.\d+)?%) of the ([\w']+ ){0,3}"
            r"(time|CPU|samples|drain)\b"
        ),
    ),
    ("a target ratio", re.compile(r"\b(target|bar)( of| is|:)? ?(>=? ?)?[0-2]\.\d")),
    ("the machine", re.compile(r"\b(on|by) this (VM|machine)\b(?!')|\bthis machine gives\b")),
    ("a load or a run's noise", re.compile(r"\bload (average )?\d|\bnois(y|ier) runs?\b")),
]

#: Lab notes as the package held them: each must be flagged.
FLAGGED = [
    "Record batches copied, as they arrive, into one chunk per column (issue 35).",
    "recovery never deletes on the strength of a name (issue 55)",
    "see #35 for the runs",
    "measured at stop 12 of the session",
    "the floor as measured on 2026-11-22 with 64K-row batches",
    "0.05 CPU-s for 5 M rows of four columns against 0.08 warm",
    "which took 0.1 s of CPU in each Spark Python process",
    "imports pandas: 389 ms of CPU and 38 MB measured",
    "the floor drained at 4.3 M rows/s",
    "Arrow gathers from one chunk twice as fast as from the batches",
    "entries write and read about a hundred times as fast",
    "a 3.5x faster planner",
    "`reject` over 10 M rows at 0.88 of the floor with 64K rows",
    "two noisier runs gave 0.93 / 0.92",
    "0.06 to 0.47 s for a 20 M-record step",
    "took 0.23-0.29 s of wall",
    "which this machine gives slowly",
    "(on this VM up to 0.4 CPU-s of a 5 M-row task)",
    "at load 1.6-2.0 the reader",
    "imports pandas: 389 ms of CPU and 38 MB\n    measured, in each of Spark's Python workers",
    "which spent a quarter of the encoding time building dictionaries",
    "half of the driver JVM's CPU samples were that search",
    "the planning took 2% of the drain",
    "measures the ratio to Spark's own ``groupBy(window(...))`` (target >= 0.5)",
    "issue 52's bar is 0.7",
]

#: The package's own text that states contracts: none may be flagged.
LEGITIMATE = [
    "2026-12-02 10:00:05+00:00",  # a doctest's printed datetime
    "how long one connection attempt may take (duration; default 5 s)",
    'such as ``"250ms"``, ``"5s"``, ``"1.5 seconds"``, ``"2 minutes"``, ``"1h"``, ``"10us"``',
    "Numbers are read as the decimals they print as (``0.1`` is 100000 us exactly).",
    "Spark's largest timestamp, 9999-12-31T23:59:59.999999Z, in microseconds",
    'rowtime="2006-09-11T12:00:00Z"',
    "(``rowtime_hour=2024-05-01T10``, as the",
    "Spark's watermark ``W`` (ms) is the stream clock minus 1 ms",
    '``("max", ["v#1"])`` for ``max(v#1)`` when the whole expression is one function call',
    "Aggregate [keys], [keys..., max(v#1) AS max_v#7]",
    "a partition's clock at ``next`` (SPEC 6.5)",
    "Spark 4.2 and later pass ``start`` and ``limit``; 4.1 passes neither",
    "Redis entries of 0.1.0 and 0.2.0",
    "a read of system columns only takes them from ``tm`` (17 bytes a record)",
    "Planning a step holds about 18 bytes a record on the driver",
    "a write task of 5 M rows of four columns sorts once",
    "A float is a binary approximation of the decimal its writer meant: 0.29 s is",
    "pauses start at 0.1 s and double up to it",
    "one twice the last, up to ``poll``",
    "``0.25 s``, ``95 s``, ``2 min 5 s``, ``1 h 30 min``",
    "rows per second of this machine's clock",
    "bound = this machine's clock minus ``delay``",
    "ISO-8601 and SDP through Arrow's own parser, several times faster than regex captures",
    "Stop the renewing thread (tests freeze a writer with it; the lease then expires)",
    "a stop during start-up is clean too",
    "from prometheus-client 0.20 on",
    "the segment files of ``_KEPT`` hold at most 64 MiB",
    "(S3's minimum part is 5 MiB)",
    "checksums of blocks of 4 KiB",
]


def lab_notes(text: str) -> list[str]:
    """The lab notes in ``text``: each as what it is and the words that show it."""
    return [f"{what}: {m.group(0)!r}" for what, p in LAB_NOTES for m in p.finditer(text)]


@pytest.mark.parametrize("text", FLAGGED)
def test_the_check_flags_each_shape_a_lab_note_took(text: str) -> None:
    assert lab_notes(text), text


@pytest.mark.parametrize("text", LEGITIMATE)
def test_the_check_leaves_contracts_defaults_and_examples_alone(text: str) -> None:
    assert not lab_notes(text)


def package_folders() -> list[Path]:
    """The folders pyproject.toml maps into the package (the face in src/ and the top-level
    folders), so that a folder added to the package is checked without editing this test."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = pyproject["tool"]["setuptools"]["package-dir"].values()
    return sorted({ROOT / d for d in dirs})


def prose(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of every comment block (comments on consecutive lines read as one text)
    and every string statement (docstrings: a string alone on its logical line) in ``source``,
    their white space made single, since a sentence may wrap anywhere. One pass of the
    tokenizer, which is also what tells a ``#`` in a string from a comment."""
    found: list[tuple[int, list[str]]] = []
    last_comment = -2
    line_start = True  # no token yet on this logical line
    pending: tuple[int, str] | None = None  # a string that began a logical line
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            words = tok.string.lstrip("#:")
            if tok.start[0] == last_comment + 1 and found:
                found[-1][1].append(words)
            else:
                found.append((tok.start[0], [words]))
            last_comment = tok.start[0]
        elif tok.type in (tokenize.NEWLINE, tokenize.ENDMARKER):
            if pending is not None:
                found.append((pending[0], [ast.literal_eval(pending[1])]))
            pending, line_start = None, True
        elif tok.type in (tokenize.NL, tokenize.INDENT, tokenize.DEDENT):
            continue
        else:
            pending = (
                (tok.start[0], tok.string) if line_start and tok.type == tokenize.STRING else None
            )
            line_start = False
    return [(line, " ".join(" ".join(parts).split())) for line, parts in found]


@functools.cache
def package_prose() -> list[tuple[Path, int, str]]:
    """``(file, line, text)`` of the prose of every module of the package, read once."""
    return [
        (path, line, text)
        for folder in package_folders()
        for path in sorted(folder.glob("*.py"))
        for line, text in prose(path.read_text())
    ]


def test_the_check_reads_comments_and_docstrings_not_code() -> None:
    source = (
        '"""Module (issue 1)."""\n'
        "X = 1  # took 2\n"
        "# CPU-s\n"
        'Y = "at 0.88 of the floor"\n'
        "def f():\n"
        '    """At stop 3."""\n'
    )
    texts = [text for _, text in prose(source)]
    assert [bool(lab_notes(t)) for t in texts] == [True, True, True]
    assert not any("0.88" in t for t in texts)


def test_the_package_folders_are_the_face_and_the_top_level_folders() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in package_folders()}
    assert {"src/pyspark_rowtime", "bounds", "datasource", "sink", "streams", "windows"} <= names


def test_no_package_docstring_or_comment_carries_a_measurement_or_an_issue_number() -> None:
    found = [
        f"{path.relative_to(ROOT)}:{line}: {note}"
        for path, line, text in package_prose()
        for note in lab_notes(text)
    ]
    assert not found, (
        "a docstring states the contract and the reason; the figure goes on "
        "docs/benchmarks.md with its date, machine and load:\n" + "\n".join(found)
    )


#: ``docs/benchmarks.md, "The sink"`` or ``docs/benchmarks.md ("Reads that verify")``.
PAGE_SECTION = re.compile(r'docs/benchmarks\.md(?:, | \(|: )"([^"]+)"')


def test_a_docstring_that_sends_the_reader_to_the_benchmarks_page_names_a_section_it_has() -> None:
    page = (ROOT / "docs" / "benchmarks.md").read_text()
    headings = set(re.findall(r"^#+ (.+)$", page, re.M))
    cited = [
        (path, line, section)
        for path, line, text in package_prose()
        for section in PAGE_SECTION.findall(text)
    ]
    assert cited, "the package's docstrings send readers to the page's sections"
    gone = [f"{p.relative_to(ROOT)}:{line}: {s!r}" for p, line, s in cited if s not in headings]
    assert not gone, f"docs/benchmarks.md has no such section: {gone}"
