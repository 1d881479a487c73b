"""Harmony's `browser` tool for one response: `search`, `open` and `find`, each result a page on a stack
whose index is its cursor, shown as `[cursor] title (url)` and numbered lines `L{n}: …` that the model
cites as `【{cursor}†L{a}(-L{b})?】`; links show as `【{id}†text】`. Citations in the answer become
`url_citation` annotations."""

from __future__ import annotations

import asyncio
import json
import re
import textwrap
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from .html_text import html_to_text
from .outbound import OutboundRefused, Page, PageFetcher
from .search import SearchFailed, SearchProvider

LINE_WIDTH = 100
VIEW_CHARS = 6000  # about 1.5k tokens of page per view
CITATION = re.compile(r"【(\d+)†L(\d+)(?:-L(\d+))?】")
MAX_FIND_MATCHES = 20


class BrowserError(Exception):
    """A usage error the model sees as the tool's answer."""


@dataclass(slots=True)
class BrowserPage:
    url: str
    title: str
    lines: list[str]
    links: dict[int, str] = field(default_factory=dict)
    is_listing: bool = False  # a search or find result page: `find` does not apply


@dataclass(slots=True)
class BrowserCall:
    text: str  # the tool's answer, for the model
    action: dict[str, Any]  # the web_search_call item's action
    failed: bool = False


def _wrap(text: str) -> list[str]:
    lines: list[str] = []
    for paragraph in text.split("\n"):
        lines.extend(textwrap.wrap(paragraph, LINE_WIDTH, break_on_hyphens=False) or [""])
    return lines


def _read(fetched: Page) -> BrowserPage:
    """A fetched page as the browser shows it: its text (from HTML, or as sent) wrapped into lines."""
    if "html" in fetched.content_type or fetched.text.lstrip()[:15].lower().startswith(("<!doctype", "<html")):
        page = html_to_text(fetched.text, fetched.url)
        title, text, links = page.title, page.text, page.links
        if page.cut:
            text += "\n[the page was cut: it took too long to read]"
    else:
        title, text, links = "", fetched.text, {}
    if fetched.truncated:
        text += "\n[the page was cut at the size limit]"
    return BrowserPage(fetched.url, title or fetched.url, _wrap(text), links)


def _domain(url: str) -> str:
    return urlsplit(url).hostname or url


