"""Which model server gets a generation: among those not overloaded, the one that holds most of its prompt.

For each healthy server: its load (requests in flight from this replica, or the server's own count of running and
waiting requests from its `/metrics`, whichever is larger: the servers' counts include other replicas' requests)
and the prompt's leading pages it holds (`held_pages.py`: precise from the built-in engine's page events, else
approximate from what was routed to it). A server whose load exceeds the least loaded one's by more than
`load_slack` is passed over; among the rest, the fewest prompt tokens to prefill wins, then the least load, then
the server the prompt's first page (or its `prompt_cache_key`) hashes to, so that every replica makes the same
choice for the same conversation. So a conversation goes back to the server that holds it, a prefix shared by
many sessions spreads over more servers as the first one fills, and a miss goes to the least loaded server, never
to an overloaded one; a load figure a moment stale (by one request) does not move a conversation.

Page names are those of backends/page_names.py, in the request's namespace: its tenant (and, on the built-in
engine, its `prompt_cache_key` and the server's prefix-cache scope), so one tenant's prefix never attracts or
reveals another's.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Literal

from opentelemetry import trace

from backends.base import GenerateRequest, RoutingReport, ServerReport
from backends.cache_salt import TenantSalt
from backends.page_names import chain, namespace_of
from backends.upstreams import Upstream

from .held_pages import PublishedPages, RoutedPages
from .vllm_events import salt_namespace

How = Literal["prefix", "load", "key"]
LOAD_FRESH_S = 5.0  # a server's reported load older than this is not used
MAX_SHARED_PAGES = 1024  # a prompt's pages looked up in the shared record (32k tokens at 32 a page)


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    page_tokens: int  # the approximate index's page size
    load_slack: float  # a server more loaded than the least loaded by more than this gets nothing
    routed_ttl_s: float
    routed_capacity_pages: int


@dataclass(slots=True)
class ServerView:
    """What the router knows of one server."""

    routed: RoutedPages
    published: PublishedPages | None = None  # None: the server publishes no page events
    reported_load: float = 0.0
    reported_at: float = -1e9
    events_lost: int = 0

    def load(self, outstanding: int) -> float:
        fresh = time.monotonic() - self.reported_at < LOAD_FRESH_S
        return max(float(outstanding), self.reported_load if fresh else 0.0)


@dataclass(frozen=True, slots=True)
class Decision:
    url: str
    how: How
    matched_tokens: int


@dataclass(slots=True)
class RoutingStats:
    routed: dict[str, int] = field(default_factory=lambda: {"prefix": 0, "load": 0, "key": 0})
    prompt_tokens: int = 0
    matched_tokens: int = 0


class _LazyChain:
    """A prompt's page names, hashed only as far as some server holds them, and once for all servers."""

    def __init__(self, names: Iterator[bytes]) -> None:
        self._names = names
        self._known: list[bytes] = []

    def __iter__(self) -> Iterator[bytes]:
        yield from self._known
        for name in self._names:
            self._known.append(name)
            yield name


class _Names:
    """A request's page names by (page size, namespace)."""

    def __init__(self, request: GenerateRequest, limit: int) -> None:
        self._tokens = request.prompt[:limit]
        self._known: dict[tuple[int, bytes], _LazyChain] = {}

    def of(self, page_size: int, namespace: bytes) -> _LazyChain:
        key = (page_size, namespace)
        if key not in self._known:
            self._known[key] = _LazyChain(chain(namespace, self._tokens, page_size))
        return self._known[key]


