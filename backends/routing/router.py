"""Which model server gets a generation: among those not overloaded, the one where its first token comes soonest.

For each healthy server: its load (requests in flight from this replica, or the server's own count of running and
waiting requests, whichever is larger: the servers' counts include other replicas' requests; the built-in
engine's servers push theirs on their page-event stream as it changes, others are read from their `/metrics`),
the prompt tokens queued there before their first tokens (the built-in engine's servers push theirs; else those of
the requests this replica sent that have not begun to answer), and the prompt's leading pages it holds
(`held_pages.py`: precise from the built-in engine's page events, else approximate from what was routed to it).
A server whose load exceeds the least loaded one's by more than `load_slack` is passed over, and so is a full one
while another has a free slot: one with as many requests as it runs at once (the `slots` the built-in engine's
servers publish, or `server_slots`), or, its slots unknown, that says requests are waiting. Among the rest, the
fewest prompt tokens to run before the request's first token wins: those of its prompt the server does not hold,
and those queued there that run before it (each queued prompt's up to as many as its own: prompts fill side by
side; Dynamo's KV router weighs blocks to prefill against active blocks likewise); then the least load; then the
server the prompt hashes to, so that every replica makes the same choice for the same request and sessions
starting at once on one shared prompt break their ties apart. A server holding less than `min_match` of the
prompt counts as holding none (SGLang's router has the same threshold), so the opening every conversation shares
(Harmony's system message) does not pile new conversations onto one server; and when no server holds enough, a
request with a `prompt_cache_key` goes to the server its key hashes to among the least loaded.

So a conversation goes back to the server that holds it while that server has room; a prefix many sessions share
(a tenant's long system prompt) stays on the servers holding it while they have room within `load_slack`, and
spreads one server at a time beyond that, the requests right after going where it is held rather than where it
is still being run; and a miss goes where the fewest prompt tokens are queued, never to an overloaded server. A
hot shared prefix is also sent ahead to a lighter server that does not hold it (warming.py), which gets no request
on it from this replica until that prefill has run while a server holding it has room; with none left, it counts as
holding the prefix behind all that is queued there, the warm-up among them (a request waits there for that prefill,
which the built-in engine runs once, rather than on a full holder for a slot).

Page names are those of backends/page_names.py, in the request's namespace: its tenant (and, on the built-in
engine, its `prompt_cache_key` and the server's prefix-cache scope), so one tenant's prefix never attracts or
reveals another's.
"""

from __future__ import annotations

import array
import collections
import hashlib
import time
from dataclasses import dataclass, field
from typing import Literal

from opentelemetry import trace

from backends.base import GenerateRequest, RoutingReport, ServerLoad, ServerReport
from backends.cache_salt import TenantSalt
from backends.page_names import LazyChain, chain, namespace_of
from backends.upstreams import Upstream

from .held_pages import PublishedPages, RoutedPages
from .vllm_events import salt_namespace
from .warming import PrefixWarming

How = Literal["prefix", "load", "key"]
LOAD_FRESH_S = 5.0  # a server's reported load older than this is not used
MAX_SHARED_PAGES = 1024  # a prompt's pages looked up in the shared record (32k tokens at 32 a page)


@dataclass(frozen=True, slots=True)
class RoutingSettings:
    page_tokens: int  # the approximate index's page size
    load_slack: float  # a server more loaded than the least loaded by more than this gets nothing
    routed_ttl_s: float
    routed_capacity_pages: int
    min_match: float = 0.3  # a server holding less of a prompt than this share is no reason to go there
    server_slots: int | None = None  # requests a server runs at once, where it does not say (None: unknown)
    warm_min_tokens: int = 0  # a hot prefix this long or longer is sent ahead to a lighter server (0: never)
    warm_window_s: float = 60.0  # sessions matching a prefix this close together make it hot (warming.py)


