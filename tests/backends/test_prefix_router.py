"""The prefix router's choice on its own: an opening every conversation shares (Harmony's system message) does not
pile new conversations onto one server, a conversation still goes back to the server that holds it, and with a
`prompt_cache_key` and nothing held anywhere the key's own server is chosen, by every replica alike."""

from __future__ import annotations

import collections

from backends.base import GenerateRequest
from backends.routing.router import PrefixRouter, RoutingSettings

URLS = ["http://a", "http://b", "http://c"]
OPENING = list(range(1000, 1160))  # 160 tokens every conversation starts with


def _router(min_match: float = 0.3) -> PrefixRouter:
    return PrefixRouter(URLS, RoutingSettings(32, 2, 600.0, 65_536, min_match), published=False)


def _conversation(index: int, turns: int = 1) -> GenerateRequest:
    own = [20_000 + index * 1000 + i for i in range(500 * turns)]
    return GenerateRequest(OPENING + own, 16, (), f"r{index}", tenant="acme")


def _busiest(router: PrefixRouter, conversations: int, window: int = 3) -> int:
    """New conversations, `window` in flight at once (each ends as the window's next one arrives): the most any
    one server ran at once."""
    in_flight = dict.fromkeys(URLS, 0)
    running: collections.deque[str] = collections.deque()
    busiest = 0
    for index in range(conversations):
        if len(running) == window:
            in_flight[running.popleft()] -= 1
        url = router.choose(_conversation(index), dict(in_flight)).url
        in_flight[url] += 1
        running.append(url)
        busiest = max(busiest, in_flight[url])
    return busiest


def test_new_conversations_sharing_only_an_opening_spread_over_the_servers():
    assert _busiest(_router(), 30) == 1  # three at once over three servers: one each
    assert _busiest(_router(min_match=0.0), 30) == 3  # counting the opening, they pile onto its server


def test_a_conversation_goes_back_to_the_server_that_holds_it():
    router = _router()
    in_flight = dict.fromkeys(URLS, 0)
    first = router.choose(_conversation(7), in_flight)
    in_flight[first.url] = 2  # busier than the others, within the slack
    again = router.choose(_conversation(7, turns=2), in_flight)  # the same conversation, a turn longer
    assert again.url == first.url and again.how == "prefix" and again.matched_tokens >= 640


def test_with_a_key_and_nothing_held_the_key_s_server_is_chosen_by_every_replica():
    keyed = [GenerateRequest(_conversation(i).prompt, 16, (), f"k{i}", cache_key=f"session-{i % 4}", tenant="acme")
             for i in range(12)]  # fmt: skip
    loads = {"http://a": 0, "http://b": 1, "http://c": 1}  # within the slack of one another
    for request in keyed:
        one, other = _router().choose(request, loads), _router().choose(request, loads)  # two replicas
        assert one.url == other.url and one.how == "key"
    chosen = {request.cache_key: _router().choose(request, loads).url for request in keyed}
    assert len(set(chosen.values())) > 1  # keys spread, not all to the least loaded
    overloaded = dict.fromkeys(URLS, 0) | {chosen["session-0"]: 5}
    assert _router().choose(keyed[0], overloaded).url != chosen["session-0"]  # never to an overloaded server
