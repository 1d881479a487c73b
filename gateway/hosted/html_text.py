"""HTML to the browser tool's text: readable lines, each link shown as `【{id}†{text}】` with its URL kept.

Pages are hostile input: they are parsed by lexbor (through selectolax), an HTML5 parser in C that is linear
on any input (Python's html.parser is quadratic on unclosed tags: a 60 kB page of `<a <a <a …` took 31 s),
and the walk over the parsed tree stops at a time budget. The browser runs this in a worker thread, never
on the event loop.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from urllib.parse import urljoin

from selectolax.lexbor import LexborHTMLParser, LexborNode

_SKIPPED = frozenset({"script", "style", "noscript", "template", "svg", "head", "iframe", "title"})
_BLOCKS = frozenset(
    {"p", "div", "br", "li", "ul", "ol", "tr", "table", "section", "article", "header", "footer", "nav", "main"}
    | {"h1", "h2", "h3", "h4", "h5", "h6", "pre", "blockquote", "dd", "dt", "hr", "form", "aside", "figure"}
)
_SPACES = re.compile(r"[ \t\r\f\v]+")
_TAG = re.compile(r"<(/?)([A-Za-z][A-Za-z0-9:-]{0,40})")
# elements that never enclose others, or whose end the parser implies: they do not deepen the tree
_FLAT = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr", "param"}
    | {"p", "li", "dt", "dd", "tr", "td", "th", "option", "optgroup", "thead", "tbody", "tfoot", "colgroup"}
)
MAX_DEPTH = 256  # lexbor's tree building costs a walk over the open elements per tag: deeper pages are flattened
BUDGET_S = 2.0  # of walking one page's tree; what is left past it is cut, and the page says so
_CLOCK_EVERY = 1024  # nodes between looks at the clock


@dataclass
class PageText:
    title: str
    text: str
    links: dict[int, str] = field(default_factory=dict)
    cut: bool = False  # the time budget ended the walk before the page's end


def html_to_text(html: str, base_url: str, budget_s: float = BUDGET_S) -> PageText:
    tree = LexborHTMLParser(_bounded_depth(html))
    title_node = tree.css_first("title")
    title = _SPACES.sub(" ", title_node.text(deep=True)).strip() if title_node is not None else ""
    parts: list[str] = []
    links: dict[int, str] = {}
    deadline = time.monotonic() + budget_s
    stack: list[tuple[LexborNode, bool]] = [(tree.root, False)] if tree.root is not None else []
    visited, cut = 0, False
    while stack:
        visited += 1
        if visited % _CLOCK_EVERY == 0 and time.monotonic() > deadline:
            cut = True
            break
        node, leaving = stack.pop()
        tag = node.tag or ""
        if leaving:
            parts.append("\n")  # only blocks are revisited
            continue
        if tag == "-text":
            parts.append(node.text_content or "")
            continue
        if tag in _SKIPPED or tag.startswith("-"):  # comments, doctype and what a reader never sees
            continue
        if tag == "a" and _add_link(node, base_url, parts, links):
            continue
        if tag in _BLOCKS:
            parts.append("\n")
            stack.append((node, True))
        stack.extend((child, False) for child in reversed(_children(node)))
    lines = [_SPACES.sub(" ", line).strip() for line in "".join(parts).split("\n")]
    text = re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip()
    return PageText(title, text, links, cut)


def _bounded_depth(html: str) -> str:
    """The page with every start tag that would nest past MAX_DEPTH written as text (one linear pass; an end
    tag closes up to its element when that is open and is ignored otherwise, as the parser will)."""
    pieces: list[str] = []
    open_names: list[str] = []
    open_count: dict[str, int] = {}
    copied = 0
    for match in _TAG.finditer(html):
        name = match.group(2).lower()
        if name in _FLAT:
            continue
        if match.group(1):
            if open_count.get(name):
                while (closed := open_names.pop()) != name:
                    open_count[closed] -= 1
                open_count[name] -= 1
        elif len(open_names) < MAX_DEPTH:
            open_names.append(name)
            open_count[name] = open_count.get(name, 0) + 1
        else:
            pieces += (html[copied : match.start()], "&lt;")
            copied = match.start() + 1
    return "".join(pieces) + html[copied:] if pieces else html


def _children(node: LexborNode) -> list[LexborNode]:
    children = []
    child = node.child
    while child is not None:
        children.append(child)
        child = child.next
    return children


def _add_link(node: LexborNode, base_url: str, parts: list[str], links: dict[int, str]) -> bool:
    """A link with a target becomes `【id†text】` (its text only, nothing inside it walked again)."""
    href = node.attributes.get("href")
    if not href or href.startswith(("javascript:", "#", "mailto:")):
        return False
    text = _SPACES.sub(" ", node.text(deep=True, separator="")).strip().replace("†", "").replace("】", "")
    try:
        url = urljoin(base_url, href)
    except ValueError:  # a malformed address (e.g. an unclosed IPv6 bracket): the text stays, unlinked
        parts.append(text)
        return True
    if text:
        link_id = len(links)
        links[link_id] = url
        parts.append(f"【{link_id}†{text}】")
    return True