@dataclass(slots=True)
class ServerView:
    """What the router knows of one server."""

    routed: RoutedPages
    published: PublishedPages | None = None  # None: the server publishes no page events
    reported: tuple[float, float] = (0.0, 0.0)  # running and waiting, read from its /metrics at `reported_at`
    reported_at: float = -1e9
    pushed: ServerLoad | None = None  # from its event stream as it changes
    slots: int | None = None  # requests it runs at once; one more waits (None: unknown)
    # the prompt tokens to run of each request sent from here that has not begun to answer: how many of each size
    sent: collections.Counter[int] = field(default_factory=collections.Counter)

    def queued(self) -> int:
        """Prompt tokens to run there before their first tokens: its own count, or (larger) this replica's."""
        pushed = self.pushed.filling if self.pushed is not None else 0
        return max(pushed, sum(tokens * count for tokens, count in self.sent.items()))

    def queued_before(self, tokens: int) -> int:
        """Of those, about how many run before a prompt of `tokens` to run sent now has its first token: each queued
        prompt's, up to `tokens` (prompts fill side by side: the built-in engine runs a tenant's shortest first and
        tenants by their shares, llama.cpp its slots at once, vLLM the prompts its step's token budget holds)."""
        own = sum(min(size, tokens) * count for size, count in self.sent.items())
        if self.pushed is None or not self.pushed.filling:
            return own
        total, prompts = self.pushed.filling, max(self.pushed.filling_prompts, 1)
        return max(own, round(prompts * min(total / prompts, tokens)))  # its prompts taken as alike

    def _counts(self) -> tuple[float, float]:
        """The server's own running and waiting requests, as last known ((0, 0): not known)."""
        if self.pushed is not None:
            return self.pushed.running, self.pushed.waiting
        fresh = time.monotonic() - self.reported_at < LOAD_FRESH_S
        return self.reported if fresh else (0.0, 0.0)

    def load(self, outstanding: int) -> float:
        running, waiting = self._counts()
        return max(float(outstanding), running + waiting)

    def full(self, load: float) -> bool:
        """Whether one more request would wait for a slot: as many as its slots, or (slots unknown) some already
        waiting. A request just arrived counts as waiting until the server's next step takes it in: where the
        slots are known, the count is what says."""
        if self.slots is not None:
            return load >= self.slots
        return self._counts()[1] > 0


@dataclass(frozen=True, slots=True)
class Warm:
    """A server to send a hot prefix to (warming.py): the request's first `tokens` prompt tokens, their last page
    named `prefix`."""

    url: str
    tokens: int
    prefix: bytes


@dataclass(frozen=True, slots=True)
class Decision:
    url: str
    how: How
    matched_tokens: int
    prompt_tokens: int  # of its prompt, those the server runs (not held there)
    warm: Warm | None = None


class Sending:
    """A request sent to a server: its prompt tokens to run counted there until it begins to answer, when the
    server holds its prompt (noted in what was routed there: a prompt still running there is no prefix held)."""

    def __init__(self, view: ServerView, tokens: int, names: list[bytes]) -> None:
        self._view = view
        self._tokens: int | None = tokens
        self._names = names
        view.sent[tokens] += 1

    def answering(self) -> None:
        """It began to answer: its prompt is held there, and counted as queued no more."""
        if self._tokens is not None:
            self._view.routed.add(self._names)
        self.done()

    def done(self) -> None:
        """Its attempt ended (or it answers): counted no more (once, however often called)."""
        if self._tokens is None:
            return
        sent = self._view.sent
        sent[self._tokens] -= 1
        if sent[self._tokens] <= 0:
            del sent[self._tokens]
        self._tokens = None


