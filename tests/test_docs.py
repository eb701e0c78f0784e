"""The README and the pages under docs/: every relative link points at a file that exists
(and, with a `#fragment`, at a heading of it), and every page is linked from the README."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import REPO

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^ *(```|~~~).*?^ *\1", re.M | re.S)


def links(text: str) -> list[str]:
    """The targets of the Markdown links outside fenced code and inline code."""
    prose = FENCE.sub("", text)
    prose = re.sub(r"`[^`\n]*`(?!\])", "", prose)  # inline code, unless it is a link's text
    return LINK.findall(prose)


def anchors(text: str) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file."""
    found = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *$", FENCE.sub("", text), re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", "")).replace(" ", "-")
        found.add(slug)
    return found


def broken(page: Path) -> list[str]:
    problems = []
    for target in links(page.read_text(encoding="utf-8")):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path, _, fragment = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            problems.append(f"{target}: no such file")
        elif fragment and file.suffix == ".md" and fragment not in anchors(file.read_text(encoding="utf-8")):
            problems.append(f"{target}: no heading #{fragment} in {file.name}")
    return problems


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    assert not broken(page), broken(page)


def test_the_checker_finds_a_missing_file_and_a_missing_heading(tmp_path):
    (tmp_path / "a.md").write_text("# A page\n\n## Some `code` here\n", encoding="utf-8")
    page = tmp_path / "b.md"
    page.write_text(
        "[ok](a.md) [ok](a.md#some-code-here) [ok](#b) [web](https://dvc.org)\n"
        "`[not a link](nowhere.md)`\n```text\n[not a link](nowhere.md)\n```\n"
        "[gone](gone.md) [no heading](a.md#elsewhere)\n\n# B\n",
        encoding="utf-8",
    )
    found = broken(page)
    assert len(found) == 2 and found[0].startswith("gone.md") and "#elsewhere" in found[1], found


def test_every_docs_page_is_linked_from_the_readme():
    readme = links((REPO / "README.md").read_text(encoding="utf-8"))
    linked = {(REPO / target.partition("#")[0]).resolve() for target in readme}
    assert not [p.name for p in PAGES[1:] if p.resolve() not in linked]