def _int(value: Any, default: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return default
    return int(value)


class BrowserSession:
    def __init__(self, provider: SearchProvider, fetcher: PageFetcher, max_results: int) -> None:
        self._provider = provider
        self._fetcher = fetcher
        self._max_results = max_results
        self.pages: list[BrowserPage] = []

    async def call(self, name: str, arguments: str) -> BrowserCall:
        try:
            args = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            args = None
        if not isinstance(args, dict):
            return BrowserCall("Error: the arguments are not a JSON object.", {"type": "search"}, failed=True)
        try:
            if name == "search":
                return await self._search(args)
            if name == "open":
                return await self._open(args)
            if name == "find":
                return self._find(args)
        except (BrowserError, SearchFailed, OutboundRefused) as exc:
            return BrowserCall(f"Error: {exc}", _action(name, args), failed=True)
        except (TimeoutError, OSError, aiohttp.ClientError) as exc:
            refusal = _refusal(exc)  # the policy, raised inside aiohttp's resolver, comes back wrapped
            reason = str(refusal) if refusal is not None else f"the page could not be fetched ({type(exc).__name__})."
            return BrowserCall(f"Error: {reason}", _action(name, args), True)
        return BrowserCall(f"Error: browser has no function `{name}`.", {"type": "search"}, failed=True)

    async def _search(self, args: dict[str, Any]) -> BrowserCall:
        query = str(args.get("query") or "").strip()
        if not query:
            raise BrowserError("`query` is required.")
        topn = max(1, min(_int(args.get("topn"), self._max_results), self._max_results))
        results = await self._provider.search(query, topn)
        lines: list[str] = []
        links: dict[int, str] = {}
        for result in results:
            link_id = len(links)
            links[link_id] = result.url
            lines.append(f"【{link_id}†{_clean(result.title)}†{_domain(result.url)}】")
            lines.extend(_wrap(result.snippet) if result.snippet else [])
            lines.append("")
        if not results:
            lines = [f"No results for `{query}`."]
        page = BrowserPage("", f"Search results for `{query}`", lines, links, is_listing=True)
        action = {"type": "search", "query": query, "sources": [{"type": "url", "url": url} for url in links.values()]}
        return BrowserCall(self._show(page, 0, -1), action)

    async def _open(self, args: dict[str, Any]) -> BrowserCall:
        target = args.get("id", -1)
        loc = _int(args.get("loc"), -1)
        num_lines = _int(args.get("num_lines"), -1)
        if isinstance(target, str):
            page = await self._fetch(target)
        else:
            current = self._page(_int(args.get("cursor"), -1))
            link_id = _int(target, -1)
            if link_id < 0:  # scroll the page
                return BrowserCall(
                    self._show(current, max(loc, 0), num_lines), {"type": "open_page", "url": current.url}
                )
            if link_id not in current.links:
                raise BrowserError(f"Invalid link id `{link_id}`.")
            page = await self._fetch(current.links[link_id])
        return BrowserCall(self._show(page, max(loc, 0), num_lines), {"type": "open_page", "url": page.url})

    def _find(self, args: dict[str, Any]) -> BrowserCall:
        pattern = str(args.get("pattern") or "")
        if not pattern:
            raise BrowserError("`pattern` is required.")
        page = self._page(_int(args.get("cursor"), -1))
        if page.is_listing:
            raise BrowserError("`find` does not apply to search or find results; open a page first.")
        lines: list[str] = []
        needle = pattern.lower()
        matches = 0
        for index, line in enumerate(page.lines):
            if needle in line.lower():
                lines.append(f"# 【{matches}†match at L{index}】")
                lines.extend(page.lines[index : index + 4])
                lines.append("")
                matches += 1
                if matches == MAX_FIND_MATCHES:
                    break
        if not matches:
            lines = [f"No `find` results for pattern: `{pattern}`"]
        found = BrowserPage(page.url, f"Find results for `{pattern}` in `{page.title}`", lines, is_listing=True)
        return BrowserCall(self._show(found, 0, -1), {"type": "find_in_page", "url": page.url, "pattern": pattern})

    async def _fetch(self, url: str) -> BrowserPage:
        fetched = await self._fetcher.fetch(url)
        return await asyncio.to_thread(_read, fetched)  # never on the event loop: megabytes of text to wrap

    def _page(self, cursor: int) -> BrowserPage:
        if not self.pages:
            raise BrowserError("No pages are open yet; search or open a URL first.")
        if cursor == -1:
            return self.pages[-1]
        if not 0 <= cursor < len(self.pages):
            raise BrowserError(f"Cursor `{cursor}` is out of range [0 - {len(self.pages) - 1}].")
        return self.pages[cursor]

    def _show(self, page: BrowserPage, loc: int, num_lines: int) -> str:
        """Push the page as a new cursor and display a view of it."""
        total = len(page.lines)
        if loc >= max(total, 1):
            raise BrowserError(f"Invalid location `{loc}`: the page has {total} lines.")
        self.pages.append(page)
        cursor = len(self.pages) - 1
        end = total if num_lines <= 0 else min(total, loc + num_lines)
        shown: list[str] = []
        size = 0
        for index in range(loc, end):
            line = f"L{index}: {page.lines[index]}"
            if shown and size + len(line) > VIEW_CHARS and num_lines <= 0:
                break
            shown.append(line)
            size += len(line) + 1
        last = loc + len(shown) - 1
        where = f" ({page.url})" if page.url else ""
        header = f"[{cursor}] {page.title}{where}\n**viewing lines [{loc} - {last}] of {max(total - 1, 0)}**\n\n"
        return header + "\n".join(shown)

    def citations(self, text: str) -> list[dict[str, Any]]:
        """url_citation annotations for the `【cursor†Ln-Lm】` marks in an answer (character offsets)."""
        annotations = []
        for match in CITATION.finditer(text):
            cursor = int(match.group(1))
            if cursor >= len(self.pages) or not self.pages[cursor].url:
                continue
            page = self.pages[cursor]
            annotations.append(
                {
                    "type": "url_citation",
                    "start_index": match.start(),
                    "end_index": match.end(),
                    "url": page.url,
                    "title": page.title,
                }
            )
        return annotations


def _clean(text: str) -> str:
    return text.replace("†", "").replace("】", "").replace("\n", " ").strip()


def _action(name: str, args: dict[str, Any]) -> dict[str, Any]:
    if name == "open":
        target = args.get("id")
        return {"type": "open_page", "url": target if isinstance(target, str) else None}
    if name == "find":
        return {"type": "find_in_page", "url": "", "pattern": str(args.get("pattern") or "")}
    return {"type": "search", "query": str(args.get("query") or "")}


def _refusal(exc: BaseException) -> OutboundRefused | None:
    """The outbound policy's refusal behind a client error, however aiohttp wrapped it."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, OutboundRefused):
            return current
        seen.add(id(current))
        wrapped = getattr(current, "os_error", None)  # aiohttp's ClientConnectorError keeps the resolver's error
        current = wrapped if isinstance(wrapped, BaseException) else current.__cause__ or current.__context__
    return None