class Choice:
    """What the upstream pool asks to choose among its healthy upstreams for a request (`decision`: what it chose
    last; None where the pool did not ask)."""

    def __init__(
        self, router: PrefixRouter, request: GenerateRequest, shared: dict[str, int] | None, names: PromptPages | None
    ) -> None:
        self._router, self._request, self._shared = router, request, shared
        self._names = names or router.pages(request)
        self.decision: Decision | None = None

    def __call__(self, upstreams: list[Upstream]) -> Upstream:
        outstanding = {u.url: u.outstanding for u in upstreams}
        decision = self.decision = self._router.choose(self._request, outstanding, self._shared, self._names)
        span = trace.get_current_span()
        if span.is_recording():
            span.set_attribute("gateway.route", decision.how)
            span.set_attribute("gateway.route.upstream", decision.url)
            span.set_attribute("gateway.route.matched_tokens", decision.matched_tokens)
        return next(u for u in upstreams if u.url == decision.url)

    def sending(self, upstream: Upstream) -> Sending:
        """The request sent to `upstream`: its prompt tokens to run counted there until it begins to answer (all of
        them where the pool chose without asking)."""
        decision = self.decision
        own = decision is not None and decision.url == upstream.url
        tokens = decision.prompt_tokens if own and decision is not None else len(self._request.prompt)
        return self._router.sending(upstream.url, tokens, self._names)


@dataclass(slots=True)
class RoutingStats:
    routed: dict[str, int] = field(default_factory=lambda: {"prefix": 0, "load": 0, "key": 0})
    prompt_tokens: int = 0
    matched_tokens: int = 0


class PromptPages:
    """A request's page names by (page size, namespace): each chain hashed once, and only as far as it is read."""

    def __init__(self, request: GenerateRequest, routed_namespace: bytes, page_tokens: int) -> None:
        self._tokens = request.prompt[: max(len(request.prompt) - 1, 0)]  # the last prompt token is always run
        self._routed = (page_tokens, routed_namespace)
        self._known: dict[tuple[int, bytes], LazyChain] = {}
        self._routed_names: list[bytes] | None = None

    def of(self, page_size: int, namespace: bytes) -> LazyChain:
        key = (page_size, namespace)
        if key not in self._known:
            self._known[key] = LazyChain(chain(namespace, self._tokens, page_size))
        return self._known[key]

    def routed(self) -> list[bytes]:
        """The names under which what was sent where is recorded: the prompt's whole chain (hashed once)."""
        if self._routed_names is None:
            self._routed_names = list(self.of(*self._routed))
        return self._routed_names


