"""Several upstream servers behind one backend: least-outstanding-requests choice and passive health.

A request with a cache key (the client's `prompt_cache_key`: Codex sends its session id) goes to the same
upstream each time, chosen by rendezvous hashing among the healthy ones, so the upstream's prefix cache
holds its conversation; unless that upstream has AFFINITY_SLACK more requests in flight than the least
loaded one, when load wins.

An upstream that fails `eject_after` times in a row is ejected: no request goes to it while another is
healthy, and a prober calls its health endpoint every `probe_interval_s` until it answers, when it is
taken back. When every upstream is ejected, requests still try them (least recently failed first)
rather than failing without an attempt.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import structlog

log = structlog.get_logger("backends.upstreams")

Probe = Callable[[str], Awaitable[bool]]
Choose = Callable[[list["Upstream"]], "Upstream"]
AFFINITY_SLACK = 4


def _weight(key: str, url: str) -> bytes:
    return hashlib.blake2b(f"{key}\0{url}".encode(), digest_size=8).digest()


@dataclass(slots=True)
class Upstream:
    url: str
    outstanding: int = 0  # requests in flight to it from this process
    consecutive_failures: int = 0
    ejected_at: float | None = None  # monotonic time of ejection; None while healthy
    picks: int = 0  # how often it was chosen (ties go to the least chosen)

    @property
    def healthy(self) -> bool:
        return self.ejected_at is None


class UpstreamPool:
    def __init__(self, urls: list[str], eject_after: int, probe_interval_s: float, probe: Probe) -> None:
        self.upstreams = [Upstream(url.rstrip("/")) for url in urls]
        self._eject_after = eject_after
        self._probe_interval_s = probe_interval_s
        self._probe = probe
        self._prober: asyncio.Task[None] | None = None

    def pick(self, avoid: list[Upstream], cache_key: str | None = None, choose: Choose | None = None) -> Upstream:
        """A healthy upstream, preferring ones not in `avoid`: `choose`'s pick among them when given (a prefix
        router), else the one with the fewest requests in flight; with a cache key, the key's own upstream while
        it is not overloaded."""
        fresh = [u for u in self.upstreams if u not in avoid] or self.upstreams
        healthy = [u for u in fresh if u.healthy]
        if healthy and choose is not None:
            chosen = choose(healthy)
        elif healthy:
            chosen = min(healthy, key=lambda u: (u.outstanding, u.picks))
            if cache_key:
                owner = max(healthy, key=lambda u: _weight(cache_key, u.url))
                if owner.outstanding <= chosen.outstanding + AFFINITY_SLACK:
                    chosen = owner
        else:
            chosen = min(fresh, key=lambda u: (u.ejected_at or 0.0, u.outstanding))
        chosen.picks += 1
        return chosen

    @contextlib.contextmanager
    def lease(self, upstream: Upstream) -> Iterator[None]:
        upstream.outstanding += 1
        try:
            yield
        finally:
            upstream.outstanding -= 1

    def succeeded(self, upstream: Upstream) -> None:
        upstream.consecutive_failures = 0
        if not upstream.healthy:
            self._restore(upstream, "request_succeeded")

    def failed(self, upstream: Upstream, reason: str) -> None:
        upstream.consecutive_failures += 1
        if upstream.healthy and upstream.consecutive_failures >= self._eject_after:
            upstream.ejected_at = time.monotonic()
            log.warning("upstream_ejected", upstream=upstream.url, reason=reason)
            if self._prober is None or self._prober.done():
                self._prober = asyncio.get_running_loop().create_task(self._probe_ejected())

    def _restore(self, upstream: Upstream, how: str) -> None:
        upstream.ejected_at = None
        upstream.consecutive_failures = 0
        log.info("upstream_restored", upstream=upstream.url, how=how)

    async def _probe_ejected(self) -> None:
        while ejected := [u for u in self.upstreams if not u.healthy]:
            await asyncio.sleep(self._probe_interval_s)
            answers = await asyncio.gather(*(self._probe(u.url) for u in ejected), return_exceptions=True)
            for upstream, answer in zip(ejected, answers, strict=True):
                if answer is True and not upstream.healthy:
                    self._restore(upstream, "probe")

    async def aclose(self) -> None:
        if self._prober is not None:
            self._prober.cancel()
            await asyncio.gather(self._prober, return_exceptions=True)