class PrefixRouter:
    def __init__(
        self, urls: list[str], settings: RoutingSettings, published: bool, salt: TenantSalt | None = None
    ) -> None:
        """`published`: the servers publish their pages (the built-in engine's servers, vLLM's KV events);
        `salt`: each tenant's `cache_salt`, in whose namespace vLLM's pages are named."""
        self.settings = settings
        self.salt = salt
        self.stats = RoutingStats()
        self.servers = {
            url: ServerView(
                RoutedPages(settings.routed_capacity_pages, settings.routed_ttl_s),
                PublishedPages() if published else None,
            )
            for url in urls
        }

    def _tenant_namespace(self, request: GenerateRequest) -> bytes:
        return namespace_of(request.tenant, None, False)

    def _held(self, view: ServerView, request: GenerateRequest, names: _Names, shared: int = 0) -> int:
        """Prompt tokens the server holds at the start of the request's prompt (`shared`: its leading pages by what
        every replica sent it)."""
        published = view.published
        if published is not None and published.in_sync:
            if not published.by_salt:
                namespace = namespace_of(request.tenant, request.cache_key, published.shared_scope)
            elif self.salt is not None:
                namespace = salt_namespace(self.salt(request.tenant))
            else:
                return 0
            return published.held(names.of(published.page_size, namespace)) * published.page_size
        page = self.settings.page_tokens
        return max(view.routed.held(names.of(page, self._tenant_namespace(request))), shared) * page

    def choose(
        self, request: GenerateRequest, candidates: dict[str, int], shared: dict[str, int] | None = None
    ) -> Decision:
        """The server among `candidates` (url → requests in flight to it from here) that costs least; `shared`:
        each server's leading pages of the prompt by what every replica sent it."""
        shared = shared or {}
        prompt = len(request.prompt)
        names = _Names(request, max(prompt - 1, 0))  # the last prompt token is always run
        loads = {url: self.servers[url].load(outstanding) for url, outstanding in candidates.items()}
        ceiling = min(loads.values()) + self.settings.load_slack
        anchor = request.cache_key or self._anchor(request, names)
        scored = []
        for url, load in loads.items():
            if load > ceiling:
                continue  # overloaded beside the others: whatever it holds, it gets no more
            held = min(self._held(self.servers[url], request, names, shared.get(url, 0)), max(prompt - 1, 0))
            scored.append((prompt - held, load, _rendezvous(anchor, url), held, url))
        _, load, _, held, url = min(scored, key=lambda score: (score[0], score[1], -int.from_bytes(score[2])))
        by_key = request.cache_key and sum(1 for score in scored if score[:2] == (prompt, load)) > 1
        how: How = "prefix" if held > 0 else "key" if by_key else "load"
        self.servers[url].routed.add(names.of(self.settings.page_tokens, self._tenant_namespace(request)))
        self.stats.routed[how] += 1
        self.stats.prompt_tokens += prompt
        self.stats.matched_tokens += held
        return Decision(url, how, held)

    def chooser(
        self, request: GenerateRequest, shared: dict[str, int] | None = None
    ) -> Callable[[list[Upstream]], Upstream]:
        """What the upstream pool asks to choose among its healthy upstreams for `request`; the decision is noted
        on the generation's span, when it is traced."""

        def choose(upstreams: list[Upstream]) -> Upstream:
            decision = self.choose(request, {u.url: u.outstanding for u in upstreams}, shared)
            span = trace.get_current_span()
            if span.is_recording():
                span.set_attribute("gateway.route", decision.how)
                span.set_attribute("gateway.route.upstream", decision.url)
                span.set_attribute("gateway.route.matched_tokens", decision.matched_tokens)
            return next(u for u in upstreams if u.url == decision.url)

        return choose

    def report(self, outstanding: dict[str, int]) -> RoutingReport:
        servers = {}
        for url, view in self.servers.items():
            published = view.published
            servers[url] = ServerReport(
                load=view.load(outstanding.get(url, 0)),
                routed_pages=len(view.routed),
                published_pages=len(published.names) if published is not None and published.names is not None else 0,
                events_in_sync=None if published is None else published.in_sync,
            )
        stats = self.stats
        return RoutingReport(dict(stats.routed), stats.prompt_tokens, stats.matched_tokens, servers)

    def _anchor(self, request: GenerateRequest, names: _Names) -> str:
        """What a conversation's requests share from the first: its first page (or, shorter, its namespace)."""
        first = next(iter(names.of(self.settings.page_tokens, self._tenant_namespace(request))), None)
        return (first or self._tenant_namespace(request)).hex()

    @property
    def shares(self) -> bool:
        """Whether what was sent where is the router's knowledge (no server publishes its pages)."""
        return all(view.published is None for view in self.servers.values())

    def shared_scope(self, request: GenerateRequest) -> str:
        """The shared record's scope of a request: these servers (every replica lists the same) and its tenant."""
        fleet = hashlib.blake2b("\0".join(sorted(self.servers)).encode(), digest_size=8).hexdigest()
        return f"{fleet}:{self._tenant_namespace(request).hex()}"

    def shared_names(self, request: GenerateRequest, tokens: list[int] | None = None) -> list[bytes]:
        """The page names the shared record keeps for `tokens` (the request's prompt but its last token)."""
        tokens = request.prompt[: len(request.prompt) - 1] if tokens is None else tokens
        page = self.settings.page_tokens
        return list(chain(self._tenant_namespace(request), tokens[: MAX_SHARED_PAGES * page], page))

    def record(self, url: str, request: GenerateRequest, generated: list[int]) -> None:
        """The server now holds the request's prompt and what it generated (approximately, as far as we know; its
        prompt was noted when it was sent there)."""
        view = self.servers[url]
        tokens = request.prompt + generated
        view.routed.add(chain(self._tenant_namespace(request), tokens[: len(tokens) - 1], self.settings.page_tokens))

    def forget(self, url: str) -> None:
        """The server went away (ejected): what it held is gone."""
        view = self.servers[url]
        view.routed.clear()
        view.reported_at = -1e9
        if view.published is not None:
            view.published.lose()  # its follower takes it up again when the server is back


def _rendezvous(key: str, url: str) -> bytes:
    return hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest()