class PrefixRouter:
    def __init__(
        self, urls: list[str], settings: RoutingSettings, published: bool, salt: TenantSalt | None = None
    ) -> None:
        """`published`: the servers publish their pages (the built-in engine's servers, vLLM's KV events);
        `salt`: each tenant's `cache_salt`, in whose namespace vLLM's pages are named."""
        self.settings = settings
        self.salt = salt
        self._fleet = hashlib.blake2b("\0".join(sorted(urls)).encode(), digest_size=8).hexdigest()
        self.stats = RoutingStats()
        self.warming = PrefixWarming(settings.warm_window_s)
        self.servers = {
            url: ServerView(
                RoutedPages(settings.routed_capacity_pages, settings.routed_ttl_s),
                PublishedPages() if published else None,
                slots=settings.server_slots,
            )
            for url in urls
        }

    def _tenant_namespace(self, request: GenerateRequest) -> bytes:
        return namespace_of(request.tenant, None, False)

    def pages(self, request: GenerateRequest) -> PromptPages:
        """The request's page names, for one choice and what follows it (the shared record, `record`)."""
        return PromptPages(request, self._tenant_namespace(request), self.settings.page_tokens)

    def _held(self, view: ServerView, request: GenerateRequest, names: PromptPages, shared: int = 0) -> int:
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
        self,
        request: GenerateRequest,
        candidates: dict[str, int],
        shared: dict[str, int] | None = None,
        names: PromptPages | None = None,
    ) -> Decision:
        """The server among `candidates` (url → requests in flight to it from here) that costs least; `shared`:
        each server's leading pages of the prompt by what every replica sent it."""
        shared = shared or {}
        prompt = len(request.prompt)
        names = names or self.pages(request)
        enough = self.settings.min_match * prompt
        holds = {
            url: min(self._held(self.servers[url], request, names, shared.get(url, 0)), max(prompt - 1, 0))
            for url in candidates
        }
        holds = {url: held if held >= enough else 0 for url, held in holds.items()}  # a shared opening alone
        # (Harmony's system message) pulls nowhere
        prefix = self._shared_prefix(names, max(holds.values()))
        loads = every = {url: self.servers[url].load(outstanding) for url, outstanding in candidates.items()}
        lightest = min(loads.values())
        # overloaded beside the others: whatever it holds, it gets no more; nor does a full server while another
        # has a free slot (a request queued there would wait for a whole answer to end)
        loads = {url: load for url, load in loads.items() if load <= lightest + self.settings.load_slack}
        with_room = {url: load for url, load in loads.items() if not self.servers[url].full(load)}
        loads = with_room or loads
        # a server this replica is sending the prefix ahead to gets nothing on it while a holder is left: the request
        # would wait there for that prefill, on a holder at most for a slot; with none left, it counts as holding the
        # prefix, behind all that is queued there (the warm-up among them)
        warming = self.warming.at(prefix[0]) if prefix is not None else set()
        if any(holds[url] for url in loads if url not in warming):
            loads = {url: load for url, load in loads.items() if url not in warming}
        elif prefix is not None:
            holds |= {url: max(holds[url], prefix[1]) for url in warming & loads.keys()}
        anchor = request.cache_key or self._anchor(request, names)
        scored = []
        for url, load in loads.items():
            to_run = prompt - holds[url]
            view = self.servers[url]
            cost = to_run + (view.queued() if url in warming else view.queued_before(to_run))
            scored.append((cost, load, _rendezvous(anchor, url), holds[url], url))
        if request.cache_key and all(score[3] == 0 for score in scored):
            # nothing of the prompt anywhere: the key's own server among the least loaded (every replica alike where
            # they see the same loads; with all those left, six Codex sessions' keys hashed 3, 2 and 1 over three
            # servers ran 2.9, 1.6 and 0.6 requests at a time in bench/fleet_routing_bench.py)
            least = min(score[1] for score in scored)
            _, _, _, held, url = max((s for s in scored if s[1] <= least), key=lambda s: int.from_bytes(s[2]))
            how: How = "key"
        else:
            _, _, _, held, url = min(scored, key=lambda score: (score[0], score[1], -int.from_bytes(score[2])))
            how = "prefix" if held > 0 else "load"
        self.stats.routed[how] += 1
        self.stats.prompt_tokens += prompt
        self.stats.matched_tokens += held
        warm = None
        if how == "prefix" and prefix is not None:
            warm = self._warm(request, prefix, holds, every, url)
        return Decision(url, how, held, prompt - held, warm)

    def _shared_prefix(self, names: PromptPages, held: int) -> tuple[bytes, int] | None:
        """Of the `held` leading prompt tokens, the whole routed pages: the last one's name and their tokens, where
        they are long enough to send ahead (None: not, or warming off)."""
        page = self.settings.page_tokens
        pages = min(held // page, len(names.routed()))
        if not self.settings.warm_min_tokens or pages * page < self.settings.warm_min_tokens:
            return None
        return names.routed()[pages - 1], pages * page

    def _warm(
        self,
        request: GenerateRequest,
        prefix: tuple[bytes, int],
        holds: dict[str, int],
        loads: dict[str, float],
        chosen: str,
    ) -> Warm | None:
        """The server to send the request's first `tokens` prompt tokens to (`prefix`: the name of their last page,
        and `tokens`), if they are hot and a healthy server lighter than the chosen one does not hold them (`holds`:
        what each server holds of the prompt, 0 below `min_match`; warming.py)."""
        name, tokens = prefix
        own = hashlib.blake2b(array.array("q", request.prompt[tokens:]).tobytes(), digest_size=8).digest()
        if not self.warming.hot(name, own):  # own: what its prompt holds after the prefix
            return None
        cold = [
            url
            for url, load in loads.items()
            if load < loads[chosen] and not holds[url] and self.warming.may_warm(name, url)
        ]
        if not cold:
            return None
        url = min(cold, key=lambda u: (loads[u], _rendezvous(name.hex(), u)))
        self.warming.start(name, url)
        return Warm(url, tokens, name)

    def sending(self, url: str, tokens: int, names: PromptPages) -> Sending:
        """A request with `tokens` of its prompt to run sent to `url`."""
        return Sending(self.servers[url], tokens, names.routed())

    def chooser(
        self, request: GenerateRequest, shared: dict[str, int] | None = None, names: PromptPages | None = None
    ) -> Choice:
        """What the upstream pool asks to choose among its healthy upstreams for `request`; the decision is noted
        on the generation's span, when it is traced."""
        return Choice(self, request, shared, names)

    def report(self, outstanding: dict[str, int]) -> RoutingReport:
        servers = {}
        for url, view in self.servers.items():
            published = view.published
            servers[url] = ServerReport(
                load=view.load(outstanding.get(url, 0)),
                queued_tokens=view.queued(),
                routed_pages=len(view.routed),
                published_pages=len(published.names) if published is not None and published.names is not None else 0,
                events_in_sync=None if published is None else published.in_sync,
            )
        stats = self.stats
        return RoutingReport(dict(stats.routed), stats.prompt_tokens, stats.matched_tokens, servers, self.warming.sent)

    def _anchor(self, request: GenerateRequest, names: PromptPages) -> str:
        """The request's own tie-breaker, the same on every replica: its whole prompt (its last whole page's name,
        or its namespace, then the tokens after). Sessions starting at once on one shared prompt break their ties
        apart, however few tokens of their own follow its last whole page."""
        routed = names.routed()
        tail = array.array("q", request.prompt[len(routed) * self.settings.page_tokens :]).tobytes()
        last = routed[-1] if routed else self._tenant_namespace(request)
        return hashlib.blake2b(last + tail, digest_size=8).hexdigest()

    @property
    def shares(self) -> bool:
        """Whether what was sent where is the router's knowledge (no server publishes its pages)."""
        return all(view.published is None for view in self.servers.values())

    def shared_scope(self, request: GenerateRequest) -> str:
        """The shared record's scope of a request: these servers (every replica lists the same) and its tenant."""
        return f"{self._fleet}:{self._tenant_namespace(request).hex()}"

    @staticmethod
    def shared_names(names: list[bytes]) -> list[bytes]:
        """Of a prompt's routed page names, those the shared record keeps."""
        return names[:MAX_SHARED_PAGES]

    def record(self, url: str, request: GenerateRequest, generated: list[int], names: PromptPages) -> list[bytes]:
        """The server now holds the request's prompt and what it generated (approximately, as far as we know; its
        prompt was noted when it began to answer): the names of the pages the answer filled, which it now holds."""
        prompt = names.routed()
        page = self.settings.page_tokens
        tokens = request.prompt + generated
        previous = prompt[-1] if prompt else self._tenant_namespace(request)
        answer = list(chain(previous, tokens[len(prompt) * page : len(tokens) - 1], page, previous=previous))
        self.servers[url].routed.add(answer)
        return answer

    def forget(self, url: str) -> None:
        """The server went away (ejected): what it held is gone."""
        view = self.servers[url]
        view.routed.clear()
        view.reported_at = -1e9
        view.pushed = None
        if view.published is not None:
            view.published.lose()  # its follower takes it up again when the server is back


def _rendezvous(key: str, url: str) -> bytes:
    return hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest()
