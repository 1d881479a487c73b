"""The README and the docs link only to what exists: every relative link names a file in the repository, and every
`#anchor` into a Markdown page names one of its headings (as GitHub makes anchors of them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """GitHub's anchors of a page's headings: lower case, punctuation but - and _ dropped, spaces to -."""
    anchors = set()
    for line in page.read_text().splitlines():
        if line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_relative_link_resolves(page: Path):
    broken = []
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)  # code blocks hold no links
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        path, _, anchor = target.partition("#")
        resolved = (page.parent / path).resolve() if path else page
        missing_anchor = resolved.exists() and anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved)
        if not resolved.exists() or missing_anchor:
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"


def test_the_front_page_stays_short_and_every_docs_page_is_linked_from_it():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 150
    linked = {Path(target.partition("#")[0]).name for target in LINK.findall(readme)}
    unlinked = [page.name for page in PAGES[1:] if page.name not in linked]
    assert not unlinked, f"docs pages the README does not lead to: {unlinked}"
