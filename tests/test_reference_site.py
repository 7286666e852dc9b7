"""The API reference, as the built site shows it, renders every public name's docstring.

mkdocs builds the site (``mkdocs build --strict`` into a temporary folder, or the site
``./dev docs`` just built, named by ``ROWTIME_SITE``), and the reference page's HTML is read:
a Sphinx role left in a docstring (``:func:`x```) shows literally, a section mkdocstrings did not
parse (a docstring style other than mkdocs.yml's) shows as a paragraph starting ``Args:``, and a
public name missing from docs/reference.md has no anchor. Without MkDocs installed (the docs
extra is not in ``.[dev]``) the test skips, saying so; ``./dev docs`` runs it after its build.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

import pyspark_rowtime as rt

ROOT = Path(__file__).resolve().parent.parent

#: The section titles of Google-style docstrings; a paragraph opening with one is unparsed.
SECTIONS = ("Args", "Arguments", "Parameters", "Returns", "Raises", "Yields", "Examples", "Note")
#: A role's name as it shows once the Markdown made its target a code span (``:meth:`x```
#: renders as ``:meth:<code>x</code>``).
ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|data|attr|exc|obj|const):")


@pytest.fixture(scope="module")
def reference_html(tmp_path_factory: pytest.TempPathFactory) -> str:
    built = os.environ.get("ROWTIME_SITE")
    if built:
        site = Path(built)
    else:
        pytest.importorskip("mkdocs", reason="the docs extra (./dev docs installs it)")
        pytest.importorskip("mkdocstrings_handlers.python", reason="the docs extra")
        site = tmp_path_factory.mktemp("site")
        env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
        done = subprocess.run(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(site)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stderr[-3000:]}"
    return (site / "reference" / "index.html").read_text()


class Page(HTMLParser):
    """The ids of a page, and the text of each paragraph outside code, with whether it holds a
    rendered section title (mkdocstrings' ``doc-section-title``)."""

    def __init__(self) -> None:
        super().__init__()
        self.ids: set[str] = set()
        self.paragraphs: list[tuple[str, bool]] = []
        self.text: list[str] = []  # all text outside <code> and <pre>
        self._code = 0
        self._p: list[str] | None = None
        self._titled = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if a.get("id"):
            self.ids.add(str(a["id"]))
        if tag in ("code", "pre"):
            self._code += 1
        if tag == "p":
            self._p, self._titled = [], False
        if "doc-section-title" in (a.get("class") or "").split():
            self._titled = True

    def handle_endtag(self, tag: str) -> None:
        if tag in ("code", "pre"):
            self._code -= 1
        if tag == "p" and self._p is not None:
            self.paragraphs.append(("".join(self._p).strip(), self._titled))
            self._p = None

    def handle_data(self, data: str) -> None:
        if self._code == 0:
            self.text.append(data)
        if self._p is not None:
            self._p.append(data)


@pytest.fixture(scope="module")
def page(reference_html: str) -> Page:
    parsed = Page()
    parsed.feed(reference_html)
    return parsed


def test_no_docstring_role_shows_literally(page: Page) -> None:
    text = "".join(page.text)
    found = sorted({text[max(0, m.start() - 40) : m.end() + 30] for m in ROLE.finditer(text)})
    assert not found, f"Sphinx roles in the reference (write [name][path] links): {found}"


def test_every_section_is_parsed(page: Page) -> None:
    unparsed = [
        p
        for p, titled in page.paragraphs
        if not titled and re.match(rf"^(?:{'|'.join(SECTIONS)}):", p)
    ]
    assert not unparsed, f"sections shown as paragraphs (not Google style?): {unparsed[:5]}"
    titled = [p for p, t in page.paragraphs if t]
    assert {"Parameters:", "Returns:", "Raises:", "Examples:"} <= set(titled), titled[:10]


def test_every_public_name_is_in_the_reference(page: Page) -> None:
    missing = []
    for name in rt.__all__:
        obj = getattr(rt, name)
        anchor = f"{obj.__module__}.{obj.__qualname__}"
        if anchor not in page.ids:
            missing.append(f"{name} ({anchor})")
    assert not missing, f"add to docs/reference.md: {missing}"


def test_the_reference_links_its_cross_references(page: Page, reference_html: str) -> None:
    # A cross-reference renders as a link to the object's anchor on the page.
    assert 'href="#pyspark_rowtime.watermark.with_watermark"' in reference_html
    assert 'href="#pyspark_rowtime.api.get_rowtime_bound"' in reference_html


def test_no_sphinx_role_in_the_package_source() -> None:
    # mkdocstrings renders Markdown: a role shows literally wherever a docstring is rendered.
    # Write [name][pyspark_rowtime.module.name] for a link, ``name`` for code.
    dirs = [
        "src/pyspark_rowtime",
        "bounds",
        "streams",
        "datasource",
        "sink",
        "windows",
        "connectors",
    ]
    found = [
        f"{path.relative_to(ROOT)}:{text[: m.start()].count(chr(10)) + 1}"
        for d in dirs
        for path in sorted((ROOT / d).rglob("*.py"))
        for text in [path.read_text()]
        for m in ROLE.finditer(text)
    ]
    assert not found, f"Sphinx roles: {found[:20]}"
