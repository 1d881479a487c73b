"""HTML to the browser tool's text: readable lines, each link shown as `【{id}†{text}】` with its URL kept."""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urljoin

_SKIPPED = frozenset({"script", "style", "noscript", "template", "svg", "head", "iframe"})
_BLOCKS = frozenset(
    {"p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header", "footer", "nav", "main"}
    | {"h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "dd", "dt", "hr", "form", "aside", "figure"}
)
_SPACES = re.compile(r"[ \t\r\f\v]+")


class _Collector(HTMLParser):
    def __init__(self, base_url: str) -> None:
        super().__init__(convert_charrefs=True)
        self.base_url = base_url
        self.parts: list[str] = []
        self.links: dict[int, str] = {}
        self.title = ""
        self._skipping = 0
        self._in_title = False
        self._link: tuple[str, list[str]] | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "title":
            self._in_title = True
        if tag in _SKIPPED:
            self._skipping += 1
        elif tag in _BLOCKS:
            self.parts.append("\n")
        elif tag == "a" and self._skipping == 0:
            href = dict(attrs).get("href")
            if href and not href.startswith(("javascript:", "#", "mailto:")):
                self._link = (urljoin(self.base_url, href), [])

    def handle_endtag(self, tag: str) -> None:
        if tag == "title":
            self._in_title = False
        if tag in _SKIPPED:
            self._skipping = max(0, self._skipping - 1)
        elif tag in _BLOCKS:
            self.parts.append("\n")
        elif tag == "a" and self._link is not None:
            url, words = self._link
            self._link = None
            text = _SPACES.sub(" ", "".join(words)).strip().replace("†", "").replace("】", "")
            if text:
                link_id = len(self.links)
                self.links[link_id] = url
                self.parts.append(f"【{link_id}†{text}】")

    def handle_data(self, data: str) -> None:
        if self._in_title:
            self.title += data
        if self._skipping:
            return
        if self._link is not None:
            self._link[1].append(data)
        else:
            self.parts.append(data)


def html_to_text(html: str, base_url: str) -> tuple[str, str, dict[int, str]]:
    """(title, text, links by id) of an HTML page."""
    collector = _Collector(base_url)
    collector.feed(html)
    collector.close()
    lines = [_SPACES.sub(" ", line).strip() for line in "".join(collector.parts).split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return _SPACES.sub(" ", collector.title).strip(), text, collector.links
