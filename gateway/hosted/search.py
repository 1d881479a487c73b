"""Search providers behind the browser tool's `search`: SearXNG (self-hosted, its JSON API) and Brave's
Search API (hosted). The provider's URL is the operator's, so it may be a private address."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import aiohttp

from .settings import SearchSettings

BRAVE_API = "https://api.search.brave.com/res/v1"


@dataclass(frozen=True, slots=True)
class SearchResult:
    title: str
    url: str
    snippet: str


class SearchFailed(Exception):
    """The provider failed; the message is safe to show the model."""


class SearchProvider(Protocol):
    name: str

    async def search(self, query: str, count: int) -> list[SearchResult]: ...

    async def aclose(self) -> None: ...


class _HttpProvider:
    name = "web"

    def __init__(self, settings: SearchSettings) -> None:
        self._settings = settings
        self._session: aiohttp.ClientSession | None = None

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            timeout = aiohttp.ClientTimeout(total=self._settings.timeout_s)
            self._session = aiohttp.ClientSession(timeout=timeout, trust_env=False)
        return self._session

    async def _get_json(self, url: str, params: dict[str, str], headers: dict[str, str]) -> Any:
        try:
            async with self._client().get(url, params=params, headers=headers) as response:
                if response.status != 200:
                    raise SearchFailed(f"the search provider answered HTTP {response.status}")
                return await response.json(content_type=None)
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise SearchFailed(f"the search provider failed ({type(exc).__name__})") from exc

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()


class SearxngProvider(_HttpProvider):
    """GET {url}/search?q=…&format=json (the instance must enable the json format)."""

    async def search(self, query: str, count: int) -> list[SearchResult]:
        base = (self._settings.url or "").rstrip("/")
        data = await self._get_json(f"{base}/search", {"q": query, "format": "json"}, {})
        results = data.get("results") if isinstance(data, dict) else None
        return _results(results, "content")[:count]


class BraveProvider(_HttpProvider):
    """GET {url}/web/search?q=…&count=… with the X-Subscription-Token header."""

    async def search(self, query: str, count: int) -> list[SearchResult]:
        base = (self._settings.url or BRAVE_API).rstrip("/")
        key = self._settings.api_key.get_secret_value() if self._settings.api_key else ""
        headers = {"X-Subscription-Token": key, "Accept": "application/json"}
        data = await self._get_json(f"{base}/web/search", {"q": query, "count": str(count)}, headers)
        web = data.get("web") if isinstance(data, dict) else None
        return _results(web.get("results") if isinstance(web, dict) else None, "description")[:count]


def _results(results: Any, snippet_key: str) -> list[SearchResult]:
    if not isinstance(results, list):
        raise SearchFailed("the search provider's answer had no results list")
    found = []
    for result in results:
        if isinstance(result, dict) and isinstance(result.get("url"), str):
            title = str(result.get("title") or result["url"])
            found.append(SearchResult(title, result["url"], str(result.get(snippet_key) or "")))
    return found


def search_provider(settings: SearchSettings) -> SearchProvider | None:
    if settings.provider == "searxng":
        return SearxngProvider(settings)
    if settings.provider == "brave":
        return BraveProvider(settings)
    return None
