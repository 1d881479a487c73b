"""The prefix router's choice on its own: an opening every conversation shares (Harmony's system message) does not
pile new conversations onto one server, a conversation still goes back to the server that holds it, and with a
`prompt_cache_key` and nothing held anywhere the key's own server is chosen, by every replica alike; a full server
is passed over while another has room, and a server's pushed load is read as untrusted input."""

from __future__ import annotations

import collections
import time

import pytest

from backends.base import GenerateRequest
from backends.routing.held_pages import PublishedPages, RoutedPages
from backends.routing.kv_events import OutOfOrder, _apply
from backends.routing.router import PrefixRouter, RoutingSettings, ServerView

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


def _slotted(slots: int) -> PrefixRouter:
    settings = RoutingSettings(32, 2, 600.0, 65_536, 0.3, server_slots=slots)
    return PrefixRouter(URLS, settings, published=False)


def _session(index: int) -> GenerateRequest:
    """A session of a tenant whose users share one long system prompt: most of its prompt is the shared part."""
    return GenerateRequest(OPENING * 5 + [30_000 + index], 16, (), f"s{index}", tenant="acme")


def test_a_shared_prompt_fills_its_server_s_slots_then_spreads():
    """Six sessions at once, servers running two each: the server holding the shared prompt takes two, then a
    full server is passed over for one with room (slots unknown: the holder takes three, the slack's worth, and
    the next server to hold it three, leaving one idle)."""
    for router, expected in ((_slotted(2), [2, 2, 2]), (_router(), [3, 3, 0])):
        in_flight = dict.fromkeys(URLS, 0)
        router.choose(_session(0), dict(in_flight))  # the first session, ended: its server holds the prompt
        for index in range(1, 7):
            in_flight[router.choose(_session(index), dict(in_flight)).url] += 1
        assert sorted(in_flight.values(), reverse=True) == expected, in_flight


def test_a_conversation_stays_while_its_server_has_room_and_moves_when_it_is_full():
    router = _slotted(2)
    first = router.choose(_conversation(3), dict.fromkeys(URLS, 0))
    longer = _conversation(3, turns=2)
    busy = dict.fromkeys(URLS, 0) | {first.url: 1}
    assert router.choose(longer, busy).url == first.url  # one slot left: it stays
    full = dict.fromkeys(URLS, 0) | {first.url: 2}
    moved = router.choose(longer, full)
    assert moved.url != first.url and moved.how == "load"
    everywhere = dict.fromkeys(URLS, 2)
    assert router.choose(longer, everywhere).url == first.url  # no room anywhere: the prefix decides again


def test_a_server_that_says_requests_wait_counts_as_full():
    """No slots known: the server's own count of waiting requests (its /metrics or its event stream) marks it
    full, though this replica has nothing in flight there."""
    router = _router()
    first = router.choose(_conversation(4), dict.fromkeys(URLS, 0))
    longer = _conversation(4, turns=2)
    router.servers[first.url].pushed = (1, 0)
    assert router.choose(longer, dict.fromkeys(URLS, 0)).url == first.url
    router.servers[first.url].pushed = (1, 1)
    assert router.choose(longer, dict.fromkeys(URLS, 0)).url != first.url
    router.servers[first.url].pushed = None
    router.servers[first.url].reported, router.servers[first.url].reported_at = (0.0, 1.0), time.monotonic()
    assert router.choose(longer, dict.fromkeys(URLS, 0)).url != first.url
    router.servers[first.url].reported_at -= 60  # a stale figure counts for nothing
    assert router.choose(longer, dict.fromkeys(URLS, 0)).url == first.url
    slotted = _slotted(4)
    first = slotted.choose(_conversation(4), dict.fromkeys(URLS, 0))
    slotted.servers[first.url].pushed = (1, 1)  # slots known: one just arrived is no sign of a full server
    assert slotted.choose(longer, dict.fromkeys(URLS, 0)).url == first.url


def test_a_server_s_pushed_load_is_taken_only_from_its_own_well_formed_events():
    """What an engine server's event stream says of its load, read as untrusted input: a `load` event of the
    snapshot's instance sets it; another instance's, or a count that is not one, breaks the stream (the follower
    starts again from a snapshot) and leaves the load as it was."""
    view = ServerView(RoutedPages(16, 60.0), PublishedPages())
    snapshot = {"instance": "i1", "page_size": 16, "prefix_cache_scope": "tenant", "seq": 3, "pages": []}
    _apply(view, {**snapshot, "slots": 4, "running": 1, "waiting": 0})
    assert (view.slots, view.pushed) == (4, (1, 0))
    _apply(view, {"instance": "i1", "seq": 3, "running": 4, "waiting": 2})
    assert view.pushed == (4, 2) and view.full(view.load(0))
    for bad in ({"instance": "i2", "seq": 3, "running": 0, "waiting": 0}, {"instance": "i1", "running": -1,
                "waiting": 0}, {"instance": "i1", "running": "2", "waiting": 0}, {"instance": "i1", "running": True,
                "waiting": 0}):  # fmt: skip
        with pytest.raises(OutOfOrder):
            _apply(view, bad)
        assert view.pushed == (4, 2), bad
